"""replaysafe for the Model Context Protocol: a tool call over MCP runs once, and its key travels in ``_meta``.

Client side (the official ``mcp`` SDK): ``session = replay_safe_session(session, ledger=ledger)``;
``session.call_tool(...)`` inside ``tool_call(...)`` is claimed, keyed and recorded.
Server side (``fastmcp``): ``FastMCP(name, middleware=[ReplaySafeMiddleware(ledger)])``; a keyed
``tools/call`` runs once per key. fastmcp is imported only when the middleware is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._client import (
    META_KEY,
    CallToolResultSerializer,
    ReplaySafeSession,
    ToolResultError,
    in_doubt_default,
    replay_safe_session,
)

if TYPE_CHECKING:
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


def __getattr__(name: str) -> object:
    # The middleware needs fastmcp, an extra: a client-only user need not install it.
    if name == "ReplaySafeMiddleware":
        from ._server import ReplaySafeMiddleware

        return ReplaySafeMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
