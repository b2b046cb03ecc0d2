"""Bounded I/O: a stalled server gives a ``LedgerError`` within the ledger's timeouts, never a hang.

Real stalls only: a throwaway Redis or PostgreSQL on a free port is frozen with
SIGSTOP (the kernel still accepts and acknowledges, so no TCP-level timeout
fires: only the ledger's own bounds can), and a TCP listener that accepts and
never answers. A generous guard (``GUARD`` seconds) turns a hang into a failure;
nothing here asserts how long a call took.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from replaysafe import LedgerError, PostgresLedger, RedisLedger, Status, replay_safe, tool_call
from replaysafe.ledgers import Ledger, RetryPolicy

from ..servers import PostgresServer, RedisServer, with_driver

#: Seconds after which a call that has not returned counts as hung (the bounds below are 1-2 s).
GUARD = 90.0
SHORT = {"connect_timeout": 2.0, "io_timeout": 1.0, "retry": RetryPolicy(attempts=2, max_seconds=0.2)}
T = TypeVar("T")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                # The ppid is the 2nd field after the parenthesised command name.
                if int((entry / "stat").read_text().rpartition(")")[2].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


@contextlib.contextmanager
def frozen(root: int) -> Iterator[None]:
    """The server process and its children (PostgreSQL's backends) stopped for the block, then continued."""
    os.kill(root, signal.SIGSTOP)  # first, so that it forks no new backend meanwhile
    pids = [root, *_children(root)]
    try:
        for pid in pids[1:]:
            with contextlib.suppress(ProcessLookupError):  # a backend that just exited
                os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module", params=["postgres", "postgres-asyncpg", "redis"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    """A throwaway server for this module's tests (each freezes it and lets it go again), and its
    ledger's URL (PostgreSQL's with ``.aio`` on either driver)."""
    try:
        started: Any = RedisServer() if request.param == "redis" else PostgresServer()
    except FileNotFoundError as exc:
        pytest.fail(f"cannot start a throwaway server: {exc}")
    started.start()
    yield started, with_driver(started.url, "asyncpg") if request.param == "postgres-asyncpg" else started.url
    started.destroy()


@pytest.fixture
def stalled(server: tuple[Any, str]) -> Iterator[tuple[Ledger, int]]:
    """A ledger with short timeouts on the throwaway server, warmed up, and the server's pid to freeze."""
    server, url = server
    if isinstance(server, PostgresServer):
        pid = int((server.data / "postmaster.pid").read_text().split()[0])
        schema = f"rs_{uuid.uuid4().hex[:12]}"
        ledger: Ledger = PostgresLedger(url, schema=schema, **SHORT)  # type: ignore[arg-type]
    else:
        assert server._process is not None
        pid = server._process.pid
        ledger = RedisLedger(url, prefix=f"rs-{uuid.uuid4().hex[:12]}", **SHORT)  # type: ignore[arg-type]
    ledger.check()  # the table exists and a pooled connection is open before the stall
    yield ledger, pid
    _settle(ledger)
    ledger.close()


def _settle(ledger: Ledger) -> None:
    """Wait (bounded) until no call of these tests is still ``running``.

    A claim whose answer was lost in the stall is released by a background write
    once the server runs again; closing the ledger before that would let the write
    reopen it afterwards.
    """
    deadline = time.monotonic() + GUARD
    while time.monotonic() < deadline:
        running = [r for r in ledger.records() if r.status is Status.RUNNING and r.key.thread_id.startswith("t-")]
        if not running:
            return
        time.sleep(0.05)


