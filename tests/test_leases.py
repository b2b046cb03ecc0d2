"""Leases: renewed while a tool runs, so another host waits instead of taking the call over.

The cross-host tests run two real processes on one real ledger. The second one
names another machine in its owner tokens (``REPLAYSAFE_OWNER_MACHINE``), so it
cannot check the first one's pid: only the lease tells it the owner is alive.
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
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from replaysafe import (
    CallKey,
    Event,
    EventKind,
    Ledger,
    MemoryLedger,
    SqliteLedger,
    Status,
    on_event,
    open_ledger,
    replay_safe,
    tool_call,
)
from replaysafe._leases import Lease, Schedule, first_due, renewal_interval
from replaysafe._owners import OWNER_MACHINE_ENV

from .conftest import _unavailable

ROOT = Path(__file__).resolve().parents[1]
KINDS = ["sync", "sync-worker", "async", "async-blocking", "stream", "astream"]


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


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_tool_outliving_its_lease_is_not_taken_over_by_another_host(
    kind: str, durable_ledger_url: str, tmp_path: Path
) -> None:
    """A tool runs ~3x its lease; a process on 'another host' replays the same call meanwhile.

    It waits for the owner's result instead of taking the call over: the tool runs once,
    and both get the same result. Without renewal the lease runs out and it runs twice.
    """
    effects = tmp_path / "effects"
    thread = f"lease-{uuid.uuid4().hex[:8]}"
    owner = _worker(kind, durable_ledger_url, effects, thread, lease="0.9", seconds=3.0, wait=60, env={})
    try:
        _wait_for_effect(effects, owner)
        other = _worker(
            kind,
            durable_ledger_url,
            effects,
            thread,
            lease="0.9",
            seconds=3.0,
            wait=60,
            env={OWNER_MACHINE_ENV: "another-host"},
        )
        owner_result, other_result = _outcome(owner), _outcome(other)
    finally:
        owner.kill()
    ran = effects.read_text().splitlines()
    assert ran == [f"ran {owner.pid}"]
    assert other_result == owner_result
    assert str(owner.pid) in json.dumps(owner_result)


def test_the_renewed_lease_is_stored_while_the_tool_runs(durable_ledger_url: str) -> None:
    """The record's lease moves forward while a long tool runs, and no further once it is done."""
    seen = []
    with open_ledger(durable_ledger_url) as ledger:
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


