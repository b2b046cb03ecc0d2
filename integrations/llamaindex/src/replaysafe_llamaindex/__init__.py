"""replaysafe for LlamaIndex agents: a finished tool call is not run again when a workflow is resumed.

``replay_safe_agent(agent, ledger=...)`` returns a copy of a ``FunctionAgent``, ``ReActAgent`` or
``AgentWorkflow`` whose ``call_tool`` step runs each tool call under ``(thread id, model answer's id,
tool_id)``. LlamaIndex has no thread id and its messages no id: the adapter keeps a thread id in the
``Context``'s state (or takes ``thread_id=``) and identifies the answer by the provider's response id or a
digest of it.
"""

from __future__ import annotations

from ._agent import MISSING_IDS_FIX, ThreadId, message_id, replay_safe_agent

__all__ = ["MISSING_IDS_FIX", "ThreadId", "message_id", "replay_safe_agent"]
