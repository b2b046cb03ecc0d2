"""Fork safety: a forked child gets its own pools, threads, locks, clients and owner token.

Each test really forks. The child does its work, sends what it saw to the parent
through a pipe and leaves with ``os._exit`` (no pytest teardown runs in it).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import select
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from replaysafe import CallKey, Ledger, PostgresLedger, RedisLedger, SqliteLedger, Status, replay_safe, tool_call
from replaysafe._owners import _process_start, owner_token
from replaysafe.ledgers._sql import Step

# Python 3.12+ warns that forking a process with threads may deadlock: that is what is tested here.
pytestmark = pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")


def in_child(work: Callable[[], Any], *, within: float = 60.0) -> Any:
    """Run ``work`` in a forked child; its return value (JSON) or its error, back in the parent."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            os.close(reader)
            try:
                reply = {"value": work()}
            except BaseException as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(writer, json.dumps(reply, default=str).encode())
        finally:
            os._exit(0)
    os.close(writer)
    received = b""
    deadline = time.monotonic() + within
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([reader], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"the forked child did not answer within {within:g}s")
            chunk = os.read(reader, 65536)
            if not chunk:
                break
            received += chunk
    finally:
        os.close(reader)
        os.waitpid(pid, 0)
    reply = json.loads(received)
    if "error" in reply:
        raise AssertionError(f"in the forked child: {reply['error']}")
    return reply["value"]


def new_thread_id() -> str:
    return f"fork-{uuid.uuid4().hex[:8]}"


def test_a_forked_child_runs_sync_tools_in_its_own_worker_pool(durable_ledger: Ledger) -> None:
    """Off the main thread, a sync tool with a timeout runs in the worker pool; the child's pool works.

    The parent's pool has a thread already; a child that reused the pool would queue
    the tool for a thread that does not exist in it and wait out the timeout.
    """
    runs: list[str] = []

    @replay_safe(ledger=durable_ledger, timeout=20)
    def send_invitation(to: str) -> str:
        runs.append(to)
        return f"invited {to} from {os.getpid()}"

    def call_off_main_thread(thread_id: str) -> str:
        result: list[str] = []

        def call() -> None:
            with tool_call(thread_id, "msg_1", "call_1"):
                result.append(send_invitation("ada"))

        caller = threading.Thread(target=call)
        caller.start()
        caller.join(timeout=40)
        assert result, "the tool did not return"
        return result[0]

    assert call_off_main_thread(new_thread_id()) == f"invited ada from {os.getpid()}"  # the pool exists now

    thread_id = new_thread_id()

    def child() -> dict[str, Any]:
        result = call_off_main_thread(thread_id)
        record = durable_ledger.get(CallKey(thread_id, "msg_1", "call_1"))
        return {"result": result, "pid": os.getpid(), "status": record.status.value if record else None}

    seen = in_child(child)
    assert seen["result"] == f"invited ada from {seen['pid']}"
    assert seen["status"] == Status.COMPLETED.value
    # The child's record is in the ledger the parent opened: a replay here returns it.
    with tool_call(thread_id, "msg_1", "call_1"):
        assert send_invitation("ada") == seen["result"]
    assert runs == ["ada"]  # the parent ran it once (first call); the replay did not run it


def test_a_forked_child_has_its_own_owner_token() -> None:
    """A child claims under its own pid and start time, never under its parent's."""
    parent = owner_token()
    seen = in_child(lambda: {"token": owner_token(), "pid": os.getpid(), "start": _process_start(os.getpid())})
    machine, pid, rest = seen["token"].split(":")
    start = rest.partition("#")[0]
    assert (int(pid), start) == (seen["pid"], seen["start"])
    assert parent.split(":")[:3] != seen["token"].split(":")[:3]
    assert parent.split(":")[0] == machine
    assert pid != str(os.getpid())


def _connection_ids(ledger: Ledger, loop: asyncio.AbstractEventLoop) -> list[Any]:
    """The server's id of the sync connection and of the async one of ``loop``; for SQLite, the id of
    the sync connection's object."""
    if isinstance(ledger, RedisLedger):
        # Asked where the ledger's operations go: its held connections, not the client's pool.
        sync_id = ledger._commands.execute_command("CLIENT ID")

        async def async_id() -> Any:
            return await ledger.aio._client().execute_command("CLIENT ID")  # type: ignore[attr-defined]

    elif isinstance(ledger, PostgresLedger):
        backend_pid = Step("SELECT pg_backend_pid()", (), lambda rows, count: rows[0][0])  # type: ignore[index]
        sync_id = ledger.run(backend_pid)

        async def async_id() -> Any:
            return await ledger.aio._run(backend_pid)  # type: ignore[attr-defined]

    else:
        assert isinstance(ledger, SqliteLedger)
        connection = ledger._connections.take()  # the one the next operation runs on (SQLite has no server id)
        ledger._connections.give_back(connection)
        return [id(connection)]
    return [sync_id, loop.run_until_complete(async_id())]


