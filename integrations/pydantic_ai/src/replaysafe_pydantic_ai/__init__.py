"""replaysafe for Pydantic AI: a finished tool call is not run again when a run is resumed.

Add the capability last in ``Agent(..., capabilities=[..., ReplaySafe(ledger)])``. Each tool call
is keyed by ``(ctx.conversation_id, provider_response_id of the ModelResponse holding the call,
tool_call_id)``; see :func:`call_key`.
"""

from __future__ import annotations

from ._capability import APPROVER, PAUSES, ReplaySafe, call_key, message_id

__all__ = ["APPROVER", "PAUSES", "ReplaySafe", "call_key", "message_id"]
