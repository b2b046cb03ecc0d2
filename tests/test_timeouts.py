"""Timeouts, for real: interrupted sync tools, late completions, cancelled async tools, node deadlines."""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from replaysafe import (
    CallKey,
    Event,
    EventKind,
    Ledger,
    MemoryLedger,
    Status,
    ToolTimeoutError,
    _config,
    _constants,
    _drivers,
    node,
    on_event,
    replay_safe,
    set_default_timeouts,
    tool_call,
)
from replaysafe._context import UNSET
from replaysafe.testing import SteppedClock

from .waiting import SeesWaiting


def new_key() -> CallKey:
    return CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")


@pytest.fixture(autouse=True)
def _restore_global_timeouts() -> Iterator[None]:
    saved = (_config.default_tool_timeout, _config.default_node_timeout)
    yield
    _config.default_tool_timeout, _config.default_node_timeout = saved


def wait_for_status(ledger: Ledger, key: CallKey, status: Status) -> None:
    for _ in range(200):
        record = ledger.get(key)
        if record is not None and record.status is status:
            return
        time.sleep(0.05)
    raise AssertionError(f"{key} never became {status}: {ledger.get(key)}")


def test_sync_tool_in_the_main_thread_is_interrupted(ledger: Ledger) -> None:
    """In the main thread a timer interrupts the tool at its deadline; the call is in doubt."""
    finished: list[bool] = []

    @replay_safe(ledger=ledger, timeout=0.2)
    def slow_refund(order_id: str) -> str:
        time.sleep(30)
        finished.append(True)
        return "late"

    key = new_key()
    assert threading.current_thread() is threading.main_thread()
    with tool_call(*key), pytest.raises(ToolTimeoutError) as raised:
        slow_refund("1")
    assert not raised.value.still_running
    assert raised.value.timeout == 0.2
    assert key.thread_id in str(raised.value)
    assert finished == []
    record = ledger.get(key)
    assert record is not None
    assert record.status is Status.IN_DOUBT
    # The timer is disarmed: nothing fires later.
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_sync_tool_off_the_main_thread_completes_late_and_is_recorded(ledger: Ledger) -> None:
    """Off the main thread the caller gets ToolTimeoutError at the deadline; the late result is recorded."""
    release = threading.Event()
    runs: list[int] = []

    @replay_safe(ledger=ledger, timeout=0.2)
    def slow_refund(order_id: str) -> str:
        runs.append(1)
        release.wait(30)
        return f"refunded {order_id}"

    key = new_key()
    errors: list[BaseException] = []

    def call() -> None:
        with tool_call(*key):
            try:
                slow_refund("7")
            except ToolTimeoutError as exc:
                errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(30)
    (error,) = errors
    assert isinstance(error, ToolTimeoutError)
    assert error.still_running
    record = ledger.get(key)
    assert record is not None
    assert record.status is Status.RUNNING  # its claim stays while the tool still runs
    release.set()
    wait_for_status(ledger, key, Status.COMPLETED)
    with tool_call(*key):
        assert slow_refund("7") == "refunded 7"
    assert runs == [1]


def test_a_replay_waits_for_a_late_sync_tool(ledger: Ledger) -> None:
    """While a timed-out tool still runs in a live process, a replay waits and gets its late result."""
    release = threading.Event()
    runs: list[int] = []
    # The tool is let go only when the replay has found its call still running: the wait is certain.
    observed = SeesWaiting(ledger, on_wait=release.set)

    @replay_safe(ledger=observed, timeout=0.1, wait_timeout=30)
    def slow_refund(order_id: str) -> str:
        runs.append(1)
        assert release.wait(30), "no replay found the call running"
        return "late result"

    key = new_key()

    def first() -> None:
        with tool_call(*key), pytest.raises(ToolTimeoutError):
            slow_refund("1")

    caller = threading.Thread(target=first)
    caller.start()
    caller.join(30)
    assert not release.is_set()
    results: list[str] = []

    def replay() -> None:
        with tool_call(*key):
            results.append(slow_refund("1"))

    replayer = threading.Thread(target=replay)
    replayer.start()
    replayer.join(30)
    assert results == ["late result"]
    assert runs == [1]
    assert observed.waits >= 1


