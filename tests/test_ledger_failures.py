"""Rule 7: real ledger failures (an unopenable file, a dropped table, a locked database)."""

from __future__ import annotations

import asyncio
import gc
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from replaysafe import CallKey, LedgerError, SqliteLedger, replay_safe, tool_call
from replaysafe.ledgers import RedisLedger, RetryPolicy

from .faults import drop_ledger_table
from .servers import free_port

IDS = ("thread-f", "msg_1", "call_1")


@pytest.fixture
def unreachable() -> RedisLedger:
    """A ledger whose server refuses connections (a transient fault): nothing listens on its port.

    A permanent fault (a missing directory, a bad URL) always raises: see test_misconfigured_ledgers.py.
    """
    return RedisLedger(f"redis://127.0.0.1:{free_port()}/0", retry=RetryPolicy(attempts=2, max_seconds=0.2))


def test_unreadable_ledger_runs_the_tool_with_a_warning(
    unreachable: RedisLedger, caplog: pytest.LogCaptureFixture
) -> None:
    """By default a failed claim runs the tool anyway: skipping a tool that never ran is worse."""
    runs: list[int] = []

    @replay_safe(ledger=unreachable)
    def refund_order(order_id: str) -> str:
        runs.append(1)
        return "refunded"

    with caplog.at_level(logging.WARNING, logger="replaysafe"), tool_call(*IDS):
        assert refund_order("1") == "refunded"
    assert runs == [1]
    (warning,) = [r for r in caplog.records if "WITHOUT replay protection" in r.getMessage()]
    assert "refund_order" in warning.getMessage()
    assert "thread-f" in warning.getMessage()
    assert "on_ledger_error='raise'" in warning.getMessage()


def test_unreadable_ledger_fails_closed_when_asked(unreachable: RedisLedger) -> None:
    """on_ledger_error='raise' raises LedgerError before the tool runs."""
    runs: list[int] = []

    @replay_safe(ledger=unreachable, on_ledger_error="raise")
    def refund_order(order_id: str) -> str:
        runs.append(1)
        return "refunded"

    with tool_call(*IDS), pytest.raises(LedgerError) as raised:
        refund_order("1")
    assert runs == []
    assert raised.value.key == CallKey(*IDS)
    assert raised.value.tool_name == "refund_order"
    assert "refund_order" in str(raised.value)
    assert "reachable" in str(raised.value)
    assert raised.value.transient


async def test_unreadable_ledger_fails_closed_for_an_async_tool(
    unreachable: RedisLedger, caplog: pytest.LogCaptureFixture
) -> None:
    """The async path: the claim's task hands its LedgerError to the caller, and asyncio logs no
    exception of that task as never retrieved (the caller raised it)."""
    runs: list[int] = []

    @replay_safe(ledger=unreachable, on_ledger_error="raise")
    async def refund_order(order_id: str) -> str:
        runs.append(1)
        return "refunded"

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        async with tool_call(*IDS):
            with pytest.raises(LedgerError) as raised:
                await refund_order("1")
        named = (raised.value.key, raised.value.tool_name)
        del raised  # its traceback holds the operation's task
        await asyncio.sleep(0)
        gc.collect()  # a task whose exception nobody retrieved is logged when collected
    assert runs == []
    assert named == (CallKey(*IDS), "refund_order")
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    await unreachable.aio.aclose()


def test_failed_record_write_logs_and_returns_the_result(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A record that cannot be written is logged as an error; the caller still gets the result."""
    ledger = SqliteLedger(tmp_path / "l.db", retry=RetryPolicy(attempts=1))

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str) -> str:
        drop_ledger_table(ledger.path)  # the store loses its table while the tool runs
        return "refunded"

    with caplog.at_level(logging.ERROR, logger="replaysafe"), tool_call(*IDS):
        assert refund_order("1") == "refunded"
    assert any("could not be written" in r.getMessage() and "refund_order" in r.getMessage() for r in caplog.records)


def test_failed_record_write_raises_with_the_result_when_fail_closed(tmp_path: Path) -> None:
    """Fail-closed: LedgerError says the tool ran and carries its result, so nothing is lost."""
    ledger = SqliteLedger(tmp_path / "l.db", retry=RetryPolicy(attempts=1))

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    def refund_order(order_id: str) -> dict[str, int]:
        drop_ledger_table(ledger.path)
        return {"refund_id": 7}

    with tool_call(*IDS), pytest.raises(LedgerError) as raised:
        refund_order("1")
    assert raised.value.result == {"refund_id": 7}


def test_transient_lock_is_retried(tmp_path: Path) -> None:
    """A database locked by another writer is retried, then the call is recorded."""
    ledger = SqliteLedger(tmp_path / "l.db", busy_timeout=0.01, retry=RetryPolicy(attempts=50, max_seconds=10))
    ledger.get(CallKey(*IDS))  # creates the file and table
    blocker = sqlite3.connect(ledger.path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")  # hold the write lock
    locked_out: list[str] = []

    class UnlockedAfterALockedClaim:
        """The real ledger; the writer lets go only once a claim has failed on its lock, so a retry is certain."""

        def __getattr__(self, name: str) -> Any:
            return getattr(ledger, name)

        def claim(self, key: CallKey, **kwargs: Any) -> Any:
            try:
                return ledger.claim(key, **kwargs)
            except ledger.transient_errors as exc:
                locked_out.append(type(exc).__name__)
                blocker.rollback()
                raise

    @replay_safe(ledger=UnlockedAfterALockedClaim())
    def tool() -> str:
        return "ran"

    with tool_call(*IDS):
        assert tool() == "ran"
    assert len(locked_out) == 1
    record = ledger.get(CallKey(*IDS))
    assert record is not None
    assert record.result == '"ran"'
    blocker.close()


def test_a_sqlite_replay_needs_no_write_lock(tmp_path: Path) -> None:
    """A replay only reads: another writer holding the file's write lock neither delays nor fails it.
    (A first call still needs that lock: the same ledger fails one, so the lock is really held.)"""
    ledger = SqliteLedger(tmp_path / "l.db", busy_timeout=0.01, retry=RetryPolicy(attempts=1))
    runs: list[str] = []

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    def refund_order(order_id: str) -> dict[str, int]:
        runs.append(order_id)
        return {"refund_id": 7}

    with tool_call(*IDS):
        refund_order("1")
    blocker = sqlite3.connect(ledger.path, isolation_level=None, check_same_thread=False)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # hold the write lock
        with tool_call(*IDS):
            assert refund_order("1") == {"refund_id": 7}
        assert runs == ["1"]
        with tool_call(IDS[0], "msg_2", "call_1"), pytest.raises(LedgerError):
            refund_order("2")
        assert runs == ["1"]
    finally:
        blocker.rollback()
        blocker.close()
        ledger.close()


async def test_async_tool_does_not_block_the_event_loop_on_sqlite(tmp_path: Path) -> None:
    """While the claim waits on a locked file, the loop runs the task that unlocks it."""
    ledger = SqliteLedger(tmp_path / "l.db", busy_timeout=5)
    ledger.get(CallKey(*IDS))
    blocker = sqlite3.connect(ledger.path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    async def tool() -> str:
        return "ran"

    async def unlock_soon() -> float:
        await asyncio.sleep(0.1)  # only runs if the claim did not block the loop
        blocker.rollback()
        return time.monotonic()

    async def call() -> str:
        async with tool_call(*IDS):
            return await tool()

    result, _ = await asyncio.gather(call(), unlock_soon())
    assert result == "ran"
    record = ledger.get(CallKey(*IDS))
    assert record is not None
    assert record.result == '"ran"'
    blocker.close()
