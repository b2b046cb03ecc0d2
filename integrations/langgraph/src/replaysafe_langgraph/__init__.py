"""replaysafe for LangGraph and LangChain agents: a finished tool call is not run again after a crash.

- ``replay_safe_tool_node(tools, ledger=...)``: a ``ToolNode`` for your ``StateGraph``.
- ``ReplaySafeMiddleware(ledger)``: for ``langchain.agents.create_agent`` (last in the list).
- ``ReplaySafeInterceptor(ledger)``: the ``.wrap`` / ``.awrap`` pair both are built on.
- ``ReplaySafeHumanInTheLoopMiddleware(interrupt_on, ledger=...)``: ``HumanInTheLoopMiddleware`` whose
  decisions are recorded as replaysafe approvals, bound to the call's key and arguments.

A call is keyed by (thread id, id of the ``AIMessage`` holding the call, tool call id).
"""

from __future__ import annotations

from replaysafe import InDoubt

from ._approvals import DEFAULT_APPROVER, ReplaySafeHumanInTheLoopMiddleware
from ._interceptor import PAUSES, InterceptorOptions, ReplaySafeInterceptor, replay_safe_tool_node, tool_error_handler
from ._keys import MessageIdFallback, ai_message_digest, call_key, find_ai_message, thread_id_of
from ._middleware import ReplaySafeMiddleware
from ._serializer import MessageSerializer

__all__ = [
    "DEFAULT_APPROVER",
    "PAUSES",
    "InDoubt",
    "InterceptorOptions",
    "MessageIdFallback",
    "MessageSerializer",
    "ReplaySafeHumanInTheLoopMiddleware",
    "ReplaySafeInterceptor",
    "ReplaySafeMiddleware",
    "ai_message_digest",
    "call_key",
    "find_ai_message",
    "replay_safe_tool_node",
    "thread_id_of",
    "tool_error_handler",
]
