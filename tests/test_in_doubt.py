"""In-doubt calls, made for real: a process is SIGKILLed inside the tool, then we resume."""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import sqlite3
import subprocess
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

from replaysafe import (
    RERUN,
    CallInDoubtError,
    CallInfo,
    CallInProgressError,
    CallKey,
    Event,
    EventKind,
    Ledger,
    SqliteLedger,
    Status,
    current_call,
    on_event,
    open_ledger,
    replay_safe,
    tool_call,
)
from replaysafe.ledgers import RetryPolicy
from replaysafe.testing import SteppedClock

from .faults import OTHER_WORKER, drop_ledger_table, take_over_as_another_worker
from .waiting import SeesWaiting

CHILD = str(Path(__file__).with_name("child.py"))


def crash_inside_the_tool(url: str, effects: Path) -> CallKey:
    """Run refund_order in a child that is SIGKILLed right after the side effect."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, CHILD, "matrix", url, str(effects), thread, "after-effect"], capture_output=True, text=True
    )
    assert done.returncode == -9, done.stderr
    return CallKey(thread, "msg_7", "call_1")


def refund_tool(ledger: Ledger, effects: Path, **options: Any) -> Any:
    @replay_safe(ledger=ledger, **options)
    def refund_order(order_id: str, amount: float) -> str:
        info = current_call()
        assert info is not None
        with effects.open("a") as out:
            out.write(f"{info.idempotency_key} {info.attempt}\n")
        return f"Refunded {amount:.2f} for order {order_id}"

    return refund_order


def attempts_in(effects: Path) -> list[str]:
    return [line.split()[1] for line in effects.read_text().splitlines()]


def test_a_dead_owner_on_this_machine_is_in_doubt_at_once(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path
) -> None:
    """The owner's pid is gone, so the call is in doubt long before its 330 s lease ends; rerun is attempt 2."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(durable_ledger_url, effects)
    record = durable_ledger.get(key)
    assert record is not None
    assert record.status is Status.RUNNING
    seen: list[Event] = []
    unsubscribe = on_event(seen.append)
    try:
        with tool_call(*key):
            assert refund_tool(durable_ledger, effects)("1042", 59.0) == "Refunded 59.00 for order 1042"
    finally:
        unsubscribe()
    assert attempts_in(effects) == ["1", "2"]
    in_doubt = [e for e in seen if e.kind is EventKind.IN_DOUBT]
    assert len(in_doubt) == 1
    assert in_doubt[0].key == key
    assert in_doubt[0].owner == record.owner
    # Both attempts handed the provider the same idempotency key.
    assert len({line.split()[0] for line in effects.read_text().splitlines()}) == 1


def test_raise_policy_runs_nothing_and_keeps_the_record(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path
) -> None:
    """in_doubt='raise' raises CallInDoubtError naming the call; the record stays for an operator."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(durable_ledger_url, effects)
    with tool_call(*key), pytest.raises(CallInDoubtError) as raised:
        refund_tool(durable_ledger, effects, in_doubt="raise")("1042", 59.0)
    assert key.thread_id in str(raised.value)
    assert "replaysafe ledger resolve" in str(raised.value)
    assert attempts_in(effects) == ["1"]
    record = durable_ledger.get(key)
    assert record is not None
    assert record.status is Status.RUNNING


def test_tool_call_policy_overrides_the_decorator(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path
) -> None:
    """tool_call(in_doubt='raise') wins over the decorator's default 'rerun'."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(durable_ledger_url, effects)
    with tool_call(*key, in_doubt="raise"), pytest.raises(CallInDoubtError):
        refund_tool(durable_ledger, effects)("1042", 59.0)


