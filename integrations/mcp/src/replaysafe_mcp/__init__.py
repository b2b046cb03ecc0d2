"""replaysafe for the Model Context Protocol: a tool call over MCP runs once, and its key travels in ``_meta``.

Client side (the official ``mcp`` SDK): ``session = replay_safe_session(session, ledger=ledger)``;
``session.call_tool(...)`` inside ``tool_call(...)`` is claimed, keyed and recorded.
Server side (``fastmcp``): ``FastMCP(name, middleware=[ReplaySafeMiddleware(ledger)])``; a keyed
``tools/call`` runs once per key.

Each name is imported when first used: the client side with the ``mcp`` SDK, the middleware with fastmcp (an
extra, which a client-only user need not install). So ``replaysafe ledger resolve`` loads the shape this
package records results in (``replaysafe_mcp._shape``, an entry point) without importing either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._client import (
        META_KEY,
        CallToolResultSerializer,
        ReplaySafeSession,
        ToolResultError,
        in_doubt_default,
        replay_safe_session,
    )
    from ._server import ReplaySafeMiddleware

__all__ = [
    "META_KEY",
    "CallToolResultSerializer",
    "ReplaySafeMiddleware",
    "ReplaySafeSession",
    "ToolResultError",
    "in_doubt_default",
    "replay_safe_session",
]

_CLIENT = frozenset(__all__) - {"ReplaySafeMiddleware"}


def __getattr__(name: str) -> object:
    if name in _CLIENT:
        from . import _client

        return getattr(_client, name)
    if name == "ReplaySafeMiddleware":
        from ._server import ReplaySafeMiddleware

        return ReplaySafeMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
