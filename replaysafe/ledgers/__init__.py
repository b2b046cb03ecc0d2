"""Ledgers: where protected calls are claimed and recorded.

Backends with heavier imports (SQLAlchemy, psycopg, redis) load on first use.
"""

from __future__ import annotations

import importlib
import re
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._options import redact as _redact
from ._protocol import AsyncLedger, Ledger, LedgerBase, LedgerFault, OffloadedAsyncLedger, RetryPolicy
from .memory import MemoryLedger

if TYPE_CHECKING:
    from .postgres import PostgresLedger
    from .redis import RedisLedger
    from .sqlite import SqliteLedger
    from .tiered import TieredLedger

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
    "TieredLedger",
    "open_ledger",
    "register_ledger",
]

#: Lazily imported backends: class name -> module.
_BACKENDS = {
    "SqliteLedger": "sqlite",
    "PostgresLedger": "postgres",
    "RedisLedger": "redis",
    "TieredLedger": "tiered",
}

#: Makes the ledger a URL names: ``factory(url, **options)``.
LedgerFactory = Callable[..., Ledger]

#: URL scheme -> factory; filled by ``register_ledger`` (the built-in schemes below too).
_registry: dict[str, LedgerFactory] = {}
# A scheme as RFC 3986 spells it, lower case; "+" is left out: it separates a driver (postgresql+psycopg).
_SCHEME = re.compile(r"[a-z][a-z0-9.-]*")


def register_ledger(scheme: str, factory: LedgerFactory, *, replace: bool = False) -> None:
    """Make ``open_ledger`` (and ``REPLAYSAFE_LEDGER_URL``) open ``scheme://...`` URLs with ``factory``.

    ``factory(url, **options)`` gets the whole URL and the keyword options given to
    ``open_ledger`` and returns the ledger. A URL's scheme is matched without case and
    without a ``+driver`` suffix. Registering a scheme that is already registered is an
    error unless ``replace=True``.
    """
    name = scheme.lower() if isinstance(scheme, str) else scheme
    if not isinstance(name, str) or not _SCHEME.fullmatch(name):
        raise ValueError(f"{scheme!r} is not a URL scheme: use letters, digits, '.' and '-', starting with a letter")
    if not callable(factory):
        raise TypeError(f"register_ledger({name!r}, ...) needs a callable factory(url, **options) -> Ledger")
    if name in _registry and not replace:
        raise ValueError(f"the URL scheme {name!r} already has a ledger: pass replace=True to replace it")
    _registry[name] = factory


def _lazy(class_name: str) -> LedgerFactory:
    """A factory that imports its backend (SQLAlchemy, psycopg, redis) only when a URL needs it."""

    def open_backend(url: str, **options: Any) -> Ledger:
        backend: Any = getattr(importlib.import_module(f".{_BACKENDS[class_name]}", __name__), class_name)
        # Each backend reads its own options from the URL's query string (an unknown one is an error).
        ledger: Ledger = backend(url, **options)
        return ledger

    return open_backend


def _memory(url: str, **options: Any) -> Ledger:
    return MemoryLedger(**options)


def _postgres(url: str, **options: Any) -> Ledger:
    """A ``PostgresLedger``, or with a ``cache`` option (``?cache=redis://…``) a ``TieredLedger`` in front of one."""
    query = urllib.parse.parse_qsl(url.partition("?")[2], keep_blank_values=True)
    if "cache" in options or any(name == "cache" for name, _ in query):
        # redis-py too, only then: a PostgreSQL ledger alone needs no Redis client installed.
        ledger: Ledger = importlib.import_module(".tiered", __name__).open_tiered(url, **options)
        return ledger
    return _lazy("PostgresLedger")(url, **options)


register_ledger("memory", _memory)
register_ledger("postgres", _postgres)
register_ledger("postgresql", _postgres)
for _scheme, _class_name in (
    ("sqlite", "SqliteLedger"),
    ("redis", "RedisLedger"),
    ("rediss", "RedisLedger"),
    ("unix", "RedisLedger"),
):
    register_ledger(_scheme, _lazy(_class_name))


def open_ledger(url: str, **options: Any) -> Ledger:
    """The ledger a URL names.

    ``memory://``, ``sqlite:///path/to/file.db``, ``postgresql://user@host/db`` (also
    ``postgresql+psycopg://``) and ``redis://host:6379/0``, and any scheme added with
    ``register_ledger``. ``postgresql://…?cache=<redis URL, percent-encoded>`` opens a
    ``TieredLedger``: PostgreSQL the truth, Redis a cache of finished records in front. Options go in the query string
    (``?table=...&schema=...&prefix=...&ttl=...&connect_timeout=...&io_timeout=...``) or as
    keyword arguments, which win; an option the ledger and its driver do not know is an error.
    """
    scheme = urllib.parse.urlsplit(url).scheme.lower().partition("+")[0]
    factory = _registry.get(scheme) or _installed(scheme, url)
    if factory is None:
        registered = ", ".join(f"{name}://" for name in sorted(_registry))
        raise ValueError(
            f"no ledger for the URL {_redact(url)!r}: its scheme {scheme!r} is not registered "
            f"(registered: {registered}). Fix the URL, or register a ledger for the scheme first: "
            f"replaysafe.register_ledger(scheme, factory) in the process, or an entry point of the group "
            f"{ENTRY_POINTS!r} in the package that provides it (every process then knows it, the replaysafe "
            "command's too)."
        )
    return factory(url, **options)


#: The entry point group that names a ledger for a URL scheme: ``scheme = "package.module:factory"``.
ENTRY_POINTS = "replaysafe.ledgers"


def _installed(scheme: str, url: str) -> LedgerFactory | None:
    """The factory an installed package names for ``scheme`` in the ``replaysafe.ledgers`` entry points,
    registered on first use (looked up only for a scheme not registered: the built-in ones cost nothing)."""
    if not _SCHEME.fullmatch(scheme):
        return None
    from importlib.metadata import entry_points

    points = sorted(entry_points(group=ENTRY_POINTS, name=scheme), key=lambda point: point.value)
    if not points:
        return None
    point = points[0]
    package = point.dist.name if point.dist is not None else "an unnamed package"
    if len({p.value for p in points}) > 1:
        others = ", ".join(p.dist.name if p.dist is not None else p.value for p in points)
        raise ValueError(
            f"the URL {_redact(url)!r}: its scheme {scheme!r} is named by more than one installed package "
            f"({others}) in the {ENTRY_POINTS!r} entry points. Uninstall all but one."
        )
    try:
        factory: LedgerFactory = point.load()
    except Exception as exc:
        raise ValueError(
            f"the URL {_redact(url)!r}: the ledger {package} declares for the scheme {scheme!r} ({point.value}) "
            f"does not load: {type(exc).__name__}: {exc}. Reinstall {package}, or check its dependencies."
        ) from exc
    register_ledger(scheme, factory, replace=True)
    return factory


def __getattr__(name: str) -> object:
    if name in _BACKENDS:
        return getattr(importlib.import_module(f".{_BACKENDS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
