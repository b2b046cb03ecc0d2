"""The takeover that spends an approval (or asks a reconciler) lands, but its reply is lost with a transient
error, so the ledger operation is tried again: the retried compare-and-set no longer matches (it landed) and
answers ``None``. The approval still runs only what it approved, at most once, and is not lost before the run.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from replaysafe import (
    ApprovalRequiredError,
    CallKey,
    Ledger,
    Status,
    approvals,
    replay_safe,
    tool_call,
)
from replaysafe.ledgers._protocol import LedgerFault


def new_key() -> CallKey:
    return CallKey(f"thread-{uuid.uuid4().hex[:10]}", "msg_1", "call_1")


class LostReply(ConnectionError):
    """The connection dropped after the server ran the statement: its reply is lost (transient)."""


class Interrupted(BaseException):
    """The worker stops inside the tool (a crash, a cancel): the call is left in doubt."""


class LosesTheSpendingReply:
    """``ledger``, but the first takeover that spends an approval (RUNNING, with a state text) lands on the
    real ledger and then raises a transient error, as a connection reset after COMMIT does."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def diagnose(self, exc: BaseException) -> LedgerFault:
        if isinstance(exc, LostReply):
            return LedgerFault(True, "a lost reply")
        return self._ledger.diagnose(exc)  # type: ignore[attr-defined,no-any-return]

    def takeover(self, record: Any, **kwargs: Any) -> Any:
        taken = self._ledger.takeover(record, **kwargs)
        if not self.lost and kwargs.get("status") is Status.RUNNING and kwargs.get("result") is not None:
            self.lost += 1
            raise LostReply("connection reset by peer (after the statement ran)")
        return taken


def test_needs_approval_a_lost_spend_reply_does_not_lose_the_approval(ledger: Ledger) -> None:
    """The tool did not run: the approval must still let it run once (or still be in the record)."""
    lossy = LosesTheSpendingReply(ledger)
    made: list[int] = []

    @replay_safe(ledger=lossy, needs_approval=True)  # type: ignore[arg-type]
    def refund_order(amount: int) -> str:
        made.append(amount)
        return f"re_{amount}"

    key = new_key()
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order(30)
    approvals.approve(key, by="ana", ledger=ledger)
    try:
        with tool_call(*key):
            refund_order(30)
    except ApprovalRequiredError:
        pass
    assert lossy.lost == 1
    # Secure: either it ran once on the approval, or the approval is still there to spend.
    if made != [30]:
        with tool_call(*key):
            assert refund_order(30) == "re_30", "the approval was lost before the tool ran"
    assert made == [30]


def test_plain_pause_with_edit_a_lost_spend_reply_never_runs_the_unapproved_arguments(ledger: Ledger) -> None:
    """An approver edits 82000 down to 10. The spend's reply is lost: the retry must not run 82000."""

    class NeedsHuman(Exception):
        pass

    lossy = LosesTheSpendingReply(ledger)
    made: list[int] = []
    first = [True]

    @replay_safe(ledger=lossy, pause_on=NeedsHuman)  # type: ignore[arg-type]
    def refund_order(amount: int) -> str:
        if first[0]:
            first[0] = False
            raise NeedsHuman()
        made.append(amount)
        return f"re_{amount}"

    key = new_key()
    with tool_call(*key), pytest.raises(NeedsHuman):
        refund_order(82000)
    approvals.approve(key, by="ana", args={"amount": 10}, ledger=ledger)
    try:
        with tool_call(*key):
            refund_order(82000)
    except Exception:
        pass
    assert lossy.lost == 1
    assert 82000 not in made, f"ran arguments the approver never approved: {made}"


