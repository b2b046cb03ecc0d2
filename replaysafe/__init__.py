"""replaysafe: stop AI agents from repeating side effects after a crash."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._codec import JsonSerializer, Serializer
from ._config import set_default_ledger
from ._context import CallInfo, current_call, tool_call
from ._decorator import replay_safe
from ._errors import (
    ArgumentDigestError,
    CallInDoubtError,
    CallInProgressError,
    LedgerError,
    MissingCallIdError,
    RecordedToolError,
    ReplayMismatchError,
    ReplaySafeError,
    ReplaySafeWarning,
    ResultEncodingError,
    UnprotectedCallWarning,
)
from ._identity import idempotency_key
from ._records import CallKey, ClaimResult, Record, Status
from .ledgers import Ledger, MemoryLedger, open_ledger

if TYPE_CHECKING:
    from .ledgers.sqlite import SqliteLedger

__all__ = [
    "ArgumentDigestError",
    "CallInDoubtError",
    "CallInProgressError",
    "CallInfo",
    "CallKey",
    "ClaimResult",
    "JsonSerializer",
    "Ledger",
    "LedgerError",
    "MemoryLedger",
    "MissingCallIdError",
    "Record",
    "RecordedToolError",
    "ReplayMismatchError",
    "ReplaySafeError",
    "ReplaySafeWarning",
    "ResultEncodingError",
    "Serializer",
    "SqliteLedger",
    "Status",
    "UnprotectedCallWarning",
    "current_call",
    "idempotency_key",
    "open_ledger",
    "replay_safe",
    "set_default_ledger",
    "tool_call",
]


def __getattr__(name: str) -> object:
    # SQLAlchemy is imported only when a SQL ledger is first used.
    if name == "SqliteLedger":
        from .ledgers.sqlite import SqliteLedger

        return SqliteLedger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
