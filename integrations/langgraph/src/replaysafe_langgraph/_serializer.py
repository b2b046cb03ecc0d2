"""Recording what a LangGraph tool call produced: ``ToolMessage``, ``Command`` or a list of them.

Messages go through langchain-core's own serialization (``dumpd`` / ``load``), never
pickle. ``Command`` and ``Send`` are not serializable there, so they are written as a
small JSON envelope whose parts are ``dumpd`` output.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from langchain_core._api import suppress_langchain_beta_warning
from langchain_core.load import dumpd, load
from langchain_core.load.load import AllowedObject
from langchain_core.messages import BaseMessage
from langgraph.types import Command, Send

from replaysafe import ResultEncodingError

AllowedObjects = Iterable[AllowedObject] | Literal["all", "core", "messages"]

#: Marks the top of the envelope, so plain JSON recorded by others (``ledger.resolve``) reads as plain data.
_MARK = "replaysafe_langgraph"


class MessageSerializer:
    """A replaysafe ``Serializer`` for LangChain messages, LangGraph ``Command`` and plain data.

    ``allowed_objects`` is the allowlist ``langchain_core.load.load`` revives; the default
    ``"messages"`` only rebuilds chat messages, so a shared ledger is never a way to
    construct arbitrary objects. A result that cannot be read back is refused when it is
    recorded, not when it is replayed. Text it did not write (a result settled with
    ``ledger.resolve(key, result=...)``) is read as plain JSON data.
    """

    def __init__(self, *, allowed_objects: AllowedObjects = "messages") -> None:
        self.allowed_objects = allowed_objects

    def dumps(self, value: Any, /) -> str:
        envelope = {_MARK: 1, **_encode(value)}
        unserializable = sorted(_not_implemented(envelope))
        if unserializable:
            raise ResultEncodingError(
                f"cannot record a result holding {', '.join(unserializable)}: langchain-core cannot serialize it. "
                "Return messages or JSON data from the tool, or decorate it with @replay_safe and a serializer."
            )
        text = json.dumps(envelope, separators=(",", ":"), ensure_ascii=True)
        try:
            self.loads(text)
        except Exception as exc:  # the message of a failed load may quote the data: name the type only
            raise ResultEncodingError(
                f"cannot record this result: it would not load back ({type(exc).__name__}), most likely because "
                f"it holds a class outside allowed_objects={self.allowed_objects!r}. Pass "
                "MessageSerializer(allowed_objects=[...]) naming it."
            ) from None
        return text

    def loads(self, text: str, /) -> Any:
        data = json.loads(text)
        if isinstance(data, dict) and data.get(_MARK) == 1:
            return _decode(data, self.allowed_objects)
        return _revive(data, self.allowed_objects)


# --- the envelope ------------------------------------------------------------------


def _encode(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseMessage):
        return {"message": dumpd(value)}
    if isinstance(value, Command):
        return {
            "command": {
                "graph": value.graph,
                "update": _encode_update(value.update),
                "resume": dumpd(value.resume),
                "goto": _encode_goto(value.goto),
            }
        }
    if isinstance(value, tuple):  # a (content, artifact) pair of response_format="content_and_artifact"
        return {"tuple": [_encode(item) for item in value]}
    if isinstance(value, list):
        return {"list": [_encode(item) for item in value]}
    return {"value": dumpd(value)}


def _encode_update(update: Any) -> dict[str, Any]:
    if isinstance(update, (list, tuple)) and all(
        isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) for pair in update
    ):
        # Command reads a list of (channel, value) tuples; JSON would turn them into lists.
        return {"pairs": [[channel, dumpd(item)] for channel, item in update]}
    return {"value": dumpd(update)}


def _encode_goto(goto: Any) -> dict[str, Any]:
    if isinstance(goto, (str, Send)):
        return {"one": _encode_target(goto)}
    return {"many": [_encode_target(target) for target in goto]}


def _encode_target(target: Any) -> dict[str, Any]:
    if isinstance(target, str):
        return {"node": target}
    if isinstance(target, Send):
        if target.timeout is not None:
            raise ResultEncodingError(
                f"cannot record a Command whose Send to {target.node!r} carries a timeout policy; "
                "send without a timeout, or decorate the tool with @replay_safe and a serializer."
            )
        return {"send": target.node, "arg": dumpd(target.arg)}
    raise ResultEncodingError(f"cannot record a Command goto target of type {type(target).__name__}")


def _not_implemented(data: Any) -> set[str]:
    """The class paths ``dumpd`` could not serialize (it writes a ``not_implemented`` stub)."""
    found: set[str] = set()
    if isinstance(data, dict):
        if data.get("lc") == 1 and data.get("type") == "not_implemented":
            found.add(".".join(str(part) for part in data.get("id", ["?"])))
            return found
        for key, item in data.items():
            if key != "__lc_escaped__":  # user data that merely looks like a stub
                found |= _not_implemented(item)
    elif isinstance(data, list):
        for item in data:
            found |= _not_implemented(item)
    return found


def _revive(data: Any, allowed_objects: AllowedObjects) -> Any:
    with suppress_langchain_beta_warning():  # load() is marked beta; the warning is not for our users
        return load(data, allowed_objects=allowed_objects)


def _decode(envelope: dict[str, Any], allowed_objects: AllowedObjects) -> Any:
    if "message" in envelope:
        return _revive(envelope["message"], allowed_objects)
    if "command" in envelope:
        command = envelope["command"]
        return Command(
            graph=command["graph"],
            update=_decode_update(command["update"], allowed_objects),
            resume=_revive(command["resume"], allowed_objects),
            goto=_decode_goto(command["goto"], allowed_objects),
        )
    if "list" in envelope:
        return [_decode(item, allowed_objects) for item in envelope["list"]]
    if "tuple" in envelope:
        return tuple(_decode(item, allowed_objects) for item in envelope["tuple"])
    return _revive(envelope["value"], allowed_objects)


def _decode_update(update: dict[str, Any], allowed_objects: AllowedObjects) -> Any:
    if "pairs" in update:
        return [(channel, _revive(item, allowed_objects)) for channel, item in update["pairs"]]
    return _revive(update["value"], allowed_objects)


def _decode_goto(goto: dict[str, Any], allowed_objects: AllowedObjects) -> Send | str | Sequence[Send | str]:
    if "one" in goto:
        return _decode_target(goto["one"], allowed_objects)
    targets = [_decode_target(target, allowed_objects) for target in goto["many"]]
    return targets or ()  # Command's own default is an empty tuple


def _decode_target(target: dict[str, Any], allowed_objects: AllowedObjects) -> Send | str:
    if "node" in target:
        return str(target["node"])
    return Send(target["send"], _revive(target["arg"], allowed_objects))
