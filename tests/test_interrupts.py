"""Nothing stays running under a live owner: interrupts at every step leave the call
released or in doubt, and the interrupt itself still reaches the caller.

Each step is stalled for real, so the interrupt lands while the ledger operation is in
flight: SQLite by another connection holding the write lock, PostgreSQL by a table
lock, Redis by a throwaway server stopped with SIGSTOP. Cancellations are real task
cancellations; SIGINT is a real signal sent to a child process.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from replaysafe import (
    CallKey,
    Ledger,
    PostgresLedger,
    RedisLedger,
    SqliteLedger,
    Status,
    _drivers,
    _pending,
    open_ledger,
    replay_safe,
    tool_call,
)
from replaysafe._records import Record
from replaysafe.ledgers import MemoryLedger

from . import servers

#: Long enough for a stalled operation to be in flight; nothing is timed against it.
IN_FLIGHT = 0.3


class Stall:
    """Holds a ledger's writes (or, for Redis, the whole server) until resumed."""

    def __init__(
        self, hold: Callable[[], None], resume: Callable[[], None], close: Callable[[], None] = lambda: None
    ) -> None:
        self.hold, self.resume, self.close = hold, resume, close


def _sqlite_stall(ledger: SqliteLedger) -> Stall:
    blocker = sqlite3.connect(ledger.path, isolation_level=None, check_same_thread=False)

    def hold() -> None:
        blocker.execute("BEGIN IMMEDIATE")

    def resume() -> None:
        blocker.rollback()

    return Stall(hold, resume, blocker.close)


def _postgres_stall(ledger: PostgresLedger, server_url: str) -> Stall:
    blocker = psycopg.connect(servers.libpq_url(server_url))
    table = f'"{ledger.table.schema}"."{ledger.table.name}"'

    def hold() -> None:
        blocker.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")  # our own identifiers; reads go on

    def resume() -> None:
        blocker.rollback()

    return Stall(hold, resume, blocker.close)


def _redis_stall(process: subprocess.Popen[bytes]) -> Stall:
    return Stall(lambda: os.kill(process.pid, signal.SIGSTOP), lambda: os.kill(process.pid, signal.SIGCONT))


@contextlib.contextmanager
def stalled_ledger(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Ledger, Stall, str]]:
    """A ledger (opened, its table made), a way to stall it, and its URL."""
    if kind == "sqlite":
        sqlite_ledger = SqliteLedger(tmp_path / "l.db", busy_timeout=60)
        sqlite_ledger.get(CallKey("warm", "up", "-"))
        stall = _sqlite_stall(sqlite_ledger)
        try:
            yield sqlite_ledger, stall, f"sqlite:///{sqlite_ledger.path}"
        finally:
            stall.close()
            sqlite_ledger.close()
        return
    if kind == "postgres":
        server_url, url = request.getfixturevalue("postgres_server_url"), request.getfixturevalue("postgres_url")
        with contextlib.closing(open_ledger(url)) as postgres_ledger:
            assert isinstance(postgres_ledger, PostgresLedger)
            postgres_ledger.get(CallKey("warm", "up", "-"))
            stall = _postgres_stall(postgres_ledger, server_url)
            try:
                yield postgres_ledger, stall, url
            finally:
                stall.close()
        return
    server = servers.RedisServer()  # a throwaway server: the shared one is never stopped
    server.start()
    try:
        with contextlib.closing(RedisLedger(server.url)) as redis_ledger:
            redis_ledger.get(CallKey("warm", "up", "-"))
            assert server._process is not None
            yield redis_ledger, _redis_stall(server._process), server.url
    finally:
        if server._process is not None:
            os.kill(server._process.pid, signal.SIGCONT)
        server.destroy()


@pytest.fixture(params=["sqlite", "postgres", "redis"])
async def stalled(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Ledger, Stall]]:
    with stalled_ledger(request.param, request, tmp_path) as (ledger, stall, _url):
        yield ledger, stall
        aclose = getattr(ledger, "aclose", None)
        if aclose is not None:  # this loop's async connections
            await aclose()


def settled(ledger: Ledger, key: CallKey, done: Callable[[Record | None], bool], within: float = 20.0) -> Record | None:
    """The record once ``done`` holds for it, and still holds a second later (bounded wait).

    An interrupted operation may land after the interrupt, so one look is not enough.
    """
    deadline = time.monotonic() + within
    held_since: float | None = None
    record = ledger.get(key)
    while time.monotonic() < deadline:
        record = ledger.get(key)
        if not done(record):
            held_since = None
        elif held_since is None:
            held_since = time.monotonic()
        elif time.monotonic() - held_since >= 1.0:
            return record
        time.sleep(0.05)
    return record


