"""Records of 10xGraph tool results: ``ToolResult`` and ``Message`` come back as themselves."""

from __future__ import annotations

from typing import Any

from tenxgraph.core.state import Message, ToolResult

from replaysafe import JsonSerializer

_KIND = "tenxgraph"


class ToolResultSerializer:
    """JSON records for 10xGraph tools, never pickle.

    A 10xGraph tool may return a ``ToolResult`` (a message for the model plus state updates) or a
    ``Message``; the ToolNode turns each into a different tool message, so a replay must return the
    same type. Every record is an envelope ``{"tenxgraph": kind, ...}``, so a tool's own dict can never
    pass for one of these types; the values inside are encoded by replaysafe's ``JsonSerializer``.
    """

    def __init__(self) -> None:
        self._json = JsonSerializer()

    def dumps(self, value: Any, /) -> str:
        if isinstance(value, ToolResult):
            envelope: dict[str, Any] = {
                _KIND: "tool_result",
                "message": value.message,
                "state": value.state,
                "is_error": value.is_error,
            }
        elif isinstance(value, Message):
            envelope = {_KIND: "message", "value": value.model_dump(mode="json")}
        else:
            envelope = {_KIND: "value", "value": value}
        return self._json.dumps(envelope)

    def loads(self, text: str, /) -> Any:
        envelope = self._json.loads(text)
        kind = envelope.get(_KIND) if isinstance(envelope, dict) else None
        if kind == "tool_result":
            return ToolResult(envelope["message"], envelope["state"], bool(envelope["is_error"]))
        if kind == "message":
            return Message.model_validate(envelope["value"])
        if kind == "value":
            return envelope["value"]
        return envelope  # not written by this serializer (a record made under another one): as decoded