def test_lease_follows_the_timeout(ledger: Ledger) -> None:
    """A claim is held for the timeout plus a 30 s margin."""
    seen: list[dt.timedelta] = []

    @replay_safe(ledger=ledger, timeout=12)
    def tool() -> None:
        record = ledger.get(key)
        assert record is not None
        seen.append(record.lease_expires_at - record.created_at)

    key = new_key()
    with tool_call(*key):
        tool()
    assert seen == [dt.timedelta(seconds=42)]


async def test_async_tool_is_cancelled_at_its_deadline(ledger: Ledger) -> None:
    """An async tool past its deadline is cancelled; the caller gets ToolTimeoutError; the call is in doubt."""
    cancelled: list[bool] = []

    @replay_safe(ledger=ledger, timeout=0.2)
    async def slow_refund(order_id: str) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "late"

    key = new_key()
    async with tool_call(*key):
        with pytest.raises(ToolTimeoutError) as raised:
            await slow_refund("1")
    assert cancelled == [True]
    assert not raised.value.still_running
    record = ledger.get(key)
    assert record is not None
    assert record.status is Status.IN_DOUBT


async def test_a_tools_own_timeout_error_is_not_ours(memory_ledger: MemoryLedger) -> None:
    """A TimeoutError the tool raises itself propagates as is and releases the claim."""

    @replay_safe(ledger=memory_ledger, timeout=10)
    async def flaky() -> str:
        raise TimeoutError("the provider timed out")

    key = new_key()
    async with tool_call(*key):
        with pytest.raises(TimeoutError, match="provider timed out") as raised:
            await flaky()
    assert not isinstance(raised.value, ToolTimeoutError)
    assert memory_ledger.get(key) is None


def test_node_deadline_is_shared_by_its_calls(memory_ledger: MemoryLedger) -> None:
    """Each call in a node gets min(tool_timeout, time left); past the deadline nothing runs.

    Real time: a node's deadline is on the machine's monotonic clock, and the timer that interrupts
    the second call is SIGALRM. The first call leaves most of the second left, so a slow machine
    does not make it pass the deadline itself."""
    runs: list[str] = []

    @replay_safe(ledger=memory_ledger)
    def step(name: str, seconds: float) -> str:
        runs.append(name)
        time.sleep(seconds)
        return name

    thread = new_key().thread_id
    with node(node_timeout=1.0):
        with tool_call(thread, "m", "c1"):
            assert step("first", 0.1) == "first"
        with tool_call(thread, "m", "c2"), pytest.raises(ToolTimeoutError) as raised:
            step("second", 30)  # at most 0.9 s are left
        with tool_call(thread, "m", "c3"), pytest.raises(ToolTimeoutError, match="node's time ran out"):
            step("third", 0)
    assert runs == ["first", "second"]
    assert 0 < raised.value.timeout <= 0.9


def test_node_from_a_config_mapping(memory_ledger: MemoryLedger) -> None:
    """node(config) reads node_timeout and tool_timeout, also under "configurable"."""
    leases: list[dt.timedelta] = []

    @replay_safe(ledger=memory_ledger)
    def tool() -> None:
        record = memory_ledger.get(key)
        assert record is not None
        leases.append(record.lease_expires_at - record.created_at)

    key = new_key()
    config = {"configurable": {"thread_id": key.thread_id, "tool_timeout": 5, "node_timeout": 600}}
    with node(config), tool_call(*key):
        tool()
    assert leases == [dt.timedelta(seconds=35)]


