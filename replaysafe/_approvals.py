"""Approvals as data: what an approver decided for one call, and what a call's record says of it.

No I/O. An approval lives in the record of the call it approves (a paused one): written there by a
compare-and-set of that record (``approve``/``reject``), checked against the call about to run, and
spent by the same compare-and-set that takes the call over to run it, so one approval runs the tool
at most once (docs/approvals.md). The record of a call that is not finished keeps this state as
text after ``STATE_PREFIX`` (sealed like the rest of the record on a signing ledger).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from ._records import CallKey

#: What a paused, running or in-doubt record's result holds when its call has approval state: this
#: prefix, then the state as JSON. Never read as a result: only a completed record's result is one.
STATE_PREFIX = "rs-state-1:"

Decision = Literal["approved", "rejected"]

#: How long an approval holds when ``approve`` is given no ``expires_in``.
DEFAULT_EXPIRY = timedelta(minutes=15)


@dataclasses.dataclass(frozen=True, slots=True)
class Approval:
    """An approver's decision on one call, bound to what the approver saw: its key, its tool and the
    digest of its arguments (``args``: the complete arguments approved instead, an edit)."""

    decision: Decision
    by: str
    at: datetime
    key: CallKey
    tool_name: str
    args_digest: str
    #: Until when an approval may be spent (``None`` for a rejection, which does not expire).
    expires_at: datetime | None = None
    #: An edit: the call runs with these arguments instead (JSON values, every parameter by name).
    args: Mapping[str, Any] | None = None
    #: Why it was rejected (the approver's words, shown to the caller).
    reason: str | None = None
    #: The attempt of the paused record it was written into: spent once that record has moved on.
    attempt: int | None = None

    def to_data(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "by": self.by,
            "at": self.at.isoformat(),
            "key": list(self.key),
            "tool_name": self.tool_name,
            "args_digest": self.args_digest,
            "expires_at": None if self.expires_at is None else self.expires_at.isoformat(),
            "args": None if self.args is None else dict(self.args),
            "reason": self.reason,
            "attempt": self.attempt,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Approval:
        expires = data.get("expires_at")
        args = data.get("args")
        decision = data["decision"]
        if decision not in ("approved", "rejected"):
            raise ValueError("an approval's decision is 'approved' or 'rejected'")
        if args is not None and not isinstance(args, dict):
            raise ValueError("an approval's edited arguments are a mapping")
        return cls(
            decision=decision,
            by=str(data["by"]),
            at=datetime.fromisoformat(data["at"]),
            key=CallKey(*(str(part) for part in data["key"])),
            tool_name=str(data["tool_name"]),
            args_digest=str(data["args_digest"]),
            expires_at=None if expires is None else datetime.fromisoformat(expires),
            args=args,
            reason=None if data.get("reason") is None else str(data["reason"]),
            attempt=None if data.get("attempt") is None else int(data["attempt"]),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class CallState:
    """What the record of a call that has not finished says of it, beside its status."""

    #: The tool name of each step its last execution made, in order.
    steps: tuple[str, ...] = ()
    #: The call runs only on an approval (it asked for one, or ran on one before).
    requested: bool = False
    #: The approver's decision, not yet spent.
    decision: Approval | None = None
    #: The approval the last attempt ran on (spent: it never runs the tool again).
    spent: Approval | None = None
    #: An attempt ran on an approval and did not finish: its side effect may have happened.
    may_have_run: bool = False
    #: The ids of the answers written as decisions on the call (``approve(answer=...)``), oldest first: an
    #: answer handed back again (a framework that replays its human's answer after a crash) decides nothing.
    answers: tuple[str, ...] = ()

    def text(self) -> str:
        data: dict[str, Any] = {"steps": list(self.steps), "requested": self.requested}
        if self.answers:
            data["answers"] = list(self.answers)
        if self.decision is not None:
            data["decision"] = self.decision.to_data()
        if self.spent is not None:
            data["spent"] = self.spent.to_data()
        if self.may_have_run:
            data["may_have_run"] = True
        return STATE_PREFIX + json.dumps(data, sort_keys=True, separators=(",", ":"))

    @property
    def plain(self) -> bool:
        """Whether it says nothing of approvals (steps at most: the older text says that much)."""
        return not (self.requested or self.decision or self.spent or self.may_have_run or self.answers)


def parse_state(text: str) -> CallState | None:
    """The state ``text`` (after ``STATE_PREFIX``) holds; ``None`` when it cannot be read."""
    try:
        data = json.loads(text[len(STATE_PREFIX) :])
        steps = data.get("steps", [])
        if not isinstance(steps, list) or not all(type(name) is str for name in steps):
            return None
        decision, spent = data.get("decision"), data.get("spent")
        answers = data.get("answers", [])
        if not isinstance(answers, list) or not all(type(answer) is str for answer in answers):
            return None
        return CallState(
            steps=tuple(steps),
            requested=bool(data.get("requested", False)),
            decision=None if decision is None else Approval.from_data(decision),
            spent=None if spent is None else Approval.from_data(spent),
            may_have_run=bool(data.get("may_have_run", False)),
            answers=tuple(answers),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def edited_arguments(args: object) -> dict[str, Any]:
    """``approve(args=...)`` checked: a mapping of parameter names to JSON values, copied."""
    if not isinstance(args, Mapping) or not all(isinstance(name, str) for name in args):
        raise TypeError("approve(args=...) takes the complete arguments by parameter name: a dict with str keys")
    try:
        text = json.dumps(dict(args), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        raise TypeError(
            "approve(args=...) takes JSON values only (str, int, float, bool, None, lists and dicts of them): the "
            "edit is stored in the ledger and handed to the tool as decoded JSON"
        ) from None
    copied: dict[str, Any] = json.loads(text)
    return copied


def expiry(expires_in: float | timedelta) -> timedelta:
    """``approve(expires_in=...)`` checked: seconds or a ``timedelta``, positive and finite."""
    length = expires_in if isinstance(expires_in, timedelta) else None
    if length is None:
        if isinstance(expires_in, bool) or not isinstance(expires_in, (int, float)) or not math.isfinite(expires_in):
            raise TypeError("approve(expires_in=...) takes seconds or a timedelta: an approval always expires")
        length = timedelta(seconds=expires_in)
    if length <= timedelta(0):
        raise ValueError("approve(expires_in=...) must be positive")
    return length


# --- the check of an approval against the call about to run ----------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """Why an approval does not let this call run: ``reason`` is ``mismatch``, ``expired``, ``rejected``,
    ``missing`` or ``spent``; ``what`` says which part differs (a mismatch)."""

    reason: Literal["mismatch", "expired", "rejected", "missing", "spent"]
    what: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Granted:
    """The approval lets this call run; ``args``: the edit it runs with instead of the arguments given."""

    approval: Approval
    args: Mapping[str, Any] | None
    #: The digest the call is recorded under from then on: that of the arguments it was asked with.
    args_digest: str


def check(
    approval: Approval | None,
    *,
    key: CallKey,
    tool_name: str,
    args_digest: str,
    now: datetime,
    digest_of: Callable[[Mapping[str, Any]], str] | None,
    attempt: int | None = None,
) -> Granted | Refusal:
    """Whether ``approval`` lets the call ``key`` of ``tool_name``, with arguments of digest ``args_digest``,
    run at ``now``, from the paused record of attempt ``attempt``. An edit lets run the call as it was asked
    (it then runs with the edit) or the call asked with the edit itself; any other arguments, another tool
    or another key are a mismatch."""
    if approval is None:
        return Refusal("missing")
    if approval.attempt is not None and attempt is not None and approval.attempt != attempt:
        return Refusal("spent")
    if approval.decision == "rejected":
        return Refusal("rejected")
    if approval.key != key:
        return Refusal("mismatch", "it approved another call key")
    if approval.tool_name != tool_name:
        return Refusal("mismatch", f"it approved the tool {approval.tool_name!r}")
    if approval.expires_at is not None and now >= approval.expires_at:
        return Refusal("expired")
    if approval.args is None:
        if args_digest != approval.args_digest:
            return Refusal("mismatch", f"it approved arguments of digest {approval.args_digest[:12]}")
        return Granted(approval, None, args_digest)
    if digest_of is None:
        return Refusal("mismatch", "it approved edited arguments, which this tool cannot check")
    try:
        edited = digest_of(approval.args)
    except Exception:  # the edit does not bind to the tool's parameters
        return Refusal("mismatch", "its edited arguments do not fit the tool's parameters")
    # The call keeps the identity it was asked with: its replays are asked the same way.
    if args_digest == approval.args_digest:
        return Granted(approval, approval.args, args_digest)  # asked as first asked: runs with the edit
    if args_digest == edited:
        return Granted(approval, None, args_digest)  # asked with the edit itself
    return Refusal("mismatch", f"it approved edited arguments of digest {edited[:12]}")