def test_a_reconciler_that_finds_the_result_records_it(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path
) -> None:
    """A reconciler gets the call; the result it finds at the provider is recorded, the tool not run."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(durable_ledger_url, effects)
    asked: list[CallInfo] = []

    def check_refund(call: CallInfo) -> Any:
        asked.append(call)
        provider_keys = {line.split()[0] for line in effects.read_text().splitlines()}
        return "Refunded 59.00 (found at provider)" if call.idempotency_key in provider_keys else RERUN

    tool = refund_tool(durable_ledger, effects, in_doubt=check_refund)
    with tool_call(*key):
        assert tool("1042", 59.0) == "Refunded 59.00 (found at provider)"
    with tool_call(*key):  # and it is now an ordinary recorded call
        assert tool("1042", 59.0) == "Refunded 59.00 (found at provider)"
    assert attempts_in(effects) == ["1"]
    (call,) = asked
    assert (call.thread_id, call.message_id, call.tool_call_id, call.tool_name) == (*key, "refund_order")
    assert call.args == ("1042", 59.0)
    assert call.attempt == 1
    record = durable_ledger.get(key)
    assert record is not None
    assert (record.status, record.attempt) == (Status.COMPLETED, 2)


def test_a_reconciler_may_ask_for_a_rerun(durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path) -> None:
    """RERUN from the reconciler runs the tool again as attempt 2."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(durable_ledger_url, effects)
    with tool_call(*key):
        refund_tool(durable_ledger, effects, in_doubt=lambda call: RERUN)("1042", 59.0)
    assert attempts_in(effects) == ["1", "2"]


def test_a_failing_reconciler_leaves_the_call_in_doubt(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path
) -> None:
    """If the reconciler raises, its error propagates and the call stays in doubt for next time."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(durable_ledger_url, effects)

    def provider_down(call: CallInfo) -> Any:
        raise ConnectionError("provider unreachable")

    with tool_call(*key), pytest.raises(ConnectionError):
        refund_tool(durable_ledger, effects, in_doubt=provider_down)("1042", 59.0)
    record = durable_ledger.get(key)
    assert record is not None
    assert record.status is Status.IN_DOUBT
    with tool_call(*key):  # the next replay applies the policy again
        refund_tool(durable_ledger, effects)("1042", 59.0)
    assert attempts_in(effects) == ["1", "3"]


def test_a_reconciled_result_that_cannot_be_written_is_not_said_to_be_recorded(
    sqlite_url: str, tmp_path: Path, events: list[Event]
) -> None:
    """The reconciler finds the result, but the ledger loses its table before the write: the
    ``reconciled`` event says the result could not be recorded, after the write's ``ledger_error``."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(sqlite_url, effects)
    ledger = SqliteLedger(sqlite_url.removeprefix("sqlite:///"), retry=RetryPolicy(attempts=1))

    def found_then_table_lost(call: CallInfo) -> Any:
        drop_ledger_table(ledger.path)
        return "Refunded 59.00 (found at provider)"

    with tool_call(*key):
        assert refund_tool(ledger, effects, in_doubt=found_then_table_lost)("1042", 59.0) == (
            "Refunded 59.00 (found at provider)"
        )
    kinds = [event.kind for event in events]
    assert kinds == [EventKind.IN_DOUBT, EventKind.LEDGER_ERROR, EventKind.RECONCILED], kinds
    assert "was reconciled but its completed record could not be written" in events[1].message
    reconciled = events[-1].message
    assert "could not be recorded" in reconciled and "now recorded" not in reconciled
    assert key.thread_id in reconciled and "refund_order" in reconciled