def new_key() -> CallKey:
    return CallKey(f"thread-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")


async def _cancel_after(task: asyncio.Task[Any], delay: float = IN_FLIGHT) -> None:
    await asyncio.sleep(delay)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):  # the user's cancellation wins
        await task


async def test_cancelled_during_the_claim_the_claim_is_released(stalled: tuple[Ledger, Stall]) -> None:
    ledger, stall = stalled
    key, runs = new_key(), []

    @replay_safe(ledger=ledger)
    async def send_invite() -> str:
        runs.append(1)
        return "sent"

    async def call() -> str:
        async with tool_call(*key):
            return await send_invite()

    stall.hold()
    try:
        await _cancel_after(asyncio.create_task(call()))
    finally:
        stall.resume()  # the claim, sent before the cancellation, lands now
    record = await asyncio.to_thread(settled, ledger, key, lambda r: r is None)
    assert record is None, f"left {record.status} under a live owner" if record else ""
    assert runs == []
    async with tool_call(*key):  # and the call runs normally afterwards
        assert await send_invite() == "sent"
    assert runs == [1]


async def test_cancelled_during_the_result_write_the_result_is_recorded(stalled: tuple[Ledger, Stall]) -> None:
    ledger, stall = stalled
    key, runs, returned = new_key(), [], asyncio.Event()

    @replay_safe(ledger=ledger)
    async def refund() -> str:
        runs.append(1)
        stall.hold()  # the tool ran: its result write now waits
        returned.set()
        return "refunded"

    async def call() -> str:
        async with tool_call(*key):
            return await refund()

    task = asyncio.create_task(call())
    try:
        await asyncio.wait_for(returned.wait(), 60)  # bounded, should the call fail first
        await _cancel_after(task)
    finally:
        stall.resume()
    record = await asyncio.to_thread(settled, ledger, key, lambda r: r is not None and r.status is not Status.RUNNING)
    assert record is not None and record.status is Status.COMPLETED
    async with tool_call(*key):
        assert await refund() == "refunded"  # replayed: the refund did not run twice
    assert runs == [1]


async def test_cancelled_during_the_in_doubt_write_the_call_is_in_doubt(stalled: tuple[Ledger, Stall]) -> None:
    ledger, stall = stalled
    key, started = new_key(), asyncio.Event()

    @replay_safe(ledger=ledger, in_doubt="raise")
    async def charge() -> str:
        started.set()
        await asyncio.sleep(3600)
        return "charged"

    async def call() -> str:
        async with tool_call(*key):
            return await charge()

    task = asyncio.create_task(call())
    await asyncio.wait_for(started.wait(), 60)
    stall.hold()
    task.cancel()  # the tool is cancelled; its in-doubt write waits on the stalled ledger
    try:
        await _cancel_after(task)  # cancelled again, during that write
    finally:
        stall.resume()
    record = await asyncio.to_thread(settled, ledger, key, lambda r: r is not None and r.status is not Status.RUNNING)
    assert record is not None and record.status is Status.IN_DOUBT


def _refund_call(ledger: Ledger, key: CallKey, runs: list[int]) -> Callable[[], Awaitable[str]]:
    """A call under ``key`` of an async tool protected on ``ledger``, counting its runs in ``runs``."""

    @replay_safe(ledger=ledger, name="refund")
    async def refund() -> str:
        runs.append(1)
        return "refunded"

    async def call() -> str:
        async with tool_call(*key):
            return await refund()

    return call


async def test_a_ledger_operation_cancelled_by_someone_else_cancels_its_caller(durable_ledger: Ledger) -> None:
    """A supervisor cancels every task but the caller's, the call's ledger operation among them
    (before its first step where tasks do not start eagerly): the caller is cancelled, not left
    waiting for an answer that never comes; the claim, if it landed, is released."""
    key, runs = new_key(), []
    call = _refund_call(durable_ledger, key, runs)
    caller, supervisor = asyncio.create_task(call()), asyncio.current_task()
    cancelled: list[asyncio.Task[Any]] = []
    while not cancelled and not caller.done():
        await asyncio.sleep(0)
        for task in asyncio.all_tasks():
            if task not in (supervisor, caller) and not task.done():
                cancelled.append(task)
                task.cancel()
    assert cancelled, "the call ended before its ledger operation could be cancelled"
    done, _ = await asyncio.wait([caller], timeout=20)
    assert done, "the caller still waits for its cancelled ledger operation"
    assert caller.cancelled()
    record = await asyncio.to_thread(settled, durable_ledger, key, lambda r: r is None)
    assert record is None and runs == []
    assert await call() == "refunded"
    aclose = getattr(durable_ledger, "aclose", None)
    if aclose is not None:  # this loop's connections: the supervisor may have cancelled their guard too
        await aclose()