def test_plain_pause_a_lost_spend_reply_then_a_crash_never_reruns_on_one_approval(ledger: Ledger) -> None:
    """After the lost reply the tool runs (as 'our own record', with no approval attached to the run) and
    crashes: in doubt. Under the default rerun policy it must ask for a new decision, not run again."""

    class NeedsHuman(Exception):
        pass

    lossy = LosesTheSpendingReply(ledger)
    made: list[int] = []
    plan = iter(["pause", "crash", "ok", "ok"])

    @replay_safe(ledger=lossy, pause_on=NeedsHuman)  # type: ignore[arg-type]
    def refund_order(amount: int) -> str:
        step = next(plan)
        if step == "pause":
            raise NeedsHuman()
        made.append(amount)
        if step == "crash":
            raise Interrupted()
        return f"re_{amount}"

    key = new_key()
    with tool_call(*key), pytest.raises(NeedsHuman):
        refund_order(30)
    approvals.approve(key, by="ana", ledger=ledger)
    with tool_call(*key), pytest.raises(Interrupted):
        refund_order(30)
    assert lossy.lost == 1 and made == [30]
    record = ledger.get(key)
    assert record is not None and record.status is Status.IN_DOUBT
    try:
        with tool_call(*key):
            refund_order(30)
    except ApprovalRequiredError:
        pass
    assert made == [30], f"one approval, {len(made)} executions"


class LosesATakeoverReply(LosesTheSpendingReply):
    """Loses the reply of the first takeover to RUNNING that carries a state text (the spend, or the takeover
    of a gated in-doubt call to ask its reconciler)."""


def test_needs_approval_in_doubt_reconciler_takeover_reply_lost_keeps_may_have_run(ledger: Ledger) -> None:
    """A needs_approval call ran on an approval and stopped in doubt; its reconciler is asked through a
    takeover (RUNNING, state carried). That takeover's reply is lost and retried: the call must not forget
    that its side effect may have happened: the takeover is found to have landed, and its reconciler is asked."""
    asked_reconciler: list[int] = []

    def reconciler(call: Any) -> Any:
        asked_reconciler.append(call.attempt)
        return "found-at-provider"

    made: list[int] = []
    plan = iter(["crash", "ok"])

    @replay_safe(ledger=ledger, needs_approval=True, in_doubt=reconciler, name="refund_order")
    def refund_order_direct(amount: int) -> str:
        made.append(amount)
        if next(plan) == "crash":
            raise Interrupted()
        return f"re_{amount}"

    key = new_key()
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order_direct(30)
    approvals.approve(key, by="ana", ledger=ledger)
    with tool_call(*key), pytest.raises(Interrupted):
        refund_order_direct(30)
    assert made == [30]
    record = ledger.get(key)
    assert record is not None and record.status is Status.IN_DOUBT

    lossy = LosesATakeoverReply(ledger)

    @replay_safe(ledger=lossy, needs_approval=True, in_doubt=reconciler, name="refund_order")  # type: ignore[arg-type]
    def refund_order(amount: int) -> str:
        made.append(amount)
        return f"re_{amount}"

    with tool_call(*key):
        assert refund_order(30) == "found-at-provider"  # the takeover landed: its reconciler was asked
    assert asked_reconciler == [3]  # about the attempt in doubt: asked 1, approved 2, ran 3
    assert lossy.lost == 1
    assert made == [30]


class LosesAnyTakeoverReply(LosesTheSpendingReply):
    """Loses the reply of the first takeover, whatever it carries (a plain in-doubt takeover too)."""

    def takeover(self, record: Any, **kwargs: Any) -> Any:
        taken = self._ledger.takeover(record, **kwargs)
        if not self.lost:
            self.lost += 1
            raise LostReply("connection reset by peer (after the statement ran)")
        return taken


def test_a_plain_in_doubt_takeover_whose_reply_is_lost_still_asks_its_reconciler(ledger: Ledger) -> None:
    """No approval involved: an in-doubt call taken over to ask its reconciler, the takeover's reply lost and
    its retry answering "changed". The takeover landed: the reconciler is asked and the tool does not run
    (read as a fresh claim of its own, the call used to run the tool without asking)."""
    asked: list[int] = []

    def reconciler(call: Any) -> Any:
        asked.append(call.attempt)
        return "found-at-provider"

    made: list[int] = []

    @replay_safe(ledger=ledger, name="refund_order")
    def first_run(amount: int) -> str:
        made.append(amount)
        raise Interrupted()

    key = new_key()
    with tool_call(*key), pytest.raises(Interrupted):
        first_run(30)
    lossy = LosesAnyTakeoverReply(ledger)

    @replay_safe(ledger=lossy, in_doubt=reconciler, name="refund_order")  # type: ignore[arg-type]
    def refund_order(amount: int) -> str:
        made.append(amount)
        return "ran again"

    with tool_call(*key):
        assert refund_order(30) == "found-at-provider"
    assert (asked, made, lossy.lost) == ([1], [30], 1)
