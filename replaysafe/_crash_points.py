"""The points of a protected call where ``replaysafe crashtest`` kills its child process.

Nobody watches (the hot path reads one global), or the crash test's child does: it is told
each point a call reaches, with the call's key, and SIGKILLs itself at the one it was asked to.

- ``before``: the call is about to be claimed (nothing of it is in the ledger yet);
- ``decided``: a human's decision on the call (an approval or a rejection) is written, and the call
  has not run on it (``replaysafe.approvals``): a run killed here leaves the decision to its resume;
- ``inside``: the tool's body has started, or has just made a side effect it marks
  (``replaysafe.testing.side_effect``): told by the crash test's own event handler and marker;
- ``after-return``: the tool has ended (returned, or raised an error that is recorded, or paused)
  and its outcome is about to be written;
- ``after-record``: the outcome is written.
"""

from __future__ import annotations

from collections.abc import Callable

from ._core import Claim, Complete, LedgerOp, Takeover
from ._records import CallKey, Status

BEFORE = "before"
DECIDED = "decided"
INSIDE = "inside"
AFTER_RETURN = "after-return"
AFTER_RECORD = "after-record"
#: Every point, in the order a call reaches them.
POINTS = (BEFORE, DECIDED, INSIDE, AFTER_RETURN, AFTER_RECORD)

#: Told ``(point, key, tool name, status written)`` (the status a ``Complete`` writes: ``completed``,
#: ``failed``, ``paused``; ``None`` before a claim): ``None`` unless a crash test's child watches.
Watcher = Callable[[str, CallKey, str, "str | None"], None]
watcher: Watcher | None = None


def before(op: LedgerOp, tool_name: str) -> None:
    """``op`` is about to be made (called only while someone watches)."""
    watching = watcher
    if watching is None:
        return
    if type(op) is Claim:
        watching(BEFORE, op.key, tool_name, None)
    elif type(op) is Complete:
        watching(AFTER_RETURN, op.key, tool_name, op.status.value)


def after(op: LedgerOp, tool_name: str) -> None:
    """``op`` was made (called only while someone watches)."""
    watching = watcher
    if watching is None:
        return
    if type(op) is Complete:
        watching(AFTER_RECORD, op.key, tool_name, op.status.value)
    elif type(op) is Takeover and op.status is Status.PAUSED and op.record.status is Status.PAUSED:
        # A paused record taken over to stay paused: a decision written into it (``approvals.decide``). Named by
        # the record's tool: the decision is driven under the approver's name.
        watching(DECIDED, op.key, op.record.tool_name, op.status.value)