class _LedgerWhoseClaimRunsOn(MemoryLedger):
    """A ledger whose async operations run in worker threads (``OffloadedAsyncLedger``), as SQLite's
    do; its first claim holds its thread, and lands when the test lets it go."""

    blocking_io = True

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.go_on = threading.Event(), threading.Event()

    def claim(self, key: CallKey, **kwargs: Any) -> Any:
        if not self.entered.is_set():
            self.entered.set()
            assert self.go_on.wait(20), "the test never let the claim go on"
        return super().claim(key, **kwargs)


async def test_a_ledger_operation_cancelled_in_its_thread_is_undone_after_it_lands() -> None:
    """Someone else cancels the call's ledger operation while its worker thread runs the claim. A
    thread cannot be stopped: the operation leaves once the claim has landed, so that the release
    the cancellation makes comes after it. (Before, the release was made at once, found nothing, and
    the claim landed after it: running under a live owner. Seen once in CI as a flaky failure of
    the test above on SQLite.)"""
    ledger = _LedgerWhoseClaimRunsOn()
    key, runs = new_key(), []
    caller, supervisor = asyncio.create_task(_refund_call(ledger, key, runs)()), asyncio.current_task()
    assert await asyncio.to_thread(ledger.entered.wait, 20), "the claim never reached its thread"
    cancelled = [task for task in asyncio.all_tasks() if task not in (supervisor, caller) and not task.done()]
    assert cancelled, "no ledger operation to cancel"
    for task in cancelled:
        task.cancel()
    await asyncio.sleep(IN_FLIGHT)  # the old code made its release here, before the claim landed
    ledger.go_on.set()
    done, _ = await asyncio.wait([caller], timeout=20)
    assert done and caller.cancelled()
    record = await asyncio.to_thread(settled, ledger, key, lambda r: r is None)
    assert record is None, f"left {record.status} under a live owner" if record else ""
    assert runs == []


class _ClaimAwaitingItsOwnReply:
    """A ledger's async operations whose first claim waits on a reply that only the claim holds,
    as a client's call waits on a future of its own; the test keeps it weakly, to answer it later."""

    def __init__(self, aio: Any, replies: list[weakref.ref[asyncio.Future[None]]], waiting: asyncio.Event) -> None:
        self._aio, self._replies, self._waiting = aio, replies, waiting

    def __getattr__(self, name: str) -> Any:
        return getattr(self._aio, name)

    async def claim(self, key: CallKey, **kwargs: Any) -> Any:
        if not self._replies:  # the first claim only
            reply = asyncio.get_running_loop().create_future()
            self._replies.append(weakref.ref(reply))
            self._waiting.set()
            await reply
        return await self._aio.claim(key, **kwargs)


class _LedgerWithAClaimAwaitingItsOwnReply(MemoryLedger):
    blocking_io = True  # its operations run as a waiting ledger's do: each in a task of its own

    def __init__(self) -> None:
        super().__init__()
        self.replies: list[weakref.ref[asyncio.Future[None]]] = []
        self.waiting = asyncio.Event()

    @property
    def aio(self) -> Any:
        return _ClaimAwaitingItsOwnReply(super().aio, self.replies, self.waiting)


async def test_an_operation_whose_caller_left_is_kept_until_it_ends_and_is_undone() -> None:
    """The loop holds its tasks weakly. A claim whose cancelled caller has left, waiting on a reply
    only the claim holds, is kept until it ends (not collected while pending, its claim left to
    run out its lease); when its reply comes, the claim lands and is released."""
    await _caller_leaves_then_the_claim_lands()


class _InterruptOfTheApplications(BaseException):
    """An interrupt of the application's own: any ``BaseException`` but a cancellation stops its caller."""


