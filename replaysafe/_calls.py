"""Each ledger operation effect as the ``Ledger`` method call it stands for.

Written once for both a sync ledger and its ``.aio``, whose methods return awaitables:
``CALLS[type(op)](target, op)``. This is the whole mapping from the protocol's plain
data to the storage interface.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._core import Claim, Complete, Get, Release, Renew, Takeover
from ._records import Status


def _claim(target: Any, op: Claim) -> Any:
    return target.claim(
        op.key,
        tool_name=op.tool_name,
        args_digest=op.args_digest,
        owner=op.owner,
        now=op.now,
        lease_expires_at=op.lease_expires_at,
    )


def _takeover(target: Any, op: Takeover) -> Any:
    if op.result is None and op.status is Status.RUNNING and op.args_digest is None:
        # A plain takeover, as every ledger has always taken it (a ledger of an earlier version too).
        return target.takeover(op.record, owner=op.owner, now=op.now, lease_expires_at=op.lease_expires_at)
    return target.takeover(
        op.record,
        owner=op.owner,
        now=op.now,
        lease_expires_at=op.lease_expires_at,
        status=op.status,
        result=op.result,
        args_digest=op.args_digest,
    )


def _complete(target: Any, op: Complete) -> Any:
    return target.complete(op.key, owner=op.owner, status=op.status, result=op.result, now=op.now)


def _release(target: Any, op: Release) -> Any:
    return target.release(op.key, owner=op.owner)


def _renew(target: Any, op: Renew) -> Any:
    return target.renew(op.key, owner=op.owner, lease_expires_at=op.lease_expires_at)


def _get(target: Any, op: Get) -> Any:
    return target.get(op.key)


#: Each operation effect as a call on a ``Ledger`` or on its ``AsyncLedger`` (``.aio``).
CALLS: dict[type, Callable[[Any, Any], Any]] = {
    Claim: _claim,
    Takeover: _takeover,
    Complete: _complete,
    Release: _release,
    Renew: _renew,
    Get: _get,
}
