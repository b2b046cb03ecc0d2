"""``ReplaySafeMiddleware``: the interceptor pair as ``create_agent`` middleware."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain.agents.middleware import AgentMiddleware, AgentState
from langgraph.prebuilt.tool_node import ToolCallRequest

from replaysafe import Ledger

from ._interceptor import AsyncExecute, Execute, InterceptorOptions, ReplaySafeInterceptor, ToolResult

if TYPE_CHECKING:
    from typing_extensions import Unpack


class ReplaySafeMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Makes the tool calls of a ``langchain.agents.create_agent`` agent replay-safe.

    Put it LAST in ``middleware=[...]``, after ``HumanInTheLoopMiddleware`` and any
    middleware that edits tool calls: the last one is the innermost, so it keys and
    records the call with its final arguments and never wraps a human review.
    The options are ``ReplaySafeInterceptor``'s, the same as ``replay_safe_tool_node``'s.
    """

    def __init__(self, ledger: Ledger | None, **options: Unpack[InterceptorOptions]) -> None:
        super().__init__()
        self.interceptor = ReplaySafeInterceptor(ledger, **options)

    def wrap_tool_call(self, request: ToolCallRequest, handler: Execute) -> ToolResult:
        return self.interceptor.wrap(request, handler)

    async def awrap_tool_call(self, request: ToolCallRequest, handler: AsyncExecute) -> ToolResult:
        return await self.interceptor.awrap(request, handler)
