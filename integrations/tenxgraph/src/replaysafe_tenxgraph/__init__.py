"""replaysafe for 10xGraph: claims, in-doubt detection and streaming protection for tool calls.

Hand the ToolNode protected tools: ``ReactAgent(..., tools=replay_safe_tools([...], ledger=ledger))``
or ``ToolNode(replay_safe_tools([...], ledger=ledger))``. Each call is keyed by
``(config["thread_id"], the assistant message's message_id, tool_call_id)``; see :func:`call_key`.
"""

from __future__ import annotations

from ._serializer import ToolResultSerializer
from ._tools import PAUSE_REASON, PAUSES, REFUSALS, call_key, message_id, replay_safe_tool, replay_safe_tools

__all__ = [
    "PAUSES",
    "PAUSE_REASON",
    "REFUSALS",
    "ToolResultSerializer",
    "call_key",
    "message_id",
    "replay_safe_tool",
    "replay_safe_tools",
]