@pytest.mark.parametrize("disabled", [None, 0])
def test_none_or_zero_disables_the_timeout(memory_ledger: MemoryLedger, disabled: float | None) -> None:
    """With no timeout the tool runs inline in the caller's thread, with no timer and no worker."""
    threads: list[threading.Thread] = []

    @replay_safe(ledger=memory_ledger, timeout=disabled)
    def tool() -> None:
        threads.append(threading.current_thread())

    def call() -> None:
        with tool_call(*new_key()):
            tool()

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(10)
    assert threads == [caller]


def test_timeout_precedence(memory_ledger: MemoryLedger) -> None:
    """tool_call beats node, node beats the decorator, the decorator beats the global default."""
    leases: list[float] = []

    @replay_safe(ledger=memory_ledger, timeout=20)
    def tool(n: int) -> None:
        record = next(r for r in memory_ledger.records() if r.status is Status.RUNNING)
        leases.append((record.lease_expires_at - record.created_at).total_seconds() - 30)

    @replay_safe(ledger=memory_ledger)
    def plain(n: int) -> None:
        tool.__wrapped__(n)  # type: ignore[attr-defined]

    def run(fn: Any, n: int, **options: Any) -> None:
        with tool_call(new_key().thread_id, "m", str(n), **options):
            fn(n)

    run(tool, 1)  # decorator
    run(tool, 2, tool_timeout=5)  # tool_call
    with node(tool_timeout=7):
        run(tool, 3)  # node
        run(tool, 4, tool_timeout=9)  # tool_call over node
    set_default_timeouts(tool_timeout=11)
    run(plain, 5)  # global
    with node(config={"tool_timeout": 13}):
        run(plain, 6)
    assert leases == [20, 5, 7, 9, 11, 13]


def test_tool_call_from_config(memory_ledger: MemoryLedger) -> None:
    """tool_call.from_config reads thread_id, tool_timeout and in_doubt from a run config."""
    scope = tool_call.from_config(
        {"configurable": {"thread_id": "t1"}, "tool_timeout": 60, "in_doubt": "raise"},
        message_id="msg_1",
        tool_call_id="call_1",
    ).scope
    assert scope.key == CallKey("t1", "msg_1", "call_1")
    assert scope.tool_timeout == 60
    assert scope.in_doubt == "raise"
    assert (
        tool_call.from_config(
            {"thread_id": "t", "tool_timeout": 0}, message_id="m", tool_call_id="c"
        ).scope.tool_timeout
        is None
    )


def test_bad_timeouts_are_rejected() -> None:
    """A negative timeout is a clear error wherever it is given."""
    with pytest.raises(ValueError, match="tool_timeout"):
        tool_call("t", "m", "c", tool_timeout=-1)
    with pytest.raises(ValueError, match="node_timeout"):
        node(node_timeout=-5)
    with pytest.raises(ValueError, match="timeout"):
        replay_safe(timeout=-1)(lambda: None)


def test_someone_elses_sigalrm_is_left_alone(memory_ledger: MemoryLedger) -> None:
    """With another SIGALRM handler installed, the tool runs in a worker instead of using the timer."""
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    threads: list[threading.Thread] = []
    try:

        @replay_safe(ledger=memory_ledger, timeout=5)
        def tool() -> None:
            threads.append(threading.current_thread())

        with tool_call(*new_key()):
            tool()
        assert threads[0] is not threading.main_thread()
        assert signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert fired == []


