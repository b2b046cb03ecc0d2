"""Ledgers: where protected calls are claimed and recorded.

Backends with heavier imports (SQLAlchemy, psycopg, redis) load on first use.
"""

from __future__ import annotations

import importlib
import urllib.parse
from typing import TYPE_CHECKING, Any

from ._protocol import AsyncLedger, Ledger, LedgerBase, LedgerFault, OffloadedAsyncLedger, RetryPolicy
from .memory import MemoryLedger

if TYPE_CHECKING:
    from .postgres import PostgresLedger
    from .redis import RedisLedger
    from .sqlite import SqliteLedger

__all__ = [
    "AsyncLedger",
    "Ledger",
    "LedgerBase",
    "LedgerFault",
    "MemoryLedger",
    "OffloadedAsyncLedger",
    "PostgresLedger",
    "RedisLedger",
    "RetryPolicy",
    "SqliteLedger",
    "open_ledger",
]

# Lazily imported backends: class name -> module.
_BACKENDS = {"SqliteLedger": "sqlite", "PostgresLedger": "postgres", "RedisLedger": "redis"}
# URL scheme -> class name.
_SCHEMES = {
    "sqlite": "SqliteLedger",
    "postgres": "PostgresLedger",
    "postgresql": "PostgresLedger",
    "redis": "RedisLedger",
    "rediss": "RedisLedger",
    "unix": "RedisLedger",
}


def open_ledger(url: str, **options: Any) -> Ledger:
    """The ledger a URL names.

    ``memory://``, ``sqlite:///path/to/file.db``, ``postgresql://user@host/db`` (also
    ``postgresql+psycopg://``) and ``redis://host:6379/0``. Options go in the query
    string (``?table=...&schema=...&prefix=...&ttl=...&connect_timeout=...&io_timeout=...``) or as
    keyword arguments, which win; an option the ledger and its driver do not know is an error.
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower().partition("+")[0]
    if scheme == "memory":
        return MemoryLedger(**options)
    name = _SCHEMES.get(scheme)
    if name is None:
        raise ValueError(
            f"no ledger for the URL {_redact(url)!r}: expected memory://, sqlite:///path/to/ledger.db, "
            "postgresql://user@host/db or redis://host:6379/0"
        )
    backend: Any = getattr(importlib.import_module(f".{_BACKENDS[name]}", __name__), name)
    # Each backend reads its own options from the URL's query string (an unknown one is an error).
    ledger: Ledger = backend(url, **options)
    return ledger


def _redact(url: str) -> str:
    """The URL without its password, for messages."""
    head, sep, rest = url.partition("://")
    if "@" in rest:
        credentials, _, host = rest.rpartition("@")
        user = credentials.partition(":")[0]
        return f"{head}{sep}{user}:***@{host}"
    return url


def __getattr__(name: str) -> object:
    if name in _BACKENDS:
        return getattr(importlib.import_module(f".{_BACKENDS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
