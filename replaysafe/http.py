"""Idempotency keys on outgoing HTTP requests, added by themselves.

Inside a protected call, each ``POST`` and ``PATCH`` request gets an ``Idempotency-Key``
header: the call's ``idempotency_key`` plus the request's ordinal in this execution of the
tool (``rs-…:1``, ``rs-…:2``, …). Every attempt of an in-doubt call sends the same keys in
the same order, so a provider that dedupes by the header performs each request once::

    import httpx
    from replaysafe.http import add_idempotency_key, aadd_idempotency_key, IdempotencyKeyAdapter

    client = httpx.Client(event_hooks={"request": [add_idempotency_key]})
    aclient = httpx.AsyncClient(event_hooks={"request": [aadd_idempotency_key]})
    session = requests.Session(); session.mount("https://", IdempotencyKeyAdapter())

A request that already carries the header keeps it and takes no ordinal; outside a protected
call nothing is added. Another header name: ``idempotency_key_hook("X-Request-Id")``,
``aidempotency_key_hook(...)``, ``IdempotencyKeyAdapter(header=...)``. httpx and requests are
not dependencies of replaysafe: install the one you use. Importing ``replaysafe`` imports
neither, and this module imports ``requests`` only when ``IdempotencyKeyAdapter`` is first used.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

from ._request_keys import HEADER, METHODS, _settings, _stamp, next_request_key, request_idempotency_key

if TYPE_CHECKING:
    from ._http_requests import IdempotencyKeyAdapter

__all__ = [
    "HEADER",
    "METHODS",
    "IdempotencyKeyAdapter",
    "aadd_idempotency_key",
    "add_idempotency_key",
    "aidempotency_key_hook",
    "idempotency_key_hook",
    "next_request_key",
    "request_idempotency_key",
]


def idempotency_key_hook(header: str = HEADER, *, methods: Iterable[str] = METHODS) -> Callable[[Any], None]:
    """An httpx request event hook that keys requests with ``header`` (for ``httpx.Client``)."""
    name, chosen = _settings(header, methods)

    def add_key(request: Any) -> None:
        _stamp(request.method, request.headers, name, chosen)

    return add_key


def aidempotency_key_hook(
    header: str = HEADER, *, methods: Iterable[str] = METHODS
) -> Callable[[Any], Awaitable[None]]:
    """The async twin of :func:`idempotency_key_hook`, for ``httpx.AsyncClient``."""
    add_key = idempotency_key_hook(header, methods=methods)

    async def aadd_key(request: Any) -> None:
        add_key(request)

    return aadd_key


class OutgoingRequest(Protocol):
    """What the httpx hooks read and change of a request: an ``httpx.Request`` is one."""

    @property
    def method(self) -> str: ...

    @property
    def headers(self) -> MutableMapping[str, str]: ...


def add_idempotency_key(request: OutgoingRequest) -> None:
    """httpx request hook: ``httpx.Client(event_hooks={"request": [add_idempotency_key]})``."""
    _stamp(request.method, request.headers, HEADER, METHODS)


async def aadd_idempotency_key(request: OutgoingRequest) -> None:
    """httpx request hook: ``httpx.AsyncClient(event_hooks={"request": [aadd_idempotency_key]})``."""
    _stamp(request.method, request.headers, HEADER, METHODS)


def __getattr__(name: str) -> object:
    # requests is imported only when its adapter is asked for: an httpx user need not install it.
    if name == "IdempotencyKeyAdapter":
        from ._http_requests import IdempotencyKeyAdapter

        return IdempotencyKeyAdapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