def test_a_reconciler_whose_call_is_taken_over_meanwhile_reports_no_second_run(
    sqlite_url: str, tmp_path: Path, events: list[Event]
) -> None:
    """Another worker takes the in-doubt call over while this one's reconciler asks the provider:
    the reconciler's answer is fenced off, and the event says the tool did not run here (no
    "duplicate execution", which would send someone looking for a second side effect)."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(sqlite_url, effects)
    ledger = SqliteLedger(sqlite_url.removeprefix("sqlite:///"))

    def found_while_taken_over(call: CallInfo) -> Any:
        take_over_as_another_worker(ledger, key)
        return "Refunded 59.00 (found at provider)"

    with tool_call(*key):
        refund_tool(ledger, effects, in_doubt=found_while_taken_over)("1042", 59.0)
    kinds = [event.kind for event in events]
    assert kinds == [EventKind.IN_DOUBT, EventKind.DUPLICATE_DETECTED, EventKind.RECONCILED], kinds
    fenced = events[1].message
    assert "the tool did not run here" in fenced and "duplicate execution" not in fenced
    assert key.thread_id in fenced and "refund_order" in fenced and "ledger show" in fenced
    assert "Refunded" not in fenced  # names the call, never the answer
    assert "could not be recorded" in events[2].message
    assert attempts_in(effects) == ["1"]  # the crashed run only
    record = ledger.get(key)
    assert record is not None and record.owner == OTHER_WORKER


@pytest.mark.parametrize("meanwhile", ["table-lost", "taken-over"])
def test_a_reconciler_that_raises_is_not_reported_as_an_answer(
    sqlite_url: str, tmp_path: Path, events: list[Event], meanwhile: str
) -> None:
    """The reconciler raises after the ledger lost its table, or after another worker took the call
    over: the write of the in-doubt record fails or is fenced off, and its event says the reconciler
    raised (neither "was reconciled" nor an "answer"), and that the tool did not run here."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(sqlite_url, effects)
    ledger = SqliteLedger(sqlite_url.removeprefix("sqlite:///"), retry=RetryPolicy(attempts=1))

    def raises_after(call: CallInfo) -> Any:
        if meanwhile == "table-lost":
            drop_ledger_table(ledger.path)
        else:
            take_over_as_another_worker(ledger, key)
        raise ConnectionError("provider unreachable")

    with tool_call(*key), pytest.raises(ConnectionError):
        refund_tool(ledger, effects, in_doubt=raises_after)("1042", 59.0)
    expected = EventKind.LEDGER_ERROR if meanwhile == "table-lost" else EventKind.DUPLICATE_DETECTED
    assert [event.kind for event in events] == [EventKind.IN_DOUBT, expected]
    said = events[1].message
    assert "was reconciled" not in said and "answer" not in said and "duplicate execution" not in said
    assert ("had its reconciler raise" if meanwhile == "table-lost" else "which raised") in said
    assert key.thread_id in said and "refund_order" in said
    assert attempts_in(effects) == ["1"]


@pytest.mark.parametrize("flavour", ["sync-tool", "async-tool", "async-tool-sync-reconciler"])
def test_a_slow_reconciler_keeps_the_calls_lease(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path, flavour: str, replaysafe_clock: SteppedClock
) -> None:
    """The reconciler answers in the tool's place, so the call's lease is kept alive while it asks
    the provider, as it would be while the tool ran: a lookup slower than the lease is not taken
    for a dead owner (another host would take the call over and might run the tool again). A sync
    reconciler of an async tool blocks the event loop, so its lease is renewed by the renewer thread.
    The lookup takes its time on the stepped clock: each step returns once the renewals due are made."""
    clock = replaysafe_clock
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(durable_ledger_url, effects)
    lease = dt.timedelta(seconds=0.6)
    reach: list[dt.timedelta] = []  # how far the stored lease reaches past the clock, after each step

    def look_up() -> None:
        for _ in range(4):  # two seconds: over three leases
            clock.advance(0.5)  # past a renewal interval (a third of the lease)
            record = durable_ledger.get(key)
            assert record is not None and record.status is Status.RUNNING and record.attempt == 2
            reach.append(record.lease_expires_at - clock.now())

    answer = "Refunded 59.00 (found at provider)"

    def slow_lookup(call: CallInfo) -> Any:
        look_up()  # blocks its thread: an event loop's too, for an async tool
        return answer

    async def aslow_lookup(call: CallInfo) -> Any:
        await asyncio.sleep(0)
        look_up()
        return answer

    if flavour == "sync-tool":
        with tool_call(*key):
            found = refund_tool(durable_ledger, effects, in_doubt=slow_lookup, lease=lease.total_seconds())(
                "1042", 59.0
            )
    else:
        reconciler = aslow_lookup if flavour == "async-tool" else slow_lookup

        @replay_safe(ledger=durable_ledger, in_doubt=reconciler, lease=lease.total_seconds())
        async def refund_order(order_id: str, amount: float) -> str:
            raise AssertionError("a reconciled call does not run the tool")

        async def main() -> Any:
            async with tool_call(*key):
                return await refund_order("1042", 59.0)

        found = asyncio.run(main())
    assert found == answer
    # Unrenewed, the takeover's lease would have run out at the second step.
    assert reach == [lease] * 4, "the lease was not renewed while the reconciler asked"
    assert attempts_in(effects) == ["1"]


