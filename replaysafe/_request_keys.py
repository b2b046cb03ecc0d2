"""The keys of a protected call's outgoing requests, and the one stamping of them that the httpx hooks
(``replaysafe.http``) and the requests adapter (``_http_requests``) share: below both, so neither imports
the other's module."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from ._context import CallInfo, RunningCall, current_call_or_none

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
