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

from ._context import CallInfo, RunningCall, current_call_or_none

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

#: The header the helpers set unless told another: Stripe's, Resend's, and the IETF draft's name.
HEADER = "Idempotency-Key"
#: The methods that get a key by default: the ones that create or change something and are not
#: idempotent by definition (PUT and DELETE are).
METHODS = frozenset({"POST", "PATCH"})


def _next_ordinal(call: CallInfo) -> int:
    # The counter lives on the execution's own CallInfo (the drivers make a new one for every
    # attempt, so ordinals restart at 1 on attempt 2 and it sends the same keys as attempt 1).
    # Every task and thread the tool starts sees that same object through its copy of the
    # context, so siblings share one counter, however many other calls key requests meanwhile.
    if not isinstance(call, RunningCall):
        raise TypeError(
            f"{call.tool_name} ({call.key}): request keys are numbered per execution of a protected call; "
            "pass the CallInfo of a running call (replaysafe.current_call()), or number the requests yourself "
            "with request_idempotency_key(call, n)."
        )
    return call.next_request_ordinal()


def request_idempotency_key(call: CallInfo, ordinal: int) -> str:
    """The key of the ``ordinal``-th keyed request (from 1) of ``call``: ``f"{call.idempotency_key}:{ordinal}"``.

    For a reconciler that asks the provider what a request of the dead attempt did. It never equals
    ``call.idempotency_key`` itself, which you may still hand to another client by hand.
    """
    if ordinal < 1:
        raise ValueError(f"request ordinals start at 1, got {ordinal}")
    return f"{call.idempotency_key}:{ordinal}"


def next_request_key() -> str | None:
    """The key of the next outgoing request of the current protected call; ``None`` outside one.

    Each call takes the next ordinal, exactly as the hooks do: use it for a client the hooks do not
    cover (``aiohttp``, an SDK's ``idempotency_key=`` option) inside a tool that makes several requests.
    """
    call = current_call_or_none()
    if call is None:
        return None
    return request_idempotency_key(call, _next_ordinal(call))


def _stamp(method: str, headers: MutableMapping[str, str], header: str, methods: frozenset[str]) -> None:
    """Add the key of the next request of the current protected call to ``headers``, if it needs one.

    The one implementation behind the httpx hooks (sync and async) and the requests adapter.
    """
    if method.upper() not in methods or header in headers:  # both clients' headers ignore case
        return
    key = next_request_key()
    if key is not None:
        headers[header] = key


def _settings(header: str, methods: Iterable[str]) -> tuple[str, frozenset[str]]:
    if not header or not isinstance(header, str):
        raise ValueError(f"header must be a non-empty header name, got {header!r}")
    chosen = frozenset(method.upper() for method in methods)
    if not chosen:
        raise ValueError("methods must name at least one HTTP method")
    return header, chosen


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