class _LedgerInterruptedInAnOperation(MemoryLedger):
    """A ledger one of whose operations an interrupt stops: a claim just after it landed (its answer
    lost), or a finishing write just before it is sent. With ``transient_first``, the operation's
    first attempt fails first with a transient error, and the interrupt comes in its retry."""

    transient_errors = (ConnectionError,)

    def __init__(self, operation: str, interrupt: type[BaseException], *, waits: bool, transient_first: bool) -> None:
        super().__init__()
        # Waiting, its async operations run as a waiting ledger's do: each in a task of its own.
        self.blocking_io = waits
        self.operation, self.interrupt, self.transient_first = operation, interrupt, transient_first
        self.attempts = 0

    def _interrupts(self, operation: str) -> bool:
        """Whether this attempt of ``operation`` is the one interrupted; raises for a first attempt
        that fails transiently. The writes made later, in the background, go through."""
        if operation != self.operation:
            return False
        self.attempts += 1
        if self.transient_first and self.attempts == 1:
            raise ConnectionError("the first attempt's connection was reset")
        return self.attempts == (2 if self.transient_first else 1)

    def claim(self, key: CallKey, **kwargs: Any) -> Any:
        interrupted = self._interrupts("claim")
        landed = super().claim(key, **kwargs)
        if interrupted:
            raise self.interrupt()  # after the claim landed: its answer is lost
        return landed

    def complete(self, key: CallKey, **kwargs: Any) -> Any:
        if self._interrupts("complete"):
            raise self.interrupt()
        return super().complete(key, **kwargs)