def test_a_rerun_after_the_call_was_taken_over_meanwhile_does_not_run_the_tool(
    sqlite_url: str, tmp_path: Path, events: list[Event]
) -> None:
    """The reconciler asks for a rerun, but another worker took the call over while it asked: the
    tool does not run here (it would run twice); the call is another worker's, so this one waits
    for it and gives up with CallInProgressError."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(sqlite_url, effects)
    ledger = SqliteLedger(sqlite_url.removeprefix("sqlite:///"))

    def rerun_while_taken_over(call: CallInfo) -> Any:
        take_over_as_another_worker(ledger, key, args_digest=call_digest, lease=300)  # a live owner's lease
        return RERUN

    call_digest = ledger.get(key).args_digest  # type: ignore[union-attr]  # the crashed run's record
    with tool_call(*key), pytest.raises(CallInProgressError):
        refund_tool(ledger, effects, in_doubt=rerun_while_taken_over, wait_timeout=0.3)("1042", 59.0)
    assert attempts_in(effects) == ["1"]  # the crashed run only: no second run
    record = ledger.get(key)
    assert record is not None and record.owner == OTHER_WORKER
    (said,) = [event.message for event in events if event.kind is EventKind.DUPLICATE_DETECTED]
    assert "asked for a rerun: the tool does not run here" in said and key.thread_id in said


class _RenewFails(SqliteLedger):
    """A real SQLite ledger whose next ``renew`` fails as ``failure`` says, once."""

    failure: BaseException | None = None

    def renew(self, key: CallKey, **kwargs: Any) -> bool:
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure
        return super().renew(key, **kwargs)


def test_an_interrupt_between_a_rerun_and_the_run_leaves_the_call_in_doubt(sqlite_url: str, tmp_path: Path) -> None:
    """Interrupted while it checks that the call is still its own (after the reconciler asked for a
    rerun), a worker leaves the call in doubt, as when the reconciler itself is interrupted: not
    running under this live process, where every later call would wait for it."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(sqlite_url, effects)
    ledger = _RenewFails(sqlite_url.removeprefix("sqlite:///"))
    ledger.failure = KeyboardInterrupt()
    with tool_call(*key), pytest.raises(KeyboardInterrupt):
        refund_tool(ledger, effects, in_doubt=lambda call: RERUN)("1042", 59.0)
    record = ledger.get(key)
    assert record is not None and (record.status, record.attempt) == (Status.IN_DOUBT, 2)
    assert attempts_in(effects) == ["1"]
    with tool_call(*key):  # the next replay settles it: the reconciler asks again, and the tool runs
        refund_tool(ledger, effects, in_doubt=lambda call: RERUN)("1042", 59.0)
    assert attempts_in(effects) == ["1", "3"]


def test_a_rerun_whose_ownership_cannot_be_read_runs_as_the_takeover_allowed(
    sqlite_url: str, tmp_path: Path, events: list[Event]
) -> None:
    """The ledger fails when the worker checks, after a rerun was asked for, that the call is still
    its own: the tool runs, as the takeover allowed (its record's write is fenced), and an error
    event says the check could not be made."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(sqlite_url, effects)
    ledger = _RenewFails(sqlite_url.removeprefix("sqlite:///"), retry=RetryPolicy(attempts=1))
    ledger.failure = sqlite3.OperationalError("disk I/O error")
    with tool_call(*key):
        refund_tool(ledger, effects, in_doubt=lambda call: RERUN)("1042", 59.0)
    assert attempts_in(effects) == ["1", "2"]
    (said,) = [event.message for event in events if event.kind is EventKind.LEDGER_ERROR]
    assert "asked for a rerun" in said and "could not be read" in said and key.thread_id in said
    record = ledger.get(key)
    assert record is not None and (record.status, record.attempt) == (Status.COMPLETED, 2)


def test_an_async_reconciler_of_a_sync_tool_is_refused_cleanly(sqlite_url: str, tmp_path: Path) -> None:
    """A sync tool cannot await its reconciler: a TypeError says so, the call stays in doubt, and
    the coroutine the reconciler made is closed (no "never awaited" warning follows)."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(sqlite_url, effects)
    ledger = SqliteLedger(sqlite_url.removeprefix("sqlite:///"))

    async def lookup(call: CallInfo) -> Any:
        return "Refunded 59.00 (found at provider)"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tool_call(*key), pytest.raises(TypeError, match="must be sync too"):
            refund_tool(ledger, effects, in_doubt=lookup)("1042", 59.0)
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
    record = ledger.get(key)
    assert record is not None and record.status is Status.IN_DOUBT
    assert attempts_in(effects) == ["1"]