def test_a_forked_child_uses_the_ledger_its_parent_opened(durable_ledger: Ledger) -> None:
    """Sync and async, on connections of its own: the parent's stay the parent's.

    The parent has used the ledger from both sides (a pooled connection, an asyncio
    client of an event loop) before the fork; the child uses the same ledger object,
    and the same event loop object, then the parent goes on with its connections.
    """
    runs: list[str] = []

    @replay_safe(ledger=durable_ledger, timeout=None)
    def refund(order: str) -> str:
        runs.append(order)
        return f"refunded {order} in {os.getpid()}"

    @replay_safe(ledger=durable_ledger, timeout=None)
    async def arefund(order: str) -> str:
        runs.append(order)
        return f"refunded {order} in {os.getpid()}"

    async def acall(thread_id: str, order: str) -> str:
        with tool_call(thread_id, "msg_1", "call_1"):
            return await arefund(order)

    def call(thread_id: str, order: str) -> str:
        with tool_call(thread_id, "msg_1", "call_1"):
            return refund(order)

    loop = asyncio.new_event_loop()
    try:
        parent_sync, parent_async = new_thread_id(), new_thread_id()
        first = call(parent_sync, "1042")
        afirst = loop.run_until_complete(acall(parent_async, "1043"))
        parent_ids = _connection_ids(durable_ledger, loop)
        child_sync, child_async = new_thread_id(), new_thread_id()

        def child() -> dict[str, Any]:
            before = len(runs)
            return {
                "replayed": [call(parent_sync, "1042"), loop.run_until_complete(acall(parent_async, "1043"))],
                "ran": [call(child_sync, "2001"), loop.run_until_complete(acall(child_async, "2002"))],
                "new_runs": runs[before:],
                "ids": _connection_ids(durable_ledger, loop),
                "pid": os.getpid(),
            }

        seen = in_child(child)
        assert seen["replayed"] == [first, afirst]
        assert seen["ran"] == [f"refunded 2001 in {seen['pid']}", f"refunded 2002 in {seen['pid']}"]
        assert seen["new_runs"] == ["2001", "2002"]
        for parent_id, child_id in zip(parent_ids, seen["ids"], strict=True):
            assert parent_id != child_id  # the child connected afresh
        # The parent's connections still serve the parent, and it sees the child's records.
        assert _connection_ids(durable_ledger, loop) == parent_ids
        assert call(child_sync, "2001") == seen["ran"][0]
        assert loop.run_until_complete(acall(child_async, "2002")) == seen["ran"][1]
        assert runs == ["1042", "1043"]
    finally:
        aclose = getattr(durable_ledger, "aclose", None)
        if aclose is not None:
            loop.run_until_complete(aclose())
        loop.close()


def _renewed_while_running(ledger: Ledger, thread_id: str) -> bool:
    """Run a tool with a 0.6 s lease until its stored lease has moved forward (True), or 15 s (False)."""
    key = CallKey(thread_id, "msg_1", "call_1")

    @replay_safe(ledger=ledger, lease=0.6, timeout=None)
    def long_task() -> bool:
        first = ledger.get(key)
        assert first is not None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            now = ledger.get(key)
            assert now is not None
            if now.lease_expires_at > first.lease_expires_at:
                return True
            time.sleep(0.05)
        return False

    with tool_call(*key):
        return long_task()


def test_a_forked_child_closes_none_of_its_parents_connections(durable_ledger: Ledger) -> None:
    """What a child inherits of its parent's connections (the ledger's own, its engine's) is the
    parent's: never closed in the child, not even collected there, which closes them (sqlite3 warns
    of it from Python 3.13: seen for the SQLite engine's connection before it was kept)."""
    key = CallKey(new_thread_id(), "msg_1", "call_1")
    assert durable_ledger.get(key) is None  # the parent's connections opened (and a SQL ledger's table made)

    def child() -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert durable_ledger.get(key) is None  # on connections of the child's own
            gc.collect()
        return [f"{w.category.__name__}: {w.message}" for w in caught if issubclass(w.category, ResourceWarning)]

    assert in_child(child) == []
    assert durable_ledger.get(key) is None  # the parent's still serve it


def test_a_forked_child_renews_its_own_leases(durable_ledger: Ledger) -> None:
    """The parent's renewer thread does not exist in a child: the child starts its own."""
    assert _renewed_while_running(durable_ledger, new_thread_id())  # the parent's renewer thread runs now
    assert in_child(lambda: _renewed_while_running(durable_ledger, new_thread_id())) is True


def test_one_ledger_that_cannot_reset_in_a_child_does_not_stop_the_others() -> None:
    """Every ledger of the process resets in a forked child, even when one of them fails to: the others
    must not keep the parent's lock or sockets. (The failure is logged, naming the ledger's type.)"""
    from replaysafe import MemoryLedger

    class Unresettable(MemoryLedger):
        def _forget_parent(self) -> None:
            raise RuntimeError("cannot reset")

    class Resetting(MemoryLedger):
        reset = False

        def _forget_parent(self) -> None:
            super()._forget_parent()
            self.reset = True

    # Many beside the one that fails: whatever order the child visits them in, some come after it.
    broken = Unresettable()
    resetting = [Resetting() for _ in range(20)]
    seen = in_child(lambda: [ledger.reset for ledger in resetting])
    assert seen == [True] * len(resetting)
    assert broken is not None  # kept alive (registered weakly) until the child has forked


def test_a_stream_made_before_a_fork_is_claimed_by_the_process_that_reads_it(memory_ledger: Ledger) -> None:
    """A sync stream is planned when it is made and claimed when it is first read: made in the
    parent and read in a forked child, its claim is the child's, so that the child's death shows
    (a claim under the parent's token would look alive for as long as the parent runs)."""
    key = CallKey(f"thread-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")

    @replay_safe(ledger=memory_ledger)
    def lines() -> Iterator[str]:
        yield "a"
        yield "b"

    with tool_call(*key):
        chunks = lines()

    def read() -> dict[str, Any]:
        assert list(chunks) == ["a", "b"]
        record = memory_ledger.get(key)
        assert record is not None and record.status is Status.COMPLETED
        return {"owner": record.owner, "pid": os.getpid()}

    seen = in_child(read)
    assert seen["owner"].split(":")[1] == str(seen["pid"])
    assert seen["pid"] != os.getpid()
