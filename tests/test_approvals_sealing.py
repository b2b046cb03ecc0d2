"""Attacks on a signing ledger by someone who can write the store but has no signing key."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from replaysafe import (
    ApprovalRequiredError,
    CallKey,
    Event,
    EventKind,
    Status,
    approvals,
    on_event,
    replay_safe,
    tool_call,
)

from .test_signing import signed  # noqa: F401  (the fixture)


def new_key() -> CallKey:
    return CallKey(f"thread-{uuid.uuid4().hex[:10]}", "msg_1", "call_1")


def test_a_sealed_approval_replayed_into_a_completed_record_is_not_spent_twice(signed: Any) -> None:  # noqa: F811
    """The store's writer saved the sealed paused record holding the approval (readable by anyone who can read
    the store), let the call run on it, then writes that saved status and text back over the completed record.
    The seal checks (it covers key, tool, digest, status and text); the approval is bound to the attempt of the
    record it was written into, which has moved on: it asks for a new decision, and nothing runs."""
    ledger, tamper, _ = signed
    made: list[int] = []

    @replay_safe(ledger=ledger, needs_approval=True)
    def refund_order(amount: int) -> str:
        made.append(amount)
        return f"re_{amount}"

    key = new_key()
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order(30)
    approvals.approve(key, by="ana", ledger=ledger)
    saved = ledger.get(key)
    assert saved is not None and saved.status is Status.PAUSED
    with tool_call(*key):
        assert refund_order(30) == "re_30"
    assert made == [30]
    # Rolled back: only the status and the result, both copied from what the store held before.
    tamper(ledger, key, {"status": "paused", "result": saved.result})
    seen: list[Event] = []
    unsubscribe = on_event(seen.append)
    try:
        with tool_call(*key), pytest.raises(ApprovalRequiredError):
            refund_order(30)
    finally:
        unsubscribe()
    assert made == [30], f"one approval, {len(made)} executions"
    assert [(e.reason, e.approver) for e in seen if e.kind is EventKind.APPROVAL_REFUSED] == [("spent", "ana")]
