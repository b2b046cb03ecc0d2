"""Events and logs: what happened to each call, with its ids and never its data."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replaysafe import (
    CallKey,
    Event,
    EventKind,
    LedgerError,
    MemoryLedger,
    ReplayMismatchError,
    SqliteLedger,
    UnprotectedCallWarning,
    current_call,
    on_event,
    replay_safe,
    tool_call,
)
from replaysafe.ledgers import RetryPolicy

from .faults import drop_ledger_table, take_over_as_another_worker


def test_executed_replayed_mismatch_unprotected(memory_ledger: MemoryLedger, events: list[Event]) -> None:
    """Each outcome is one typed event naming the tool and the ids."""

    @replay_safe(ledger=memory_ledger)
    def refund_order(order_id: str) -> str:
        return "ok"

    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c")
    with tool_call(*key):
        refund_order("1")
    with tool_call(*key):
        refund_order("1")
    with tool_call(*key), pytest.raises(ReplayMismatchError):
        refund_order("2")
    with pytest.warns(UnprotectedCallWarning):
        refund_order("3")
    assert [e.kind for e in events] == [
        EventKind.STARTED,
        EventKind.EXECUTED,
        EventKind.REPLAYED,
        EventKind.MISMATCH,
        EventKind.UNPROTECTED,
    ]
    assert all(e.tool_name == "refund_order" for e in events)
    assert [e.key for e in events[:4]] == [key, key, key, key]
    assert events[0].attempt == events[1].attempt == 1
    assert events[1].duration is not None
    assert events[3].args_digest is not None


def test_unsubscribe_and_failing_handlers(memory_ledger: MemoryLedger, caplog: pytest.LogCaptureFixture) -> None:
    """A handler that raises is logged and never reaches the caller; unsubscribed handlers hear nothing."""
    heard: list[Event] = []

    def broken(event: Event) -> None:
        raise RuntimeError("metrics backend down")

    unsubscribe_broken = on_event(broken)
    unsubscribe = on_event(heard.append)

    @replay_safe(ledger=memory_ledger)
    def tool() -> int:
        return 1

    with caplog.at_level(logging.ERROR, logger="replaysafe"), tool_call("t", "m", "c1"):
        assert tool() == 1
    assert any("event handler" in r.getMessage() for r in caplog.records)
    unsubscribe()
    unsubscribe_broken()
    with tool_call("t", "m", "c2"):
        tool()
    assert [event.kind for event in heard] == [EventKind.STARTED, EventKind.EXECUTED]


def test_logs_carry_ids_never_arguments_or_results(
    memory_ledger: MemoryLedger, caplog: pytest.LogCaptureFixture
) -> None:
    """Log records have the ids as extra fields; the secret argument and result appear nowhere."""

    @replay_safe(ledger=memory_ledger)
    def charge(card_number: str) -> str:
        return "receipt-SECRET-RESULT"

    key = CallKey("t-logs", "m", "c")
    with caplog.at_level(logging.DEBUG, logger="replaysafe"):
        with tool_call(*key):
            charge("4111-SECRET-CARD")
        with tool_call(*key), pytest.raises(ReplayMismatchError):
            charge("4222-OTHER-CARD")
    assert caplog.records
    for record in caplog.records:
        text = record.getMessage() + repr(record.__dict__)
        assert "SECRET" not in text
        assert "OTHER-CARD" not in text
    mismatch = next(r for r in caplog.records if r.replaysafe_event == "mismatch")  # type: ignore[attr-defined]
    assert mismatch.replaysafe_thread_id == "t-logs"  # type: ignore[attr-defined]
    assert mismatch.replaysafe_tool_name == "charge"  # type: ignore[attr-defined]
    assert len(mismatch.replaysafe_args_digest) == 64  # type: ignore[attr-defined]


def test_executed_reaches_a_listener_that_subscribed_while_the_result_was_written() -> None:
    """Whether anyone listens for ``executed`` is asked once the result is written, not before:
    a listener subscribed meanwhile (here by the write itself) hears of it."""
    seen: list[Event] = []
    unsubscribe: list[Callable[[], None]] = []

    class SubscribingLedger(MemoryLedger):
        def complete(self, key: CallKey, **kwargs: Any) -> bool:
            unsubscribe.append(on_event(seen.append))
            return super().complete(key, **kwargs)

    @replay_safe(ledger=SubscribingLedger())
    def refund_order(order_id: str) -> str:
        return "ok"

    try:
        with tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c"):
            assert refund_order("1") == "ok"
    finally:
        for stop in unsubscribe:
            stop()
    assert [event.kind for event in seen] == [EventKind.EXECUTED]


def _drop_the_table(ledger: SqliteLedger) -> None:
    """The store loses its table (a real failure of the next write: SQLite's own error)."""
    drop_ledger_table(ledger.path)


def _taken_over_meanwhile(ledger: SqliteLedger) -> None:
    """An operator clears the running call and another worker claims it: this run's write is fenced off."""
    take_over_as_another_worker(ledger, current_call().key)


def _returns_too_much(ledger: SqliteLedger) -> None:
    """Nothing happens meanwhile: the tool's result is over its max_result_bytes (set below)."""


@pytest.mark.parametrize(
    ("meanwhile", "first", "recorded"),
    [
        (None, (), True),
        (_drop_the_table, (EventKind.LEDGER_ERROR,), False),
        # Its late result is kept beside the other worker's record, and said so.
        (_taken_over_meanwhile, (EventKind.DUPLICATE_DETECTED, EventKind.LATE_RESULT), False),
        (_returns_too_much, (EventKind.LEDGER_ERROR,), False),
    ],
    ids=["written", "the-write-failed", "taken-over", "too-large-to-store"],
)
def test_executed_says_whether_the_result_was_recorded(
    tmp_path: Path,
    events: list[Event],
    caplog: pytest.LogCaptureFixture,
    meanwhile: Callable[[SqliteLedger], None] | None,
    first: tuple[EventKind, ...],
    recorded: bool,
) -> None:
    """``executed`` is emitted whenever the tool returned (so it counts runs), and says whether its
    result is recorded: not when the write failed, the call was taken over while it ran, or the
    result was too large to store, after the event that says why."""
    ledger = SqliteLedger(tmp_path / "l.db", retry=RetryPolicy(attempts=1))
    limit = 4 if meanwhile is _returns_too_much else 1_000_000

    @replay_safe(ledger=ledger, max_result_bytes=limit)
    def refund_order(order_id: str) -> str:
        if meanwhile is not None:
            meanwhile(ledger)
        return "refunded"

    with caplog.at_level(logging.DEBUG, logger="replaysafe"), tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c"):
        assert refund_order("1") == "refunded"
    assert [event.kind for event in events] == [EventKind.STARTED, *first, EventKind.EXECUTED]
    executed = events[-1]
    assert executed.recorded is recorded
    assert executed.duration is not None
    assert ("not recorded" in executed.message) is not recorded
    assert "refund_order" in executed.message and executed.key is not None
    assert executed.key.thread_id in executed.message
    (logged,) = [r for r in caplog.records if getattr(r, "replaysafe_event", None) == "executed"]
    assert logged.replaysafe_recorded is recorded  # type: ignore[attr-defined]


def test_executed_is_emitted_before_a_fail_closed_write_error(tmp_path: Path, events: list[Event]) -> None:
    """Fail-closed, a failed write raises; the tool ran all the same, and ``executed`` says so first."""
    ledger = SqliteLedger(tmp_path / "l.db", retry=RetryPolicy(attempts=1))

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    def refund_order(order_id: str) -> str:
        _drop_the_table(ledger)
        return "refunded"

    with tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c"), pytest.raises(LedgerError) as raised:
        refund_order("1")
    assert raised.value.result == "refunded"
    assert [(event.kind, event.recorded) for event in events] == [
        (EventKind.STARTED, None),
        (EventKind.LEDGER_ERROR, None),
        (EventKind.EXECUTED, False),
    ]
