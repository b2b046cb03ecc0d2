"""Leases: renewed while a tool runs, so another host waits instead of taking the call over.

The protocol decides when a lease has run out, and the renewer when one is due, on the clock
they are handed: the tests of those decisions step a ``SteppedClock`` and run in a moment (a
replay's pauses while it waits for a live owner step it too). A
few run in real time, end to end, to prove the real timers: on each ledger the renewer thread
renews a running call's lease, and another host's lease runs out and is taken over; and the
cross-host tests run two real processes on one real ledger. The second one names another
machine in its owner tokens (``REPLAYSAFE_OWNER_MACHINE``), so it cannot check the first one's
pid: only the lease tells it the owner is alive.
"""

from __future__ import annotations

import asyncio
import contextvars
import fcntl
import json
import logging
import math
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from replaysafe import (
    CallInProgressError,
    CallKey,
    Event,
    EventKind,
    Ledger,
    MemoryLedger,
    Record,
    SqliteLedger,
    Status,
    current_call,
    on_event,
    open_ledger,
    replay_safe,
    tool_call,
)
from replaysafe._leases import Lease, Schedule, first_due, renewal_interval
from replaysafe._owners import OWNER_MACHINE_ENV
from replaysafe.testing import SteppedClock

from .conftest import LEDGER_BACKENDS, _unavailable
from .waiting import SeesWaiting

ROOT = Path(__file__).resolve().parents[1]
KINDS = ["sync", "sync-worker", "async", "async-blocking", "stream", "astream"]
#: An owner on another machine: this process cannot look at it, so only its lease says whether it lives.
OTHER_HOST = "another-host:1:1#1"


