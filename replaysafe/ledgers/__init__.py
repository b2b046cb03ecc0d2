"""Ledgers: where protected calls are claimed and recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._protocol import AsyncLedger, Ledger, LedgerBase, OffloadedAsyncLedger, RetryPolicy
from .memory import MemoryLedger

if TYPE_CHECKING:
    from .sqlite import SqliteLedger

__all__ = [
    "AsyncLedger",
    "Ledger",
    "LedgerBase",
    "MemoryLedger",
    "OffloadedAsyncLedger",
    "RetryPolicy",
    "SqliteLedger",
    "open_ledger",
]


def open_ledger(url: str) -> Ledger:
    """The ledger a URL names: ``memory://`` or ``sqlite:///path/to/file.db``."""
    scheme = url.partition(":")[0].lower()
    if url.startswith("memory://"):
        return MemoryLedger()
    if scheme == "sqlite" or scheme.startswith("sqlite+"):
        from .sqlite import SqliteLedger

        return SqliteLedger(url)
    raise ValueError(f"no ledger for the URL {_redact(url)!r}: expected memory:// or sqlite:///path/to/ledger.db")


def _redact(url: str) -> str:
    """The URL without its password, for messages."""
    head, sep, rest = url.partition("://")
    if "@" in rest:
        credentials, _, host = rest.rpartition("@")
        user = credentials.partition(":")[0]
        return f"{head}{sep}{user}:***@{host}"
    return url


def __getattr__(name: str) -> object:
    # Backends with heavier imports load on first use.
    if name == "SqliteLedger":
        from .sqlite import SqliteLedger

        return SqliteLedger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
