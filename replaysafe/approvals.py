"""Approvals: one-use capabilities bound to the call they approve.

A tool decorated with ``@replay_safe(needs_approval=True)`` runs each call only on an approval:
its first call is kept paused and raises ``ApprovalRequiredError``; ``approve(call, by=...)``
records the decision in the call's own record; the next call of the same key checks the approval
against the call about to run (its key, tool and argument digest, and the expiry) and spends it in
the same compare-and-set that takes the call over, so one approval runs the tool at most once.
A call that stopped in doubt after it ran on an approval is never run again on that approval: it
waits for a new decision. See docs/approvals.md.

```python
from replaysafe import approvals

try:
    refund_order("A1", 30)
except replaysafe.ApprovalRequiredError as asked:
    approvals.approve(asked.key, by="ana@example.com", expires_in=900)
refund_order("A1", 30)  # runs once, on that approval
```
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from . import _config, _drivers
from ._approvals import (
    DEFAULT_EXPIRY,
    Approval,
    Decision,
    edited_arguments,
    expiry,
)
from ._context import CallInfo
from ._core import call_state
from ._decorator import tool_of
from ._errors import (
    ApprovalExpiredError,
    ApprovalMismatchError,
    ApprovalRejectedError,
    ApprovalRequiredError,
    ReplaySafeError,
)
from ._records import CallKey, Record, Status
from ._sealing import unsealed
from .ledgers import Ledger

__all__ = [
    "DEFAULT_EXPIRY",
    "Approval",
    "ApprovalExpiredError",
    "ApprovalMismatchError",
    "ApprovalRejectedError",
    "ApprovalRequiredError",
    "aapprove",
    "approve",
    "ApprovalState",
    "areject",
    "arequest",
    "reject",
    "request",
    "state",
]

#: What names a call to decide: its key, the ``CallInfo`` of ``current_call()``, or the
#: ``ApprovalRequiredError`` it raised.
CallRef = CallKey | CallInfo | ReplaySafeError | tuple[str, str, str]


def approve(
    call: CallRef,
    *,
    by: str,
    expires_in: float | timedelta = DEFAULT_EXPIRY,
    args: Mapping[str, Any] | None = None,
    ledger: Ledger | None = None,
    answer: str | None = None,
) -> Record:
    """Approve the paused ``call``, as ``by``, for ``expires_in`` (seconds or a ``timedelta``; 15 minutes
    when left out). ``args``: an edit, the complete arguments (by parameter name, JSON values) the call
    runs with instead. Returns the call's record; ``LookupError`` when it has none, ``ValueError`` when it
    is not paused.

    ``answer``: an id of the human's answer this decision records, for a framework that hands the same
    answer back after a crash (LangGraph's ``interrupt()`` does). The call's record keeps the ids of the
    answers it was decided on until it finishes: given one of them again, ``approve`` decides nothing
    and returns the record as it is, so an answer never renews an approval that was spent or expired."""
    return _drivers.decide_by_hand(*_approval(call, by, expires_in, args, ledger, answer))


def reject(call: CallRef, *, by: str, reason: str, ledger: Ledger | None = None, answer: str | None = None) -> Record:
    """Reject the paused ``call``, as ``by``, for ``reason`` (shown to its caller as
    ``ApprovalRejectedError.reason``): it does not run on this decision. ``answer``: as for ``approve``."""
    return _drivers.decide_by_hand(*_rejection(call, by, reason, ledger, answer))


async def aapprove(
    call: CallRef,
    *,
    by: str,
    expires_in: float | timedelta = DEFAULT_EXPIRY,
    args: Mapping[str, Any] | None = None,
    ledger: Ledger | None = None,
    answer: str | None = None,
) -> Record:
    """``approve`` on the ledger's async operations."""
    return await _drivers.adecide_by_hand(*_approval(call, by, expires_in, args, ledger, answer))


async def areject(
    call: CallRef, *, by: str, reason: str, ledger: Ledger | None = None, answer: str | None = None
) -> Record:
    """``reject`` on the ledger's async operations."""
    return await _drivers.adecide_by_hand(*_rejection(call, by, reason, ledger, answer))


def request(
    call: CallRef, *, tool: Callable[..., Any], args: Mapping[str, Any], ledger: Ledger | None = None
) -> Record:
    """Keep ``call`` paused for a decision before it runs: for a framework that holds a tool call back for a
    human (its own approval flow), so that the answer, given with ``approve`` / ``reject``, is bound to the
    call. ``tool`` is the ``@replay_safe`` tool the call will run, ``args`` its arguments by parameter name
    (their digest is the tool's, as when it runs). Asked again for the same call: one request."""
    return _drivers.request_by_hand(*_requested(call, tool, args, ledger))


async def arequest(
    call: CallRef, *, tool: Callable[..., Any], args: Mapping[str, Any], ledger: Ledger | None = None
) -> Record:
    """``request`` on the ledger's async operations."""
    return await _drivers.arequest_by_hand(*_requested(call, tool, args, ledger))


def _requested(
    call: CallRef, tool: Callable[..., Any], args: Mapping[str, Any], ledger: Ledger | None
) -> tuple[Ledger, CallKey, str, str]:
    protected = tool_of(tool)
    if protected is None:
        raise TypeError(
            f"request(tool=...) takes the @replay_safe tool the call will run; {getattr(tool, '__qualname__', tool)!r} "
            "is not one"
        )
    if not isinstance(args, Mapping) or not all(isinstance(name, str) for name in args):
        raise TypeError("request(args=...) takes the call's arguments by parameter name: a mapping with str keys")
    key = _key_of(call)
    chosen = ledger or protected.ledger or _config.default_ledger()
    if chosen is None:
        raise ValueError(
            "no ledger to record the request in: pass ledger=, give the tool one, or set one with "
            "replaysafe.set_default_ledger() or REPLAYSAFE_LEDGER_URL"
        )
    return chosen, key, protected.spec.name, protected.digest_of(args)


@dataclasses.dataclass(frozen=True)
class ApprovalState:
    """What a call's record says of its approvals (``state``), its seal checked on a signing ledger."""

    #: The record's status (``paused`` while it waits for a decision).
    status: Status
    #: Its attempt: +1 at each decision and each run.
    attempt: int
    #: The call runs only on an approval (it asked for one, or ran on one).
    requested: bool
    #: The decision not yet spent, if any.
    decision: Approval | None
    #: The approval its last attempt ran on, if it has not finished since.
    spent: Approval | None
    #: Its last approved attempt did not finish: its side effect may have happened.
    may_have_run: bool

    @property
    def waiting(self) -> bool:
        """Whether it waits for its first decision: paused, asked, undecided, never run on an approval. A
        framework that hands its human's answer back after a restart records it only then, so one answer
        never approves a second run."""
        return (
            self.status is Status.PAUSED
            and self.requested
            and self.decision is None
            and self.spent is None
            and not self.may_have_run
        )


def state(call: CallRef, *, ledger: Ledger | None = None) -> ApprovalState | None:
    """What the record of ``call`` says of its approvals; ``None`` when it has no record. A finished call
    says nothing of them any more (``requested`` false)."""
    chosen, key = _ledger(ledger), _key_of(call)
    record = chosen.get(key)
    if record is None:
        return None
    text = unsealed(record.result) if chosen.sealer is None else chosen.sealer.open(record)
    found = call_state(record, text)
    return ApprovalState(
        record.status, record.attempt, found.requested, found.decision, found.spent, found.may_have_run
    )


Decided = tuple[Ledger, CallKey, Callable[[Record, datetime], Approval], "str | None"]


def _approval(
    call: CallRef,
    by: str,
    expires_in: float | timedelta,
    args: Mapping[str, Any] | None,
    ledger: Ledger | None,
    answer: str | None,
) -> Decided:
    """What ``approve`` decides, checked before anything is read: where, which call, and the approval."""
    key, length, edit = _key_of(call), expiry(expires_in), None if args is None else edited_arguments(args)
    return _ledger(ledger), key, _decided("approved", _approver(by), length, edit, None), _answer_id(answer)


def _rejection(call: CallRef, by: str, reason: str, ledger: Ledger | None, answer: str | None) -> Decided:
    key, approver = _key_of(call), _approver(by)
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("reject(reason=...) takes the approver's reason, a non-empty str")
    return _ledger(ledger), key, _decided("rejected", approver, None, None, reason), _answer_id(answer)


def _answer_id(answer: object) -> str | None:
    if answer is not None and (not isinstance(answer, str) or not answer):
        raise ValueError("answer= is the id of the human's answer (a framework's interrupt id): a non-empty str")
    return answer


def _decided(
    decision: Decision, by: str, length: timedelta | None, edit: Mapping[str, Any] | None, reason: str | None
) -> Callable[[Record, datetime], Approval]:
    """The approval of the record the approver decided on, made at ``now`` (the protocol's clock)."""

    def approval(record: Record, now: datetime) -> Approval:
        return Approval(
            decision=decision,
            by=by,
            at=now,
            key=record.key,
            tool_name=record.tool_name,
            args_digest=record.args_digest,
            expires_at=None if length is None else now + length,
            args=edit,
            reason=reason,
        )

    return approval


def _key_of(call: CallRef) -> CallKey:
    if isinstance(call, CallInfo):
        return call.key
    if isinstance(call, ReplaySafeError):
        if call.key is None:
            raise ValueError(f"{type(call).__name__} names no call (it has no key): pass the call's CallKey")
        return call.key
    if isinstance(call, tuple) and len(call) == 3 and all(isinstance(part, str) for part in call):
        return CallKey(*call)
    raise TypeError(
        "approvals take the call to decide as a CallKey (thread_id, message_id, tool_call_id), a CallInfo, "
        f"or the ApprovalRequiredError it raised; got {type(call).__name__}"
    )


def _approver(by: object) -> str:
    if not isinstance(by, str) or not by.strip():
        raise ValueError("by= names the approver (a user id or name): a non-empty str, kept with the decision")
    return by


def _ledger(ledger: Ledger | None) -> Ledger:
    chosen = ledger or _config.default_ledger()
    if chosen is None:
        raise ValueError(
            "no ledger to record the decision in: pass ledger=, or set one with replaysafe.set_default_ledger() "
            "or REPLAYSAFE_LEDGER_URL"
        )
    return chosen
