"""``ReplaySafeMiddleware``: the interceptor pair as ``create_agent`` middleware."""

from __future__ import annotations

from typing import Any, Literal

from langchain.agents.middleware import AgentMiddleware, AgentState
from langgraph.prebuilt.tool_node import ToolCallRequest

from replaysafe import InDoubt, Ledger

from ._interceptor import AsyncExecute, Execute, ReplaySafeInterceptor, ToolResult
from ._keys import MessageIdFallback


class ReplaySafeMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Makes the tool calls of a ``langchain.agents.create_agent`` agent replay-safe.

    Put it LAST in ``middleware=[...]``, after ``HumanInTheLoopMiddleware`` and any
    middleware that edits tool calls: the last one is the innermost, so it keys and
    records the call with its final arguments and never wraps a human review.
    The options are ``ReplaySafeInterceptor``'s.
    """

    def __init__(
        self,
        ledger: Ledger | None,
        *,
        fallback_message_id: MessageIdFallback | None = None,
        on_missing_ids: Literal["warn", "raise"] = "warn",
        on_ledger_error: Literal["warn", "raise"] = "warn",
        timeout: float | None = None,
        in_doubt: InDoubt | None = None,
        lease: float | None = None,
        wait_timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.interceptor = ReplaySafeInterceptor(
            ledger,
            fallback_message_id=fallback_message_id,
            on_missing_ids=on_missing_ids,
            on_ledger_error=on_ledger_error,
            timeout=timeout,
            in_doubt=in_doubt,
            lease=lease,
            wait_timeout=wait_timeout,
        )

    def wrap_tool_call(self, request: ToolCallRequest, handler: Execute) -> ToolResult:
        return self.interceptor.wrap(request, handler)

    async def awrap_tool_call(self, request: ToolCallRequest, handler: AsyncExecute) -> ToolResult:
        return await self.interceptor.awrap(request, handler)