async def test_async_calls_are_renewed_by_the_renewer_thread_not_a_timer_on_their_loop() -> None:
    """The leases of async calls running together are renewed while their tools run, by the renewer thread: no
    timer is set on their event loop (a tool that blocks the loop would stop it), and each lease moves on even
    while a tool blocks the loop."""
    ledger = MemoryLedger()
    loop = asyncio.get_running_loop()
    seen: dict[str, tuple[datetime, datetime]] = {}
    both_run = asyncio.Event()
    timers: list[int] = []

    @replay_safe(ledger=ledger, lease=0.3, timeout=None)
    async def long_task(label: str) -> None:
        record = ledger.get(keys[label])
        assert record is not None
        if label == "second":
            timers.append(sum(1 for h in loop._scheduled if not h.cancelled()))  # type: ignore[attr-defined]
            both_run.set()
        await both_run.wait()
        if label == "first":
            time.sleep(1.0)  # blocks the loop; renewed every 0.1 s all the same  # noqa: ASYNC251
        else:
            await asyncio.sleep(1.0)
        renewed = ledger.get(keys[label])
        assert renewed is not None
        seen[label] = (record.lease_expires_at, renewed.lease_expires_at)

    keys = {label: CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c") for label in ("first", "second")}

    async def call(label: str) -> None:
        async with tool_call(*keys[label]):
            await long_task(label)

    await asyncio.gather(call("first"), call("second"))
    assert timers == [0]
    assert set(seen) == {"first", "second"}
    for claimed, renewed in seen.values():
        assert renewed >= claimed + timedelta(seconds=0.5)


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


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    for _ in range(400):  # bounded: 20 s
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within 20s")


def test_a_renewal_that_fails_is_tried_again_at_the_next_tick(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The database is locked by another connection for a while: renewals fail (logged), the
    tool goes on undisturbed, and the first renewal after the lock is gone moves the lease."""
    ledger = SqliteLedger(tmp_path / "ledger.db", busy_timeout=0.05)
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")

    @replay_safe(ledger=ledger, lease=1.2, timeout=None)
    def long_task() -> str:
        first = ledger.get(key)
        assert first is not None
        blocker = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")  # a real lock: every other writer gets "database is locked"
        try:
            _wait_for(lambda: "could not be renewed" in caplog.text, "a failed renewal")
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        _wait_for(
            lambda: ledger.get(key).lease_expires_at > first.lease_expires_at,  # type: ignore[union-attr]
            "a renewal after the lock was released",
        )
        return "done"

    with caplog.at_level(logging.WARNING, logger="replaysafe"), tool_call(*key):
        assert long_task() == "done"
    record = ledger.get(key)
    assert record is not None
    assert (record.status, record.result) == (Status.COMPLETED, '"done"')
    failed = [r for r in caplog.records if "could not be renewed" in r.getMessage()]
    assert failed and "OperationalError" in failed[0].getMessage()
    assert key.thread_id in failed[0].getMessage()
    ledger.close()


def test_a_lost_lease_stops_renewing_and_the_owner_learns_it_at_completion(
    durable_ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """Another worker takes the call over while the tool runs: the renewal reports the lease
    lost and changes nothing; the completion is fenced out and reported as a duplicate."""
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
    events: list[Event] = []
    unsubscribe = on_event(events.append)

    @replay_safe(ledger=durable_ledger, lease=0.6, timeout=None)
    def long_task() -> str:
        record = durable_ledger.get(key)
        assert record is not None
        now = datetime.now(timezone.utc)
        taken = durable_ledger.takeover(
            record, owner="another-host:1:1#1", now=now, lease_expires_at=now + timedelta(seconds=600)
        )
        assert taken is not None
        _wait_for(lambda: "is no longer held" in caplog.text, "the renewer noticing the lost lease")
        return "done"

    try:
        with caplog.at_level(logging.WARNING, logger="replaysafe"), tool_call(*key):
            assert long_task() == "done"
    finally:
        unsubscribe()
    record = durable_ledger.get(key)
    assert record is not None
    assert (record.owner, record.status) == ("another-host:1:1#1", Status.RUNNING)
    assert record.lease_expires_at > datetime.now(timezone.utc) + timedelta(seconds=500)  # not renewed by us
    assert [e.kind for e in events if e.kind is EventKind.DUPLICATE_DETECTED] == [EventKind.DUPLICATE_DETECTED]


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
    starts the renewer thread, which takes the first lease in and sleeps before the second caller gets past
    the start lock. The second caller wakes it, so its lease is renewed when due. Before, it returned
    without waking the thread, and with nothing else scheduled the lease was never renewed."""
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
    second = Lease(CallKey("t", "m", "second"), "me", "second", length, ledger, time.monotonic() + 0.05)
    with renewer._start_lock:  # the first caller, between starting the thread and publishing it
        renewer._incoming.append(first)
        thread = threading.Thread(target=renewer._run, name="replaysafe-lease-renewer", daemon=True)
        thread.start()
        _wait_for(lambda: renewed == ["first"] and renewer._wakes_at == math.inf, "the renewer asleep")
        second_caller = threading.Thread(target=renewer.add, args=(second,))
        second_caller.start()  # queues its lease, finds no thread, waits for the start lock
        _wait_for(lambda: len(renewer._incoming) == 1, "the second lease queued")
        renewer._thread = thread
    second_caller.join(30)
    assert second_renewed.wait(30), f"the renewer renewed {renewed} and slept without the second lease"
    assert renewed == ["first", "second"]


class _SlowRenewals(MemoryLedger):
    """A memory ledger whose renewals take 0.3 s, run off the loop (as a server ledger's are)."""

    blocking_io = True

    def __init__(self) -> None:
        super().__init__()
        self.renewal_contexts: list[str | None] = []

    def renew(self, *args: object, **kwargs: object) -> bool:
        self.renewal_contexts.append(_REQUEST.get(None))
        time.sleep(0.3)
        return super().renew(*args, **kwargs)  # type: ignore[arg-type]


_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request")


async def test_a_renewal_in_flight_when_the_tool_ends_is_not_reported_lost(caplog: pytest.LogCaptureFixture) -> None:
    """A renewal still running when the tool returns finds the call completed: that is not a lost lease,
    and no warning says so."""
    ledger = _SlowRenewals()

    @replay_safe(ledger=ledger, lease=0.3, timeout=None)
    async def quick() -> str:
        await asyncio.sleep(0.15)  # the first renewal starts at 0.1 s and ends at 0.4 s
        return "done"

    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c")
    with caplog.at_level(logging.WARNING, logger="replaysafe"):
        async with tool_call(*key):
            assert await quick() == "done"
        await asyncio.sleep(0.5)  # the renewal in flight comes back
    assert len(ledger.renewal_contexts) == 1
    record = ledger.get(key)
    assert record is not None and record.status is Status.COMPLETED
    # This call's records only: another test's lease may still be reported by the process-wide renewer.
    assert not [r for r in caplog.records if "lease" in r.getMessage() and key.thread_id in r.getMessage()]


async def test_renewals_do_not_run_in_another_calls_context() -> None:
    """One loop timer keeps every call's lease: its renewals run in a context of their own, never in
    (or keeping alive) the context of the call that happened to arm the timer."""
    ledger = _SlowRenewals()

    @replay_safe(ledger=ledger, lease=0.3, timeout=None)
    async def slow(request: str) -> str:
        await asyncio.sleep(0.5)
        return request

    async def call(request: str) -> str:
        _REQUEST.set(request)  # each call's task has its own copy: a request id, a tracing span
        async with tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", request):
            return await slow(request)

    assert await asyncio.gather(call("A"), call("B")) == ["A", "B"]
    await asyncio.sleep(0.4)
    assert ledger.renewal_contexts and set(ledger.renewal_contexts) == {None}
