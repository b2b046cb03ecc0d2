"""Where the three ids of a LangGraph tool call live at tool time."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.prebuilt.tool_node import ToolCallRequest

from replaysafe import CallKey

#: ``(request, message) -> message id``: called when the ``AIMessage`` holding the call
#: was not found in the state (``message`` is ``None``) or carries no id.
MessageIdFallback = Callable[[ToolCallRequest, AIMessage | None], str | None]


def thread_id_of(request: ToolCallRequest) -> str | None:
    """The checkpointer's thread id: ``config["configurable"]["thread_id"]``, else the runtime's."""
    runtime = getattr(request, "runtime", None)
    config = getattr(runtime, "config", None) or {}
    value = (config.get("configurable") or {}).get("thread_id")
    if value is None:
        info = getattr(runtime, "execution_info", None)
        value = getattr(info, "thread_id", None)
    return None if value is None or value == "" else str(value)


def _messages(state: Any, messages_key: str) -> Sequence[Any]:
    if isinstance(state, list):
        return state
    found = state.get(messages_key) if isinstance(state, dict) else getattr(state, messages_key, None)
    return found if isinstance(found, (list, tuple)) else ()


def find_ai_message(request: ToolCallRequest, *, messages_key: str = "messages") -> AIMessage | None:
    """The latest ``AIMessage`` in the state whose ``tool_calls`` hold this request's call."""
    call_id = request.tool_call.get("id")
    if not call_id:
        return None
    for message in reversed(_messages(request.state, messages_key)):
        if isinstance(message, AIMessage) and any(call.get("id") == call_id for call in message.tool_calls):
            return message
    return None


def ai_message_digest(request: ToolCallRequest, message: AIMessage | None) -> str | None:
    """A ``fallback_message_id`` for messages without ids: a digest of the ``AIMessage``.

    Stable once the message is checkpointed. Two turns whose messages are identical
    (same text, same tool call ids and arguments) get the same digest, so use it only
    where the model's tool call ids are unique (real providers), never with test models
    that repeat ``call_1``.
    """
    if message is None:
        return None
    calls = [{"id": call.get("id"), "name": call["name"], "args": call["args"]} for call in message.tool_calls]
    text = json.dumps([message.content, calls], sort_keys=True, separators=(",", ":"), default=str)
    return "digest-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def call_key(
    request: ToolCallRequest,
    *,
    messages_key: str = "messages",
    fallback_message_id: MessageIdFallback | None = None,
) -> CallKey:
    """``(thread_id, message_id, tool_call_id)`` of a request; a missing id is ``""``."""
    message = find_ai_message(request, messages_key=messages_key)
    message_id = message.id if message is not None else None
    if not message_id and fallback_message_id is not None:
        message_id = fallback_message_id(request, message)
    tool_call_id = request.tool_call.get("id")
    return CallKey(thread_id_of(request) or "", message_id or "", str(tool_call_id) if tool_call_id else "")
