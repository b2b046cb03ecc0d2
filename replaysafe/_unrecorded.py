"""The record of a call that ran but whose result could not be stored.

Such a call is finished: it must never run again. Its record is ``completed`` and
its result is this marker instead of an encoded value: ``rs-unrecorded-1:`` then a
JSON object with the reason (``too_large`` or ``not_encodable``), the result's type
name and, when known, its encoded size. Never the value itself.

The marker cannot collide with a real result: JSON text never starts with ``r``,
and a custom serializer's output that starts with a reserved prefix is refused
when the call is recorded (it is then recorded with this marker, ``not_encodable``).
The marker is sealed like any result when the ledger signs records.
"""

from __future__ import annotations

import json
from typing import Any, Literal, NamedTuple

PREFIX = "rs-unrecorded-1:"
#: Prefixes a stored result may start with that are not the serializer's output.
RESERVED_PREFIXES = (PREFIX, "rs-seal-1:")

Reason = Literal["too_large", "not_encodable"]

REASONS: dict[str, str] = {
    "too_large": "its encoded result was over max_result_bytes",
    "not_encodable": "its result could not be encoded by the serializer",
}


class Unrecorded(NamedTuple):
    """What the marker says: why the result is missing, and of what type it was."""

    reason: str
    type_name: str
    size: int | None = None

    def describe(self) -> str:
        why = REASONS.get(self.reason, self.reason)
        size = f", {self.size} bytes" if self.size is not None else ""
        return f"ran; result not recorded ({why}; a {self.type_name}{size})"


def type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def mark(reason: Reason, value: Any, size: int | None = None) -> str:
    body: dict[str, Any] = {"reason": reason, "type": type_name(value)}
    if size is not None:
        body["size"] = size
    return PREFIX + json.dumps(body, sort_keys=True)


def is_reserved(encoded: str) -> bool:
    return encoded.startswith(RESERVED_PREFIXES)


def parse(text: str | None) -> Unrecorded | None:
    """The marker in a record's (unsealed) result text, or ``None`` for a real result."""
    if text is None or not text.startswith(PREFIX):
        return None
    try:
        body = json.loads(text[len(PREFIX) :])
        size = body.get("size")
        return Unrecorded(str(body["reason"]), str(body["type"]), size if isinstance(size, int) else None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return Unrecorded("unknown", "<unreadable marker>")