def _worker(
    kind: str, url: str, effects: Path, thread: str, *, lease: str, seconds: float, wait: float, env: dict[str, str]
) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.lease_worker", kind, url, str(effects), thread, lease, str(seconds)]
    return subprocess.Popen(
        [*command, str(wait)],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_effect(effects: Path, process: subprocess.Popen[str]) -> None:
    """Until the tool has started in ``process`` (bounded: a hung worker fails the test)."""
    for _ in range(600):
        if effects.exists() and effects.read_text():
            return
        if process.poll() is not None:
            raise AssertionError(f"the worker ended before its tool ran: {process.communicate()}")
        time.sleep(0.05)
    raise AssertionError("the worker's tool did not start within 30s")


def _outcome(process: subprocess.Popen[str]) -> object:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    for _ in range(400):  # bounded: 20 s
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within 20s")


def _recorded(ledger: Ledger, tool: Callable[..., Any], *args: Any) -> Record:
    """The record ``tool(*args)`` leaves, run once under throwaway ids: its tool name and argument digest."""
    key = CallKey(f"probe-{uuid.uuid4().hex[:8]}", "m", "c")
    with tool_call(*key):
        tool(*args)
    record = ledger.get(key)
    assert record is not None
    return record


def _claimed_by_another_host(ledger: Ledger, key: CallKey, like: Record, now: datetime, lease: timedelta) -> Record:
    """``key`` claimed, as ``like``'s call, by a process on another machine, at ``now``, for ``lease``."""
    found = ledger.claim(
        key,
        tool_name=like.tool_name,
        args_digest=like.args_digest,
        owner=OTHER_HOST,
        now=now,
        lease_expires_at=now + lease,
    )
    assert found.claimed
    return found.record


# --- real time, end to end: the real renewer and the real clock ----------------------------

#: The real renewer across processes: every kind of tool on SQLite, one kind on each server ledger (each
#: kind's lease is renewed on every ledger, in process and on the stepped clock, further down).
CROSS_PROCESS = [*(("sqlite", kind) for kind in KINDS), ("postgres", "sync-worker"), ("redis", "async-blocking")]


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "kind"), CROSS_PROCESS)
def test_a_tool_outliving_its_lease_is_not_taken_over_by_another_host(
    backend: str, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A tool runs ~3x its lease; a process on 'another host' replays the same call meanwhile.

    It waits for the owner's result instead of taking the call over: the tool runs once,
    and both get the same result. Without renewal the lease runs out and it runs twice.
    Real time: the renewer thread's own timer keeps the lease, across two processes.
    """
    url = LEDGER_BACKENDS[backend](request)
    effects = tmp_path / "effects"
    thread = f"lease-{uuid.uuid4().hex[:8]}"
    owner = _worker(kind, url, effects, thread, lease="0.9", seconds=3.0, wait=60, env={})
    try:
        _wait_for_effect(effects, owner)
        other = _worker(
            kind, url, effects, thread, lease="0.9", seconds=3.0, wait=60, env={OWNER_MACHINE_ENV: "another-host"}
        )
        owner_result, other_result = _outcome(owner), _outcome(other)
    finally:
        owner.kill()
    ran = effects.read_text().splitlines()
    assert ran == [f"ran {owner.pid}"]
    assert other_result == owner_result
    assert str(owner.pid) in json.dumps(owner_result)


def test_the_renewed_lease_is_stored_while_the_tool_runs(ledger_url: str) -> None:
    """The record's lease moves forward while a long tool runs, and no further once it is done.

    Real time, on each ledger: the renewer thread renews on its own timer."""
    seen = []
    with open_ledger(ledger_url) as ledger:
        key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")

        @replay_safe(ledger=ledger, lease=0.6, timeout=None)
        def long_task() -> str:
            first = ledger.get(key)
            assert first is not None
            seen.append(first.lease_expires_at)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # until a renewal has landed (bounded)
                now = ledger.get(key)
                assert now is not None
                if now.lease_expires_at > first.lease_expires_at + timedelta(seconds=0.1):
                    seen.append(now.lease_expires_at)
                    break
                time.sleep(0.05)
            return "done"

        with tool_call(*key):
            assert long_task() == "done"
        final = ledger.get(key)
    assert len(seen) == 2, "the lease was never renewed while the tool ran"
    assert final is not None
    assert final.status is Status.COMPLETED


def test_a_lease_run_out_in_real_time_is_taken_over(ledger: Ledger) -> None:
    """Another host's lease runs out on the machine's clock: a replay takes the call over as in doubt and
    runs it again (attempt 2). Real time, on each ledger: no clock is handed in."""
    attempts: list[int] = []

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str) -> str:
        attempts.append(current_call().attempt)
        return "refunded"

    like = _recorded(ledger, refund_order, "1")
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
    claimed = _claimed_by_another_host(ledger, key, like, datetime.now(timezone.utc), timedelta(seconds=0.3))
    _wait_for(lambda: datetime.now(timezone.utc) > claimed.lease_expires_at, "the lease running out")
    attempts.clear()
    with tool_call(*key):
        assert refund_order("1") == "refunded"
    assert attempts == [2]
    record = ledger.get(key)
    assert record is not None and (record.status, record.attempt) == (Status.COMPLETED, 2)


# --- on the stepped clock: which lease has run out, and which is renewed ----------------------


def test_another_hosts_call_is_waited_for_until_its_lease_runs_out(
    ledger: Ledger, replaysafe_clock: SteppedClock
) -> None:
    """Until its lease ends on the clock replaysafe is handed, another host's running call is waited for (the
    wait gives up with CallInProgressError); from the very moment it ends, the call is in doubt and taken over.
    The replay's pauses between its looks step the clock: its wait (0.5 s) is over at once."""
    clock = replaysafe_clock
    observed = SeesWaiting(ledger)  # counts the looks that find the call running under another owner
    attempts: list[int] = []

    @replay_safe(ledger=observed, wait_timeout=0.5)
    def refund_order(order_id: str) -> str:
        attempts.append(current_call().attempt)
        return "refunded"

    like = _recorded(ledger, refund_order, "1")
    attempts.clear()
    first, second = (CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1") for _ in range(2))
    lease_ends = _claimed_by_another_host(ledger, first, like, clock.now(), timedelta(seconds=30)).lease_expires_at
    exact_end = _claimed_by_another_host(ledger, second, like, clock.now(), timedelta(seconds=40)).lease_expires_at
    clock.advance(25)
    with tool_call(*first), pytest.raises(CallInProgressError):
        refund_order("1")  # from 25 s to 25.5 s: waited for, then given up on
    assert observed.waits > 1 and attempts == []
    clock.advance(lease_ends - clock.now() - timedelta(seconds=0.4))
    looks = observed.waits
    with tool_call(*first):  # waited for while its last 0.4 s run out, then taken over
        assert refund_order("1") == "refunded"
    assert observed.waits - looks > 1 and attempts == [2] and clock.now() > lease_ends
    looks = observed.waits
    clock.advance(exact_end - clock.now())
    with tool_call(*second):  # taken over at the first look, at the very end of its lease
        assert refund_order("1") == "refunded"
    assert (observed.waits - looks, attempts) == (1, [2, 2])
    for key in (first, second):
        record = ledger.get(key)
        assert record is not None and (record.status, record.attempt) == (Status.COMPLETED, 2)


def _outlive(kind: str, ledger: Ledger, key: CallKey, clock: SteppedClock, lease: float) -> list[timedelta]:
    """Call a tool of ``kind`` that runs for three of its leases on the stepped clock, in six steps; return
    how far its stored lease reached past the clock after each step."""
    reach: list[timedelta] = []

    def step() -> None:
        clock.advance(lease / 2)  # past a renewal interval (a third of the lease) each time
        record = ledger.get(key)
        assert record is not None
        reach.append(record.lease_expires_at - clock.now())

    options: dict[str, Any] = {"ledger": ledger, "lease": lease, "timeout": None, "name": "send_invitations"}
    if kind in ("sync", "sync-worker"):

        @replay_safe(**{**options, "timeout": 600 if kind == "sync-worker" else None})
        def work() -> str:
            for _ in range(6):
                step()
            return "sent"

        results: list[str] = []

        def call() -> None:
            with tool_call(*key):
                results.append(work())

        if kind == "sync":
            call()
        else:  # a timeout, called off the main thread: the tool runs in the worker pool
            caller = threading.Thread(target=call)
            caller.start()
            caller.join(60)
        assert results == ["sent"]
    elif kind in ("async", "async-blocking"):

        @replay_safe(**options)
        async def awork() -> str:
            for _ in range(6):
                step()  # blocks the event loop while the step waits for the renewer
                if kind == "async":
                    await asyncio.sleep(0)
            return "sent"

        async def acall() -> str:
            async with tool_call(*key):
                return await awork()

        assert asyncio.run(acall()) == "sent"
    elif kind == "stream":

        @replay_safe(**options)
        def chunks() -> Iterator[int]:
            for n in range(3):
                step()
                step()
                yield n

        with tool_call(*key):
            assert list(chunks()) == [0, 1, 2]
    else:

        @replay_safe(**options)
        async def achunks() -> AsyncIterator[int]:
            for n in range(3):
                step()
                step()
                yield n

        async def consume() -> list[int]:
            async with tool_call(*key):
                return [n async for n in achunks()]

        assert asyncio.run(consume()) == [0, 1, 2]
    return reach


@pytest.mark.parametrize("kind", KINDS)
def test_a_tool_outliving_its_lease_keeps_it_renewed(kind: str, ledger: Ledger, replaysafe_clock: SteppedClock) -> None:
    """Each kind of tool runs for three of its leases: after every step of the clock its lease has been renewed
    to the full length from the new time, so another host, which can only read the lease, finds its owner
    alive and waits. Without renewal the lease would have run out after the second step."""
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
    reach = _outlive(kind, ledger, key, replaysafe_clock, lease=0.9)
    assert reach == [timedelta(seconds=0.9)] * 6, f"the lease was not renewed at each step: {reach}"
    record = ledger.get(key)
    assert record is not None and (record.status, record.attempt) == (Status.COMPLETED, 1)


# --- the pure schedule ------------------------------------------------------------------


def _lease(length: float, due: float) -> Lease:
    key = CallKey("t", "m", uuid.uuid4().hex)
    return Lease(key, "host:1:1#1", "tool", timedelta(seconds=length), MemoryLedger(), due)


def test_renewals_come_at_a_third_of_the_lease() -> None:
    """A lease of 30 s is renewed every 10 s, the first time one interval after the claim."""
    assert renewal_interval(timedelta(seconds=30)) == 10
    assert first_due(timedelta(seconds=30), 100.0) == 110.0


def test_schedule_gives_due_leases_earliest_first_and_forgets_ended_ones() -> None:
    schedule = Schedule()
    late, early, ended = _lease(30, 20.0), _lease(30, 5.0), _lease(30, 1.0)
    for lease in (late, early, ended):
        schedule.add(lease)
    ended.end()
    assert schedule.next_due() == 5.0
    assert schedule.due(4.0) == []
    assert schedule.due(25.0) == [early, late]
    assert schedule.next_due() is None
    assert len(schedule) == 0


def test_a_failed_renewal_is_tried_at_the_next_tick_and_a_lost_lease_ends() -> None:
    lease = _lease(3, 0.0)
    lease.after_renewal(None, 10.0)  # the ledger failed: keep going
    assert (lease.active, lease.due) == (True, 11.0)
    lease.after_renewal(True, 11.0)
    assert (lease.active, lease.due) == (True, 12.0)
    lease.after_renewal(False, 12.0)  # taken over: stop
    assert not lease.active


def test_ended_leases_do_not_pile_up_in_the_schedule() -> None:
    """Many short calls under a long lease: their entries are dropped long before they come due."""
    schedule = Schedule()
    keep = _lease(300, 100.0)
    schedule.add(keep)
    for _ in range(5000):
        short = _lease(300, 100.0)
        schedule.add(short)
        short.end()
    assert len(schedule._heap) <= 2048
    assert schedule.due(200.0) == [keep]


async def test_async_calls_are_renewed_by_the_renewer_thread_not_a_timer_on_their_loop(
    replaysafe_clock: SteppedClock,
) -> None:
    """The leases of async calls running together are renewed while their tools run, by the renewer thread: no
    timer is set on their event loop (a tool that blocks the loop would stop it), and each lease moves on even
    while a tool blocks the loop: here the step of the clock itself, which returns once the renewals are made."""
    clock = replaysafe_clock
    ledger = MemoryLedger()
    loop = asyncio.get_running_loop()
    reach: dict[str, timedelta] = {}
    both_run, stepped = asyncio.Event(), asyncio.Event()
    timers: list[int] = []

    @replay_safe(ledger=ledger, lease=0.3, timeout=None)
    async def long_task(label: str) -> None:
        if label == "second":
            timers.append(sum(1 for h in loop._scheduled if not h.cancelled()))  # type: ignore[attr-defined]
            both_run.set()
        await both_run.wait()
        if label == "first":
            clock.advance(1.0)  # blocks the loop until both leases are renewed
            stepped.set()
        else:
            await stepped.wait()
        renewed = ledger.get(keys[label])
        assert renewed is not None
        reach[label] = renewed.lease_expires_at - clock.now()

    keys = {label: CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c") for label in ("first", "second")}

    async def call(label: str) -> None:
        async with tool_call(*keys[label]):
            await long_task(label)

    await asyncio.gather(call("first"), call("second"))
    assert timers == [0]
    assert reach == {"first": timedelta(seconds=0.3), "second": timedelta(seconds=0.3)}


# --- hidepid: a live owner another user cannot see --------------------------------------


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory two unprivileged users can both write (the SQLite file and its WAL)."""
    path = Path(tempfile.mkdtemp(prefix="replaysafe-hidepid-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def reachable_by_other_users() -> Iterator[None]:
    """The checkout and the interpreter's environment, traversable by the two unprivileged users.

    A checkout may sit in a directory only its owner can enter (a ``mktemp -d`` clone is 0700):
    each directory on the path gets ``o+rx`` and each ancestor ``o+x`` for the test, and its mode back after.
    The modes are the machine's, not this run's: a lock on them keeps a run beside this one (another
    Python's session in CI) from putting a mode back while this test still needs it.
    """
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        _unavailable("the hidepid test needs root, unshare and setpriv to run workers as two users")
    places = [ROOT, Path(sys.prefix), Path(sys.executable).resolve().parent, *map(Path, sys.path)]
    changed: dict[Path, int] = {}
    lock_path = Path(tempfile.gettempdir()) / "replaysafe-tests-directory-modes.lock"
    with open(lock_path, "a") as lock:  # closing it releases the lock, as the kernel does if this process dies
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            for place in places:
                # Imports list the directories on the path (read); their ancestors need only be entered.
                needs = [(place, stat.S_IROTH | stat.S_IXOTH)] if place.is_dir() else []
                for directory, bits in [*needs, *((parent, stat.S_IXOTH) for parent in place.parents)]:
                    mode = changed.get(directory, directory.stat().st_mode)
                    if stat.S_IMODE(directory.stat().st_mode) & bits != bits:
                        changed.setdefault(directory, mode)
                        directory.chmod(stat.S_IMODE(directory.stat().st_mode) | bits)
            yield
        finally:
            for directory, mode in changed.items():
                directory.chmod(stat.S_IMODE(mode))


def _as_user(uid: int, command: list[str], *, hidepid: bool = False) -> list[str]:
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *command]
    if not hidepid:
        return drop
    # A private mount namespace with a fresh /proc that hides other users' processes.
    script = 'mount -t proc -o hidepid=2 proc /proc && exec "$@"'
    return ["unshare", "--mount", "--fork", "sh", "-c", script, "sh", *drop]


@pytest.mark.slow
# Not Redis: run as another user, the interpreter may be the system's, whose redis-py
# import needs a backport (async_timeout) the test environment does not install.
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_owner_hidden_by_hidepid_is_waited_for_not_taken_over(
    backend: str, shared_dir: Path, request: pytest.FixtureRequest, reachable_by_other_users: None
) -> None:
    """The owner runs as one user; the replay runs as another, with /proc mounted hidepid=2.

    The replaying worker cannot see the owner's process (no /proc entry, EPERM from
    kill): that is no proof of death, so the lease decides and it waits.
    """
    if backend == "sqlite":
        database = shared_dir / "ledger.db"
        database.touch(mode=0o666)  # SQLite creates its WAL files with the database file's mode
        database.chmod(0o666)
        url = f"sqlite:///{database}"
    else:
        url = str(request.getfixturevalue(f"{backend}_url"))
    effects = shared_dir / "effects"
    thread = f"hidepid-{uuid.uuid4().hex[:8]}"
    worker = [sys.executable, "-m", "tests.lease_worker", "sync", url, str(effects), thread, "none"]
    run = {"cwd": ROOT, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    owner = subprocess.Popen(_as_user(1, [*worker, "60", "1"]), **run)  # type: ignore[call-overload]
    try:
        _wait_for_effect(effects, owner)
        with open_ledger(url) as ledger:
            record = ledger.get(CallKey(thread, "msg_1", "call_1"))
        assert record is not None and record.status is Status.RUNNING
        replay = subprocess.run(
            _as_user(65534, [*worker, "5", "1.5"], hidepid=True), cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert replay.returncode == 0, replay.stderr
        assert json.loads(replay.stdout.strip().splitlines()[-1]) == "CallInProgressError", replay.stderr
        look = (
            "import os, sys; from replaysafe._owners import owner_alive; "
            "pid = int(sys.argv[1].split(':')[1]); "
            "print(os.path.exists(f'/proc/{pid}'), owner_alive(sys.argv[1]))"
        )
        seen = subprocess.run(
            _as_user(65534, [sys.executable, "-c", look, record.owner], hidepid=True),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert seen.stdout.split() == ["False", "None"], seen.stderr
    finally:
        owner.kill()
        owner.communicate(timeout=30)
    # setpriv execs the worker: the owner's pid is the worker's.
    assert effects.read_text().splitlines() == [f"ran {owner.pid}"]


# --- renewals that fail, and leases that are lost ----------------------------------------


def test_a_renewal_that_fails_is_tried_again_at_the_next_tick(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, replaysafe_clock: SteppedClock
) -> None:
    """The database is locked by another connection when a renewal is due: it fails (logged), the tool goes on
    undisturbed, and the renewal at the next tick, once the lock is gone, moves the lease."""
    clock = replaysafe_clock
    ledger = SqliteLedger(tmp_path / "ledger.db", busy_timeout=0.05)
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
    lease = timedelta(seconds=1.2)  # renewed every 0.4 s

    @replay_safe(ledger=ledger, lease=lease.total_seconds(), timeout=None)
    def long_task() -> str:
        first = ledger.get(key)
        assert first is not None
        blocker = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")  # a real lock: every other writer gets "database is locked"
        try:
            clock.advance(0.4)  # a renewal is due, and fails
            assert "could not be renewed" in caplog.text
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        held = ledger.get(key)
        assert held is not None and held.lease_expires_at == first.lease_expires_at
        clock.advance(0.4)  # the next tick
        renewed = ledger.get(key)
        assert renewed is not None and renewed.lease_expires_at == clock.now() + lease
        return "done"

    with caplog.at_level(logging.WARNING, logger="replaysafe"), tool_call(*key):
        assert long_task() == "done"
    record = ledger.get(key)
    assert record is not None
    assert (record.status, record.result) == (Status.COMPLETED, '"done"')
    failed = [r for r in caplog.records if "could not be renewed" in r.getMessage()]
    assert len(failed) == 1 and "OperationalError" in failed[0].getMessage()
    assert key.thread_id in failed[0].getMessage()
    ledger.close()


def test_a_lost_lease_stops_renewing_and_the_owner_learns_it_at_completion(
    ledger: Ledger, caplog: pytest.LogCaptureFixture, replaysafe_clock: SteppedClock
) -> None:
    """Another worker takes the call over while the tool runs: the renewal due next reports the lease
    lost and changes nothing; the completion is fenced out and reported as a duplicate."""
    clock = replaysafe_clock
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
    events: list[Event] = []
    unsubscribe = on_event(events.append)
    taken_until = clock.now() + timedelta(seconds=600)

    @replay_safe(ledger=ledger, lease=0.6, timeout=None)
    def long_task() -> str:
        record = ledger.get(key)
        assert record is not None
        assert ledger.takeover(record, owner=OTHER_HOST, now=clock.now(), lease_expires_at=taken_until) is not None
        clock.advance(0.2)  # a renewal is due: it finds the call another's
        assert "is no longer held" in caplog.text
        clock.advance(1.0)  # and there is no other: the lease ended
        return "done"

    try:
        with caplog.at_level(logging.WARNING, logger="replaysafe"), tool_call(*key):
            assert long_task() == "done"
    finally:
        unsubscribe()
    record = ledger.get(key)
    assert record is not None
    assert (record.owner, record.status, record.lease_expires_at) == (OTHER_HOST, Status.RUNNING, taken_until)
    assert len([r for r in caplog.records if "is no longer held" in r.getMessage()]) == 1
    assert [e.kind for e in events if e.kind is EventKind.DUPLICATE_DETECTED] == [EventKind.DUPLICATE_DETECTED]


# The renewer thread's own wake-ups, in real time: a stepped clock's step would wake it and hide a lease it
# went to sleep without.


def test_a_lease_queued_while_the_renewer_renews_another_is_renewed_when_due() -> None:
    """A lease added while the renewer thread is awake but done taking new leases in (here: while it renews
    another) is renewed when it is due: it wakes the thread or is seen before the thread sleeps. Before, the
    thread went to sleep without it (with nothing else scheduled, forever), so a running call's lease ran out
    and another host could take the call over while it still ran."""
    from replaysafe._renewer import Renewer

    renewer = Renewer()
    length = timedelta(seconds=60)
    renewed: list[CallKey] = []
    second_renewed = threading.Event()
    first_key, second_key = CallKey("t", "m", "first"), CallKey("t", "m", "second")

    class QueuingLedger(MemoryLedger):
        def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool:
            renewed.append(key)
            if key == first_key:  # the thread is past taking leases in: queue the second one now
                renewer.add(Lease(second_key, "me", "second", length, self, time.monotonic() + 0.05))
            else:
                second_renewed.set()
            return False  # no such claim: each lease ends at its first renewal, nothing stays scheduled

    ledger = QueuingLedger()
    renewer.add(Lease(first_key, "me", "first", length, ledger, time.monotonic()))
    assert second_renewed.wait(30), f"the renewer renewed {renewed} and went to sleep without the second lease"
    assert renewed == [first_key, second_key]


def test_a_lease_queued_while_another_caller_starts_the_renewer_is_renewed_when_due() -> None:
    """Two threads make their first protected calls at once: the second queues its lease while the first
    starts the renewer thread, which takes the first lease in (its call already ended) and sleeps with
    nothing scheduled before the second caller gets past the start lock. The second caller wakes it, so
    its lease is renewed when due. Before, it returned without waking the thread, and the lease was never
    renewed. (The first call ends before the thread starts so that no renewal thread of its own can wake
    the renewer and take the second lease in: the test sees the one wake-up it is about.)"""
    from replaysafe._renewer import Renewer

    renewer = Renewer()
    length = timedelta(seconds=60)
    renewed: list[str] = []
    second_renewed = threading.Event()

    class EndingLedger(MemoryLedger):
        def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool:
            renewed.append(key.tool_call_id)
            if key.tool_call_id == "second":
                second_renewed.set()
            return False  # no such claim: each lease ends at its first renewal, nothing stays scheduled

    ledger = EndingLedger()
    first = Lease(CallKey("t", "m", "first"), "me", "first", length, ledger, time.monotonic())
    first.end()
    second = Lease(CallKey("t", "m", "second"), "me", "second", length, ledger, time.monotonic() + 0.05)
    with renewer._start_lock:  # the first caller, between starting the thread and publishing it
        renewer._incoming.append(first)
        thread = threading.Thread(target=renewer._run, name="replaysafe-lease-renewer", daemon=True)
        thread.start()
        _wait_for(
            lambda: not renewer._incoming and renewer._wakes_at == math.inf and renewer._ended == renewer._begun >= 1,
            "the renewer asleep with nothing scheduled",
        )
        second_caller = threading.Thread(target=renewer.add, args=(second,))
        second_caller.start()  # queues its lease, finds no thread, waits for the start lock
        _wait_for(lambda: len(renewer._incoming) == 1, "the second lease queued")
        renewer._thread = thread
    second_caller.join(30)
    assert second_renewed.wait(30), f"the renewer renewed {renewed} and slept without the second lease"
    assert renewed == ["second"]


_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request")


class _HeldRenewals(MemoryLedger):
    """A memory ledger whose renewals run off the loop (as a server ledger's are), each noting the context it
    ran in; with ``held`` set, a renewal waits for ``go_on`` once it has begun (``renewing``)."""

    blocking_io = True

    def __init__(self, *, held: bool = False) -> None:
        super().__init__()
        self.renewal_contexts: list[str | None] = []
        self.held = held
        self.renewing, self.go_on = threading.Event(), threading.Event()

    def renew(self, *args: Any, **kwargs: Any) -> bool:
        self.renewal_contexts.append(_REQUEST.get(None))
        self.renewing.set()
        if self.held and not self.go_on.wait(30):
            raise TimeoutError("the test never let the renewal go on")
        return super().renew(*args, **kwargs)


async def test_a_renewal_in_flight_when_the_tool_ends_is_not_reported_lost(
    caplog: pytest.LogCaptureFixture, replaysafe_clock: SteppedClock
) -> None:
    """A renewal still running when the tool returns finds the call completed: that is not a lost lease,
    and no warning says so."""
    clock = replaysafe_clock
    ledger = _HeldRenewals(held=True)
    # The step waits for the renewal it makes due: it runs in a thread of its own, while the renewal is held.
    stepping = threading.Thread(target=clock.advance, args=(0.1,))

    @replay_safe(ledger=ledger, lease=0.3, timeout=None)
    async def quick() -> str:
        stepping.start()
        assert await asyncio.to_thread(ledger.renewing.wait, 30), "no renewal came due"
        return "done"  # while the renewal is in flight

    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c")
    with caplog.at_level(logging.WARNING, logger="replaysafe"):
        async with tool_call(*key):
            assert await quick() == "done"
        ledger.go_on.set()  # the renewal in flight comes back, to a completed call
        await asyncio.to_thread(stepping.join, 30)
    assert not stepping.is_alive()
    assert len(ledger.renewal_contexts) == 1
    record = ledger.get(key)
    assert record is not None and record.status is Status.COMPLETED
    # This call's records only: another test's lease may still be reported by the process-wide renewer.
    assert not [r for r in caplog.records if "lease" in r.getMessage() and key.thread_id in r.getMessage()]


async def test_renewals_do_not_run_in_another_calls_context(replaysafe_clock: SteppedClock) -> None:
    """The renewer keeps every call's lease: its renewals run in a context of their own, never in (or keeping
    alive) the context of a call whose lease it renews."""
    clock = replaysafe_clock
    ledger = _HeldRenewals()
    running: list[str] = []
    stepped = asyncio.Event()

    @replay_safe(ledger=ledger, lease=0.3, timeout=None)
    async def slow(request: str) -> str:
        running.append(request)
        if len(running) == 2:
            clock.advance(0.2)  # both leases are due, and renewed
            stepped.set()
        await stepped.wait()
        return request

    async def call(request: str) -> str:
        _REQUEST.set(request)  # each call's task has its own copy: a request id, a tracing span
        async with tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", request):
            return await slow(request)

    assert await asyncio.gather(call("A"), call("B")) == ["A", "B"]
    assert ledger.renewal_contexts == [None, None]


def test_a_renewal_held_up_by_a_locked_row_holds_up_no_other_lease(postgres_url: str, postgres_server_url: str) -> None:
    """Two calls run in one process; another session locks the first one's row, so the first's renewal waits
    on the lock. The second's lease is renewed all the same. Renewed one after another in one thread, the
    second waited behind the first, its lease ran out, and another host took the live call over and ran it
    again (real time: the lock is the server's)."""
    import psycopg
    from psycopg import sql

    from . import servers

    releases = {"stuck": threading.Event(), "free": threading.Event()}
    started: list[str] = []
    with open_ledger(f"{postgres_url}&io_timeout=20") as ledger:

        def tool(name: str) -> Callable[[], str]:
            @replay_safe(ledger=ledger, name=name, lease=1.5, timeout=None)
            def run() -> str:
                started.append(name)
                releases[name].wait(30)
                return name

            return run

        thread = f"t-{uuid.uuid4().hex[:8]}"
        keys = {name: CallKey(thread, "msg_1", name) for name in releases}

        def call(name: str) -> None:
            with tool_call(*keys[name]):
                tool(name)()

        workers = [threading.Thread(target=call, args=(name,)) for name in releases]
        for worker in workers:
            worker.start()
        try:
            _poll(lambda: len(started) == 2, "both calls to start")
            table = sql.Identifier(ledger.table.schema, ledger.table.name)  # type: ignore[attr-defined]
            with psycopg.connect(servers.libpq_url(postgres_server_url)) as locker:
                locker.execute(
                    sql.SQL(
                        "SELECT 1 FROM {} WHERE thread_id = %s AND message_id = %s AND tool_call_id = %s FOR UPDATE"
                    ).format(table),
                    tuple(keys["stuck"]),
                )
                free = ledger.get(keys["free"])
                assert free is not None
                locked_at = free.lease_expires_at
                # Two renewals of the free call (every 0.5 s) while the stuck one waits on the lock.
                _poll(
                    lambda: (
                        (record := ledger.get(keys["free"])) is not None
                        and record.lease_expires_at >= locked_at + timedelta(seconds=1)
                    ),
                    "the free call's lease to be renewed while the other's renewal waits on its row",
                    seconds=4,
                )
                locker.rollback()
        finally:
            for event in releases.values():
                event.set()
            for worker in workers:
                worker.join(30)
        assert sorted(started) == ["free", "stuck"]


def _poll(condition: Callable[[], object], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds:g}s for {what}")
        time.sleep(0.02)