def test_sigalrm_keeps_its_default_outside_protected_calls(tmp_path: Any) -> None:
    """After protected calls used the timer, a stray SIGALRM still ends the process, as by default."""
    import subprocess
    import sys

    code = (
        "import signal\n"
        "from replaysafe import MemoryLedger, replay_safe, tool_call\n"
        "@replay_safe(ledger=MemoryLedger(), timeout=5)\n"
        "def tool():\n    return 1\n"
        "with tool_call('t', 'm', 'c'):\n    tool()\n"
        "print('called', flush=True)\n"
        "signal.raise_signal(signal.SIGALRM)\n"
        "print('survived', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "called\n"
    assert done.returncode == -signal.SIGALRM


# --- the built-in timeout: the caller's thread, the lease, a late report -----------------


def test_default_timeout_runs_in_the_callers_thread(memory_ledger: MemoryLedger) -> None:
    """With the built-in timeout a sync tool runs in the thread that called it, off the main
    thread too: the caller's thread-locals are there, and no timer is armed on the main thread."""
    local = threading.local()
    seen: list[tuple[threading.Thread, str | None, tuple[float, float]]] = []

    @replay_safe(ledger=memory_ledger)
    def refund(order_id: str) -> str:
        seen.append((threading.current_thread(), getattr(local, "tenant", None), signal.getitimer(signal.ITIMER_REAL)))
        return order_id

    def call(tenant: str) -> None:
        local.tenant = tenant
        with tool_call(*new_key()):
            assert refund("1") == "1"

    caller = threading.Thread(target=call, args=("acme",))
    caller.start()
    caller.join(30)
    call("main")  # and from the main thread
    assert seen == [(caller, "acme", (0.0, 0.0)), (threading.main_thread(), "main", (0.0, 0.0))]


def test_a_given_timeout_is_a_hard_deadline(memory_ledger: MemoryLedger) -> None:
    """A timeout the user gave (the decorator's, tool_call's, node's or set_default_timeouts') moves a
    sync tool off a thread other than the main one, and interrupts the caller's wait at the deadline."""
    threads: list[threading.Thread] = []

    @replay_safe(ledger=memory_ledger)
    def slow(seconds: float) -> None:
        threads.append(threading.current_thread())
        time.sleep(seconds)

    errors: list[BaseException] = []

    def call(**options: Any) -> None:
        with tool_call(*new_key(), **options):
            try:
                slow(0.5)
            except ToolTimeoutError as exc:
                errors.append(exc)

    def in_a_thread(**options: Any) -> threading.Thread:
        caller = threading.Thread(target=call, kwargs=options)
        caller.start()
        caller.join(30)
        return caller

    first = in_a_thread(tool_timeout=0.1)
    set_default_timeouts(tool_timeout=0.1)
    second = in_a_thread()
    assert len(errors) == 2 and all(error.still_running for error in errors)
    assert threads[0] is not first and threads[1] is not second


def test_none_means_no_timeout_wherever_it_is_given(memory_ledger: MemoryLedger) -> None:
    """None overrides a timeout given further out: the tool runs to its end in the caller's thread."""
    events: list[Event] = []
    unsubscribe = on_event(events.append)
    threads: list[threading.Thread] = []

    def body() -> str:
        threads.append(threading.current_thread())
        time.sleep(0.3)
        return "done"

    timed = replay_safe(ledger=memory_ledger, timeout=0.1, name="timed")(body)
    untimed = replay_safe(ledger=memory_ledger, name="untimed")(body)

    def call() -> None:
        with tool_call(*new_key(), tool_timeout=None):
            assert timed() == "done"
        set_default_timeouts(tool_timeout=None)
        with node(node_timeout=None), tool_call(*new_key()):
            assert untimed() == "done"

    caller = threading.Thread(target=call)
    try:
        caller.start()
        caller.join(30)
    finally:
        unsubscribe()
    assert threads == [caller, caller]
    assert [event.kind for event in events if event.kind is EventKind.TIMEOUT] == []


def test_passing_the_default_timeout_is_reported_late(
    memory_ledger: MemoryLedger, monkeypatch: pytest.MonkeyPatch, replaysafe_clock: SteppedClock
) -> None:
    """A tool past the built-in timeout is not interrupted: it returns, its result is recorded and
    replayed, and a TIMEOUT event says it ran late. The tool takes its time on the stepped clock:
    the duration reported is the one it took, exactly."""
    monkeypatch.setattr(_constants, "TOOL_TIMEOUT", 0.2)
    clock = replaysafe_clock
    events: list[Event] = []
    unsubscribe = on_event(events.append)
    runs: list[int] = []

    @replay_safe(ledger=memory_ledger)
    def slow_refund(order_id: str) -> str:
        runs.append(1)
        clock.advance(0.4)
        return f"refunded {order_id}"

    key = new_key()
    results: list[str] = []

    def call() -> None:
        for _ in range(2):  # the second is a replay
            with tool_call(*key):
                results.append(slow_refund("7"))

    caller = threading.Thread(target=call)
    try:
        caller.start()
        caller.join(30)
    finally:
        unsubscribe()
    assert results == ["refunded 7", "refunded 7"] and runs == [1]
    record = memory_ledger.get(key)
    assert record is not None and record.status is Status.COMPLETED
    (late,) = [event for event in events if event.kind is EventKind.TIMEOUT]
    assert "ran 0.4s, past its default 0.2s timeout" in late.message and key.thread_id in late.message
    assert late.duration == pytest.approx(0.4)


#: Under the built-in timeout (0.2 s here) plus the margin (0.3 s), a lease of 0.3 s renewed every 0.1 s, read
#: after each step of 0.1 s: renewed to 0.5 s past the start and no further. With no timeout, renewed to 0.3 s
#: past each step, for as long as the tool runs.
CAPPED = [dt.timedelta(seconds=0.4)] + [dt.timedelta(seconds=0.5)] * 19
UNCAPPED = [dt.timedelta(milliseconds=100 * step + 300) for step in range(1, 21)]


def test_the_default_timeout_is_kept_by_the_lease(
    memory_ledger: MemoryLedger, monkeypatch: pytest.MonkeyPatch, replaysafe_clock: SteppedClock
) -> None:
    """Under the built-in timeout a running call's lease is renewed up to the deadline plus the
    margin, and no further: past it another host may take the call over. With no timeout it is
    renewed for as long as the tool runs. Each tool runs 2 s on the stepped clock, in steps of a
    renewal interval; after each, how far its lease reaches past its start is read."""
    monkeypatch.setattr(_constants, "TOOL_TIMEOUT", 0.2)
    monkeypatch.setattr(_drivers, "LEASE_MARGIN", 0.3)
    clock = replaysafe_clock
    keys = {"default": new_key(), "none": new_key()}
    reach: dict[str, list[dt.timedelta]] = {}

    def tool(label: str) -> None:
        started = clock.now()
        reach[label] = []
        for _ in range(20):
            clock.advance(0.1)
            record = memory_ledger.get(keys[label])
            assert record is not None
            reach[label].append(record.lease_expires_at - started)

    for label, timeout in (("default", UNSET), ("none", None)):
        protected = replay_safe(ledger=memory_ledger, lease=0.3, timeout=timeout, name=label)(tool)
        with tool_call(*keys[label]):
            protected(label)
    assert reach == {"default": CAPPED, "none": UNCAPPED}


async def test_the_default_timeout_does_not_cancel_an_async_tool(
    memory_ledger: MemoryLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the built-in timeout an async tool is not cancelled either, as a sync tool is not
    interrupted: it runs to its end, its result is recorded and replayed, and a TIMEOUT event
    reports it late. With the default lease (the timeout plus the margin) no timer is set in
    the loop for the call: there is no deadline to enforce and no renewal due before it."""
    monkeypatch.setattr(_constants, "TOOL_TIMEOUT", 0.05)
    loop = asyncio.get_running_loop()
    events: list[Event] = []
    unsubscribe = on_event(events.append)
    timers: list[int] = []
    runs: list[int] = []

    @replay_safe(ledger=memory_ledger)
    async def slow_refund(order_id: str) -> str:
        runs.append(1)
        timers.append(len(loop._scheduled))  # type: ignore[attr-defined]
        await asyncio.sleep(0.2)
        return f"refunded {order_id}"

    key = new_key()
    results: list[str] = []
    try:
        for _ in range(2):  # the second is a replay
            async with tool_call(*key):
                before = len(loop._scheduled)  # type: ignore[attr-defined]
                results.append(await slow_refund("7"))
    finally:
        unsubscribe()
    assert results == ["refunded 7", "refunded 7"] and runs == [1]
    assert timers == [before]
    record = memory_ledger.get(key)
    assert record is not None and record.status is Status.COMPLETED
    (late,) = [event for event in events if event.kind is EventKind.TIMEOUT]
    assert "past its default 0.05s timeout" in late.message and key.thread_id in late.message


async def test_the_default_timeout_is_kept_by_an_async_tools_lease(
    memory_ledger: MemoryLedger, monkeypatch: pytest.MonkeyPatch, replaysafe_clock: SteppedClock
) -> None:
    """An async tool's lease shorter than the built-in timeout is renewed up to the deadline plus
    the margin and no further, as a sync tool's is; a tool without a timeout keeps its lease renewed.
    The two run together; once both have started, one steps the clock (blocking the loop: the renewer
    thread renews both) and reads both leases after each step."""
    monkeypatch.setattr(_constants, "TOOL_TIMEOUT", 0.2)
    monkeypatch.setattr(_drivers, "LEASE_MARGIN", 0.3)
    clock = replaysafe_clock
    keys = {label: new_key() for label in ("default", "none")}
    started: dict[str, dt.datetime] = {}
    reach: dict[str, list[dt.timedelta]] = {label: [] for label in keys}
    stepped = asyncio.Event()

    async def tool(label: str) -> None:
        started[label] = clock.now()
        if len(started) == 1:
            await stepped.wait()  # the first to start waits for the other to step the clock
            return
        for _ in range(20):
            clock.advance(0.1)
            for each in keys:
                record = memory_ledger.get(keys[each])
                assert record is not None
                reach[each].append(record.lease_expires_at - started[each])
        stepped.set()

    capped = replay_safe(ledger=memory_ledger, lease=0.3, name="default")(tool)
    untimed = replay_safe(ledger=memory_ledger, lease=0.3, timeout=None, name="none")(tool)

    async def call(label: str, protected: Any) -> None:
        async with tool_call(*keys[label]):
            await protected(label)

    await asyncio.gather(call("default", capped), call("none", untimed))
    assert reach == {"default": CAPPED, "none": UNCAPPED}


def test_an_interrupt_while_the_lease_is_handed_over_leaves_no_call_current(
    memory_ledger: MemoryLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that lands while a tool's lease is handed to the renewer (injected there) reaches
    the caller, and ``current_call()`` is reset all the same: the next protected call is a call of
    its own, under its own ids, not a step of the interrupted one."""
    from replaysafe import current_call_or_none

    handed = _drivers.renewer.add

    def interrupted_once(lease: Any) -> None:
        monkeypatch.setattr(_drivers.renewer, "add", handed)
        raise KeyboardInterrupt

    monkeypatch.setattr(_drivers.renewer, "add", interrupted_once)

    @replay_safe(ledger=memory_ledger, timeout=5)  # a hard deadline: a lease to renew
    def refund_order(order_id: str) -> str:
        return "ok"

    first, second = CallKey(f"t-{uuid.uuid4().hex[:8]}", "m1", "c1"), CallKey(f"t-{uuid.uuid4().hex[:8]}", "m2", "c2")
    with tool_call(*first), pytest.raises(KeyboardInterrupt):
        refund_order("1")
    assert current_call_or_none() is None
    with tool_call(*second):
        assert refund_order("2") == "ok"
    record = memory_ledger.get(second)
    assert record is not None and record.status is Status.COMPLETED
