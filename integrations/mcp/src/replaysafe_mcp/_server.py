"""The server side: ``ReplaySafeMiddleware`` runs a keyed ``tools/call`` once, for a fastmcp server."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import mcp_types as mt
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import ToolResult
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS, REQUEST_TIMEOUT, CallToolResult

from replaysafe import (
    CallInDoubtError,
    CallInProgressError,
    InvalidCallIdError,
    Ledger,
    ReplayMismatchError,
    ResultEncodingError,
    replay_safe,
    tool_call,
)

from ._client import META_KEY, RESERVED_OPTIONS

# The thread id of a server's calls is this prefix plus the server's name: two servers sharing a ledger
# never collide, even when their clients send the same key. Its own key space: `replaysafe ledger resolve`
# knows a call under it records a CallToolResult (_shape).
from ._shape import THREAD_PREFIX


class ToolResultSerializer:
    """Records a fastmcp ``ToolResult`` as the ``CallToolResult`` it is sent as, and rebuilds it."""

    def dumps(self, value: Any, /) -> str:
        if not isinstance(value, ToolResult):
            raise ResultEncodingError(f"a fastmcp tool call records a ToolResult, not {type(value).__name__}")
        result = CallToolResult(
            content=value.content,
            structured_content=value.structured_content,
            is_error=value.is_error,
            _meta=value.meta,  # the field's alias: the protocol's name
        )
        return result.model_dump_json(by_alias=True)

    def loads(self, text: str, /) -> ToolResult:
        return ToolResult.from_mcp_result(CallToolResult.model_validate_json(text))


_SERIALIZER = ToolResultSerializer()
Execute = Callable[[MiddlewareContext[mt.CallToolRequestParams]], Awaitable[ToolResult]]


async def _execute(
    arguments: dict[str, Any],
    call_next: Execute,
    context: MiddlewareContext[mt.CallToolRequestParams],
) -> ToolResult:
    """The body the middleware protects: the rest of the server's tools/call chain."""
    return await call_next(context)


def request_key(context: MiddlewareContext[Any]) -> str | None:
    """The idempotency key in the request's ``_meta``, or ``None`` when the client sent none."""
    fastmcp_context = context.fastmcp_context
    request = fastmcp_context.request_context if fastmcp_context is not None else None
    meta: Mapping[str, Any] | None = request.meta if request is not None else None
    if not meta or META_KEY not in meta:
        return None
    key = meta[META_KEY]
    if not isinstance(key, str) or not key:
        raise MCPError(INVALID_PARAMS, f"_meta[{META_KEY!r}] must be a non-empty string")
    return key


class ReplaySafeMiddleware(Middleware):
    """fastmcp middleware: a ``tools/call`` carrying an idempotency key runs at most once per key.

    ``FastMCP("payments", middleware=[ReplaySafeMiddleware(ledger)])``. A call whose request
    ``_meta`` holds ``"io.replaysafe/idempotency-key"`` is claimed in the ledger under
    ``("mcp-server:<server name>", tool name, key)`` before the tool runs, and its result is
    recorded: a duplicate gets the recorded result without running the tool, and a duplicate
    arriving while the first still runs waits for it (``wait_timeout=``, then an MCP error).
    A call without the key runs as before. ``options`` are ``@replay_safe`` options
    (``in_doubt=``, ``wait_timeout=``, ``lease=``, ``record_errors=``...).
    """

    def __init__(self, ledger: Ledger | None, **options: Any) -> None:
        reserved = sorted(RESERVED_OPTIONS.intersection(options))
        if reserved:
            raise TypeError(f"ReplaySafeMiddleware(): {', '.join(reserved)} is set by the middleware itself")
        self.ledger = ledger
        self.options = options
        self._protected: dict[str, Callable[..., Awaitable[ToolResult]]] = {}

    def _protected_execute(self, tool_name: str) -> Callable[..., Awaitable[ToolResult]]:
        protected = self._protected.get(tool_name)
        if protected is None:
            protected = replay_safe(
                ledger=self.ledger,
                name=tool_name,
                exclude_args=("call_next", "context"),
                serializer=_SERIALIZER,
                on_missing_ids="raise",
                **self.options,
            )(_execute)
            self._protected[tool_name] = protected
        return protected

    async def on_call_tool(
        self,
        context: MiddlewareContext[mt.CallToolRequestParams],
        call_next: CallNext[mt.CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        key = request_key(context)
        if key is None or context.fastmcp_context is None:
            return await call_next(context)
        tool_name = context.message.name
        server = THREAD_PREFIX + context.fastmcp_context.fastmcp.name
        where = f"tools/call {tool_name!r} with idempotency key {key[:80]!r} on server {server!r}"
        try:
            # Shielded: a keyed call, once started, runs to its end and is recorded even when its client
            # disconnects (the transport cancels the request then), so that the client's retry gets the
            # record instead of a call left in doubt. The tool's own timeouts still apply.
            with anyio.CancelScope(shield=True):
                async with tool_call(server, tool_name, key, ledger=self.ledger):
                    protected = self._protected_execute(tool_name)
                    result = await protected(dict(context.message.arguments or {}), call_next, context)
        except CallInProgressError as error:
            raise MCPError(
                REQUEST_TIMEOUT,
                f"{where} is still running in another request and did not finish within the wait. "
                "Send the same call again later: it returns that request's result.",
            ) from error
        except CallInDoubtError as error:
            raise MCPError(
                INTERNAL_ERROR,
                f"{where} is in doubt: the server stopped while the tool ran, so its effect may have happened. "
                "An operator settles it (replaysafe ledger resolve); until then the call is refused.",
            ) from error
        except ReplayMismatchError as error:
            raise MCPError(
                INVALID_PARAMS,
                f"{where} was first sent with other arguments; a key stands for one call. Use a new key.",
            ) from error
        except InvalidCallIdError as error:
            raise MCPError(INVALID_PARAMS, f"{where}: the key is not a usable id ({error})") from error
        return result
