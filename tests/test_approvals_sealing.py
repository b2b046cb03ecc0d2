"""Attacks on a signing ledger by someone who can write the store but has no signing key."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from replaysafe import (
    ApprovalRequiredError,
    CallKey,
    Status,
    TamperedRecordError,
    approvals,
    replay_safe,
    tool_call,
)

from .test_signing import signed  # noqa: F401  (the fixture)


def new_key() -> CallKey:
    return CallKey(f"thread-{uuid.uuid4().hex[:10]}", "msg_1", "call_1")


def test_a_sealed_approval_replayed_into_a_completed_record_is_not_spent_twice(signed: Any) -> None:  # noqa: F811
    """The store's writer saved the sealed paused record holding the approval (readable by anyone who can read
    the store), let the call run on it, then writes that saved status and text back over the completed record.
    The seal covers (key, tool, digest, status, text) only, not the attempt, so it checks: one approval, two
    executions. Secure: TamperedRecordError (or an ask for a new approval), never a second run."""
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
    try:
        with tool_call(*key):
            refund_order(30)
    except (TamperedRecordError, ApprovalRequiredError):
        pass
    assert made == [30], f"one approval, {len(made)} executions"