@pytest.mark.parametrize("mode", ["sync", "async-inline", "async-task"])
@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit, _InterruptOfTheApplications])
@pytest.mark.parametrize("transient_first", [False, True], ids=["first-attempt", "in-its-retry"])
@pytest.mark.parametrize(
    ("operation", "left"),
    [
        pytest.param("claim", lambda record: record is None, id="claim-released"),  # the call may run again
        pytest.param(
            "complete",
            lambda record: record is not None and record.status is Status.COMPLETED,
            id="complete-written-later",
        ),
    ],
)
def test_an_interrupt_inside_a_ledger_operation_leaves_nothing_running(
    operation: str,
    left: Callable[[Record | None], bool],
    transient_first: bool,
    interrupt: type[BaseException],
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The interrupt reaches the caller, and what the operation did, or may have done, is undone or
    made once, when its outcome is known: sync, async on a ledger that never waits (inline), and
    async in a task of its own. Before, an async call in a task left a landed claim running under
    its live owner until the lease ran out and lost a finished result, and neither path undid an
    operation interrupted in its retry."""
    ledger = _LedgerInterruptedInAnOperation(
        operation, interrupt, waits=mode == "async-task", transient_first=transient_first
    )
    key, runs, deferred = new_key(), [], []
    defer = _pending.pending_writes.defer

    def counted(effect: Any, ledger: Any, tool_name: str) -> None:
        deferred.append(type(effect).__name__)
        defer(effect, ledger, tool_name)

    monkeypatch.setattr(_pending.pending_writes, "defer", counted)

    def refund() -> str:
        runs.append(1)
        return "refunded"

    async def arefund() -> str:
        return refund()

    async def call_async() -> None:
        async with tool_call(*key):
            await replay_safe(ledger=ledger)(arefund)()

    loop = asyncio.new_event_loop()  # not asyncio.run(): the interrupt must leave the loop as it came

    def call() -> None:
        if mode == "sync":
            with tool_call(*key):
                replay_safe(ledger=ledger)(refund)()
        else:
            loop.run_until_complete(call_async())

    try:
        with pytest.raises(interrupt):
            call()
        record = settled(ledger, key, left)
        assert left(record), f"left {record.status if record else 'nothing'} after an interrupted {operation}"
        assert deferred == ["Release" if operation == "claim" else "Complete"]  # once
        assert ledger.attempts == (2 if transient_first else 1) + (operation == "complete")  # and the write kept
        assert runs == ([] if operation == "claim" else [1])
        if record is not None:
            assert record.result == '"refunded"'  # the result the tool returned, written after the interrupt
    finally:
        loop.close()


class _LoopTakingNoAttributesOfOurs(asyncio.SelectorEventLoop):
    """As an event loop written as an extension type (uvloop's) may: no attribute can be added."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == _drivers._KEPT:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        super().__setattr__(name, value)


def test_an_operation_whose_caller_left_is_kept_on_a_loop_that_takes_no_attributes() -> None:
    loop = _LoopTakingNoAttributesOfOurs()
    try:
        loop.run_until_complete(_caller_leaves_then_the_claim_lands())
    finally:
        loop.close()
    assert not _drivers._kept_by_no_loop  # and let go once ended


async def _caller_leaves_then_the_claim_lands() -> None:
    ledger, key, runs = _LedgerWithAClaimAwaitingItsOwnReply(), new_key(), []
    call = _refund_call(ledger, key, runs)
    caller = asyncio.create_task(call())
    await ledger.waiting.wait()
    caller.cancel()
    await asyncio.wait([caller])
    assert caller.cancelled()
    del caller  # with its error's traceback, which still names the claim's task
    gc.collect()
    reply = ledger.replies[0]()
    assert reply is not None, "the claim was collected while it waited, its outcome never undone"
    reply.set_result(None)
    record = await asyncio.to_thread(settled, ledger, key, lambda r: r is None)
    assert record is None and runs == []
    assert await call() == "refunded"  # released: the call runs when asked again
    assert runs == [1]


def test_an_operation_left_running_is_kept_by_its_loop_not_for_good() -> None:
    """A loop closed before such an operation ended (``run_until_complete`` then ``close()``, where
    ``asyncio.run`` would have cancelled it) is collected, the operation with it: it is not held
    for good, with its loop and whatever it holds."""
    ledger, runs = _LedgerWithAClaimAwaitingItsOwnReply(), []

    async def leave() -> None:
        caller = asyncio.create_task(_refund_call(ledger, new_key(), runs)())
        await ledger.waiting.wait()
        caller.cancel()
        await asyncio.wait([caller])

    loop = asyncio.new_event_loop()
    loop.run_until_complete(leave())
    loop.close()
    ledger.waiting = asyncio.Event()  # the first one was bound to the loop
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None, "a closed loop is held by an operation that never ended in it"
    assert ledger.replies[0]() is None and runs == []


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent,
    )


SIGINT_CHILD = """
    import signal
    import sys
    import replaysafe

    # Python raises KeyboardInterrupt on SIGINT unless it started with SIGINT ignored, as a job
    # started in the background by a shell without job control does (a CI script's, say).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    ledger = replaysafe.open_ledger(sys.argv[1])

    @replaysafe.replay_safe(ledger=ledger)
    def send_invite() -> str:
        print("ran", flush=True)
        return "sent"

    ledger.get(replaysafe.CallKey("warm", "up", "-"))  # connected: the next operation is the claim
    print("ready", flush=True)
    sys.stdin.readline()  # the parent stalls the ledger
    try:
        print("claiming", flush=True)
        with replaysafe.tool_call(sys.argv[2], "msg_1", "call_1"):
            send_invite()
        print("not interrupted", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    sys.stdin.readline()  # the owner stays alive while the parent looks at the record
"""


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_sigint_during_a_sync_claim_releases_it(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    with stalled_ledger(backend, request, tmp_path) as (ledger, stall, url):
        _sigint_during_the_claim(ledger, stall, url)


def _sigint_during_the_claim(ledger: Ledger, stall: Stall, url: str) -> None:
    key = new_key()
    child = _child(SIGINT_CHILD, url, key.thread_id)
    watchdog = threading.Timer(120, child.kill)  # a hung child ends the reads below: bounded
    watchdog.start()
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        stall.hold()
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "claiming"
        time.sleep(IN_FLIGHT)  # its claim is in flight, waiting on the stall
        child.send_signal(signal.SIGINT)
        time.sleep(IN_FLIGHT)
        stall.resume()  # the claim lands after the interrupt
        assert child.stdout.readline().strip() == "interrupted"  # KeyboardInterrupt reached the caller
        record = settled(ledger, key, lambda r: r is None)
        assert record is None, f"left {record.status} under a live owner" if record else ""
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0, child.stderr.read() if child.stderr else ""
    finally:
        watchdog.cancel()
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=60)  # and closes its pipes


@pytest.mark.parametrize("interrupt", [GeneratorExit, SystemExit, KeyboardInterrupt])
def test_a_tool_raising_an_interrupt_leaves_the_call_in_doubt(ledger: Ledger, interrupt: type[BaseException]) -> None:
    """Not an outcome: the side effect may have happened. The interrupt still reaches the caller."""
    key = new_key()

    @replay_safe(ledger=ledger)
    def tool() -> str:
        raise interrupt()

    with tool_call(*key), pytest.raises(interrupt):
        tool()
    record = ledger.get(key)
    assert record is not None and record.status is Status.IN_DOUBT


@pytest.mark.parametrize("interrupt", [GeneratorExit, SystemExit, KeyboardInterrupt])
async def test_an_async_tool_raising_an_interrupt_leaves_the_call_in_doubt(
    ledger: Ledger, interrupt: type[BaseException]
) -> None:
    key = new_key()

    @replay_safe(ledger=ledger)
    async def tool() -> str:
        raise interrupt()

    async with tool_call(*key):
        with pytest.raises(interrupt):
            await tool()
    record = ledger.get(key)
    assert record is not None and record.status is Status.IN_DOUBT
