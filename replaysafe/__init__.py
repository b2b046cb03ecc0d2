"""replaysafe: stop AI agents from repeating side effects after a crash."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import approvals
from ._codec import JsonSerializer, Serializer
from ._config import register_pause, set_default_ledger, set_default_timeouts
from ._context import CallInfo, InDoubt, current_call, current_call_or_none, node, tool_call
from ._core import RERUN, LateResult
from ._decorator import is_replay_safe, replay_safe
from ._errors import (
    CONTROL_ERRORS,
    ApprovalExpiredError,
    ApprovalMismatchError,
    ApprovalRejectedError,
    ApprovalRequiredError,
    ArgumentDigestError,
    CallInDoubtError,
    CallInProgressError,
    InvalidCallIdError,
    LedgerError,
    MissingCallIdError,
    NoCurrentCallError,
    RecordedToolError,
    RecordUnreadableError,
    ReplayMismatchError,
    ReplaySafeError,
    ReplaySafeWarning,
    ResultEncodingError,
    TamperedRecordError,
    ToolTimeoutError,
    UnprotectedCallWarning,
)
from ._events import Event, EventKind, on_event
from ._identity import idempotency_key
from ._otel import instrument_opentelemetry
from ._records import CallKey, ClaimResult, Record, Status, Undone
from ._shapes import ResultShape
from ._undo import aundo
from .ledgers import Ledger, MemoryLedger, open_ledger, register_ledger

if TYPE_CHECKING:
    __version__: str
    from .ledgers.postgres import PostgresLedger
    from .ledgers.redis import RedisLedger
    from .ledgers.sqlite import SqliteLedger
    from .ledgers.tiered import TieredLedger

__all__ = [
    "ApprovalExpiredError",
    "ApprovalMismatchError",
    "ApprovalRejectedError",
    "ApprovalRequiredError",
    "ArgumentDigestError",
    "CONTROL_ERRORS",
    "CallInDoubtError",
    "CallInProgressError",
    "CallInfo",
    "CallKey",
    "ClaimResult",
    "Event",
    "EventKind",
    "InDoubt",
    "InvalidCallIdError",
    "JsonSerializer",
    "LateResult",
    "Ledger",
    "LedgerError",
    "MemoryLedger",
    "MissingCallIdError",
    "NoCurrentCallError",
    "PostgresLedger",
    "RERUN",
    "Record",
    "RecordUnreadableError",
    "RecordedToolError",
    "RedisLedger",
    "ReplayMismatchError",
    "ReplaySafeError",
    "ReplaySafeWarning",
    "ResultEncodingError",
    "ResultShape",
    "Serializer",
    "SqliteLedger",
    "Status",
    "TamperedRecordError",
    "TieredLedger",
    "ToolTimeoutError",
    "Undone",
    "UnprotectedCallWarning",
    "approvals",
    "aundo",
    "current_call",
    "current_call_or_none",
    "idempotency_key",
    "instrument_opentelemetry",
    "is_replay_safe",
    "node",
    "on_event",
    "open_ledger",
    "register_ledger",
    "register_pause",
    "replay_safe",
    "set_default_ledger",
    "set_default_timeouts",
    "tool_call",
]

# Tracebacks and reprs name the public path (replaysafe.CallInDoubtError), not the private module that
# defines the class. Exceptions and warnings only: other classes' paths are part of argument digests and
# stored results, which must not change.
for _public in [globals().get(name) for name in __all__]:
    if isinstance(_public, type) and issubclass(_public, (ReplaySafeError, ReplaySafeWarning)):
        _public.__module__ = __name__
del _public


#: The distribution whose version ``replaysafe.__version__`` is.
_DISTRIBUTION = "replaysafe-tools"


def __getattr__(name: str) -> object:
    if name == "__version__":  # read from the installed distribution, when first asked for
        from importlib.metadata import version

        return version(_DISTRIBUTION)
    # SQLAlchemy, psycopg and redis are imported only when their ledger is first used.
    if name in ("PostgresLedger", "RedisLedger", "SqliteLedger", "TieredLedger"):
        from . import ledgers

        return getattr(ledgers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
