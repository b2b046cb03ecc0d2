"""replaysafe for CrewAI: a finished tool call is not run again when a crew or a flow is resumed.

``replay_safe_crew(crew, ledger=...)`` wraps the tools of a crew's agents and tasks (``replay_safe_tools``
wraps a list of tools). CrewAI hands a tool only its arguments, so the adapter also wraps the one place that
holds the model's tool call, ``AgentExecutor._execute_single_native_tool_call``: a call is keyed by
``(the Flow's persisted id or thread_id=, a digest of the assistant message, the provider's call id)``.
"""

from __future__ import annotations

from ._calls import MISSING_IDS_FIX, NativeCall, current_native_call
from ._tools import ThreadId, replay_safe_crew, replay_safe_tool, replay_safe_tools

__all__ = [
    "MISSING_IDS_FIX",
    "NativeCall",
    "ThreadId",
    "current_native_call",
    "replay_safe_crew",
    "replay_safe_tool",
    "replay_safe_tools",
]