def test_operator_resolves_with_a_result(durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path) -> None:
    """ledger.resolve(key, result=...) settles the call; a replay returns that result."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(durable_ledger_url, effects)
    settled = durable_ledger.resolve(key, result="refund confirmed by hand")
    assert settled is not None
    assert settled.status is Status.COMPLETED
    with tool_call(*key):
        assert refund_tool(durable_ledger, effects, in_doubt="raise")("1042", 59.0) == "refund confirmed by hand"
    assert attempts_in(effects) == ["1"]


def test_operator_resolves_with_a_rerun(durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path) -> None:
    """ledger.resolve(key, rerun=True) lets the next replay run the tool, even under in_doubt='raise'."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(durable_ledger_url, effects)
    assert durable_ledger.resolve(key, rerun=True) is None
    with tool_call(*key):
        refund_tool(durable_ledger, effects, in_doubt="raise")("1042", 59.0)
    assert attempts_in(effects) == ["1", "1"]


def test_resolve_refuses_a_settled_call(ledger: Ledger) -> None:
    """A completed call is not resolved again; a missing one is a LookupError."""
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c")
    with pytest.raises(LookupError):
        ledger.resolve(key, result=1)
    with tool_call(*key):
        replay_safe(ledger=ledger)(lambda: 1)()
    with pytest.raises(ValueError, match="already completed"):
        ledger.resolve(key, result=2)
    with pytest.raises(TypeError, match="exactly one"):
        ledger.resolve(key)


def test_a_live_owner_elsewhere_on_this_machine_is_never_declared_dead(
    durable_ledger: Ledger, durable_ledger_url: str, replaysafe_clock: SteppedClock
) -> None:
    """Past its 1 s lease, a live owner process is still waited for, not taken over (until the wait gives up).

    The clock replaysafe reads here is stepped past the lease the owner wrote on the machine's clock; the
    replay's pauses between its looks step it further, so its wait (0.3 s) is over at once."""
    clock = replaysafe_clock
    thread = f"t-{uuid.uuid4().hex[:8]}"
    holder = subprocess.Popen(
        [sys.executable, CHILD, "hold", durable_ledger_url, thread], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "claimed"
        key = CallKey(thread, "msg_7", "call_1")
        record = durable_ledger.get(key)
        assert record is not None
        clock.advance(max(record.lease_expires_at - clock.now(), dt.timedelta(0)) + dt.timedelta(seconds=1))
        observed = SeesWaiting(durable_ledger)  # counts the looks that find the call running
        runs: list[int] = []

        @replay_safe(ledger=observed, wait_timeout=0.3)
        def refund_order(order_id: str, amount: float) -> str:
            runs.append(1)
            return "second run"

        with tool_call(*key), pytest.raises(CallInProgressError):
            refund_order("1042", 59.0)
        assert runs == []
        assert observed.waits > 1  # found running past its lease, and waited for until the wait gave up
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


async def test_a_cancelled_async_tool_is_in_doubt_at_once(ledger: Ledger) -> None:
    """Cancelling a running async tool marks its call in doubt: a replay need not wait for the lease."""
    started = asyncio.Event()

    @replay_safe(ledger=ledger)
    async def refund_order(order_id: str) -> str:
        started.set()
        await asyncio.sleep(60)
        return "never"

    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c")

    async def call() -> str:
        async with tool_call(*key):
            return await refund_order("1")

    task = asyncio.create_task(call())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    record = ledger.get(key)
    assert record is not None
    assert record.status is Status.IN_DOUBT


def test_open_ledger_roundtrip_for_children(durable_ledger_url: str) -> None:
    """The URL a child process gets opens the same store as the fixture's ledger."""
    with open_ledger(durable_ledger_url) as ledger:
        key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c")
        with tool_call(*key):
            replay_safe(ledger=ledger, name="probe")(lambda: 7)()
    with open_ledger(durable_ledger_url) as again:
        record = again.get(key)
        assert record is not None
        assert record.result == "7"
