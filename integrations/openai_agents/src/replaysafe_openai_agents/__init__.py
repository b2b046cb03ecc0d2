"""replaysafe for the OpenAI Agents SDK: a finished tool call is not run again when a run is resumed.

``replay_safe_agent(agent, ledger, thread_id=...)`` (or ``replay_safe_tool`` for one tool) wraps
each ``FunctionTool``'s ``on_invoke_tool``. A call is keyed by ``(thread id, Responses item id or
Chat Completions response id, tool_call_id)``; the SDK has no thread id, so the app supplies one.
A tool that needs approval has the SDK's answers recorded as bound, one-use replaysafe approvals.
"""

from __future__ import annotations

from ._approvals import SDK_APPROVER, Approver
from ._tools import ThreadId, call_key, context_field, group_id, message_id, replay_safe_agent, replay_safe_tool

__all__ = [
    "SDK_APPROVER",
    "Approver",
    "ThreadId",
    "call_key",
    "context_field",
    "group_id",
    "message_id",
    "replay_safe_agent",
    "replay_safe_tool",
]