def _in_thread(call: Callable[[], T]) -> T:
    """``call()`` in a worker thread, failing the test if it does not return within GUARD."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(call).result(timeout=GUARD)
    except concurrent.futures.TimeoutError:
        pytest.fail(f"the call hung for {GUARD:g}s on a stalled server: no I/O bound applied")
    finally:
        pool.shutdown(wait=False)


def _ids() -> tuple[str, str, str]:
    return (f"t-{uuid.uuid4().hex[:8]}", "m", "c")


@pytest.mark.slow
def test_a_stopped_server_fails_a_sync_call_closed_within_the_bound(stalled: tuple[Ledger, int]) -> None:
    """SIGSTOPped server, on_ledger_error='raise': LedgerError (transient), the tool never runs."""
    ledger, pid = stalled
    runs: list[int] = []

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    def charge() -> str:
        runs.append(1)
        return "charged"

    def call() -> None:
        with tool_call(*_ids()), pytest.raises(LedgerError) as raised:
            charge()
        assert raised.value.transient

    with frozen(pid):
        _in_thread(call)
    assert runs == []


@pytest.mark.slow
def test_a_stopped_server_runs_a_sync_call_with_a_warning(
    stalled: tuple[Ledger, int], caplog: pytest.LogCaptureFixture
) -> None:
    """SIGSTOPped server, on_ledger_error='warn': the tool runs once, unprotected, with the warning."""
    ledger, pid = stalled
    runs: list[int] = []

    @replay_safe(ledger=ledger)
    def charge() -> str:
        runs.append(1)
        return "charged"

    def call() -> str:
        with tool_call(*_ids()):
            return charge()

    with caplog.at_level(logging.WARNING, logger="replaysafe"), frozen(pid):
        assert _in_thread(call) == "charged"
    assert runs == [1]
    assert any("WITHOUT replay protection" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
async def test_a_stopped_server_fails_an_async_call_closed_within_the_bound(
    stalled: tuple[Ledger, int],
) -> None:
    """The same on the async path, with this loop's connection open before the stall."""
    ledger, pid = stalled
    await ledger.acheck()  # type: ignore[attr-defined]  # opens this event loop's connection
    runs: list[int] = []

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    async def charge() -> str:
        runs.append(1)
        return "charged"

    async def call() -> None:
        async with tool_call(*_ids()):
            await charge()

    with frozen(pid), pytest.raises(LedgerError) as raised:
        await asyncio.wait_for(call(), GUARD)
    assert raised.value.transient
    assert runs == []


@pytest.mark.slow
async def test_a_stopped_server_runs_an_async_call_with_a_warning(
    stalled: tuple[Ledger, int], caplog: pytest.LogCaptureFixture
) -> None:
    ledger, pid = stalled
    await ledger.acheck()  # type: ignore[attr-defined]
    runs: list[int] = []

    @replay_safe(ledger=ledger)
    async def charge() -> str:
        runs.append(1)
        return "charged"

    async def call() -> str:
        async with tool_call(*_ids()):
            return await charge()

    with caplog.at_level(logging.WARNING, logger="replaysafe"), frozen(pid):
        assert await asyncio.wait_for(call(), GUARD) == "charged"
    assert runs == [1]
    assert any("WITHOUT replay protection" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_check_reports_a_stopped_server(stalled: tuple[Ledger, int]) -> None:
    """A readiness probe on a stalled server fails (transient) instead of hanging."""
    ledger, pid = stalled

    def probe() -> None:
        with pytest.raises(LedgerError) as raised:
            ledger.check()
        assert raised.value.transient

    with frozen(pid):
        _in_thread(probe)


# --- a listener that accepts and never answers ------------------------------------------


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port whose listener accepts connections and never sends a byte."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    accepted: list[socket.socket] = []
    stop = False

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop:
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept()[0])

    pool = concurrent.futures.ThreadPoolExecutor(1)
    pool.submit(accept)
    yield int(listener.getsockname()[1])
    stop = True
    pool.shutdown(wait=True)
    for conn in accepted:
        conn.close()
    listener.close()


def _silent_ledger(backend: str, port: int) -> Ledger:
    if backend.startswith("postgres"):
        driver = backend.partition("-")[2] or "psycopg"
        return PostgresLedger(f"postgresql+{driver}://root@127.0.0.1:{port}/test", **SHORT)  # type: ignore[arg-type]
    return RedisLedger(f"redis://127.0.0.1:{port}/0", **SHORT)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_a_silent_listener_fails_a_sync_call_within_the_bound(backend: str, silent_port: int) -> None:
    ledger = _silent_ledger(backend, silent_port)
    runs: list[int] = []

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    def charge() -> str:
        runs.append(1)
        return "charged"

    def call() -> None:
        with tool_call(*_ids()), pytest.raises(LedgerError) as raised:
            charge()
        assert raised.value.transient

    _in_thread(call)
    assert runs == []
    ledger.close()


@pytest.mark.parametrize("backend", ["postgres", "postgres-asyncpg", "redis"])
async def test_a_silent_listener_runs_an_async_call_with_a_warning(
    backend: str, silent_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = _silent_ledger(backend, silent_port)
    runs: list[int] = []

    @replay_safe(ledger=ledger)
    async def charge() -> str:
        runs.append(1)
        return "charged"

    async def call() -> str:
        async with tool_call(*_ids()):
            return await charge()

    with caplog.at_level(logging.WARNING, logger="replaysafe"):
        assert await asyncio.wait_for(call(), GUARD) == "charged"
    assert runs == [1]
    assert any("WITHOUT replay protection" in r.getMessage() for r in caplog.records)
    await ledger.aclose()  # type: ignore[attr-defined]
