"""Result encoding: JSON with a few tagged types, never pickle.

A shared store must not become a code-execution path, so results are data: the
JSON types, plus tagged ``datetime``, ``date``, ``time``, ``Decimal``, ``UUID``,
``bytes`` and sets. Dataclasses and pydantic models are stored as their fields and
come back as their own type when the tool's return annotation names it.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import json
import types
import typing
import uuid
from collections.abc import Callable
from typing import Any, Protocol, Union

from ._errors import ResultEncodingError
from ._json import json_encoder

_TAG = "__replaysafe__"
_TAG_MARK = f'"{_TAG}"'


class Serializer(Protocol):
    """Turns a tool's result into text and back. Pass one as ``@replay_safe(serializer=...)``."""

    def dumps(self, value: Any, /) -> str: ...

    def loads(self, text: str, /) -> Any: ...


def _tagged(tag: str, value: Any) -> dict[str, Any]:
    return {_TAG: tag, "v": value}


def _encode_default(obj: Any) -> Any:
    if isinstance(obj, dt.datetime):
        return _tagged("datetime", obj.isoformat())
    if isinstance(obj, dt.date):
        return _tagged("date", obj.isoformat())
    if isinstance(obj, dt.time):
        return _tagged("time", obj.isoformat())
    if isinstance(obj, decimal.Decimal):
        return _tagged("decimal", str(obj))
    if isinstance(obj, uuid.UUID):
        return _tagged("uuid", str(obj))
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return _tagged("bytes", base64.b64encode(bytes(obj)).decode("ascii"))
    if isinstance(obj, (set, frozenset)):
        return _tagged("frozenset" if isinstance(obj, frozenset) else "set", list(obj))
    if isinstance(obj, enum.Enum):
        return obj.value
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    model_dump = getattr(obj, "model_dump", None)
    if callable(model_dump):  # a pydantic model
        return model_dump(mode="json")
    raise TypeError(f"{type(obj).__module__}.{type(obj).__qualname__}")


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "decimal": decimal.Decimal,
    "uuid": uuid.UUID,
    "bytes": lambda v: base64.b64decode(v.encode("ascii")),
    "set": set,
    "frozenset": frozenset,
    "dict": lambda pairs: {k: v for k, v in pairs},
}


def _decode_hook(obj: dict[str, Any]) -> Any:
    tag = obj.get(_TAG)
    if tag is None or len(obj) != 2 or "v" not in obj:
        return obj
    return _DECODERS[tag](obj["v"])


def _escape_tag_keys(value: Any) -> Any:
    """Wrap user dicts that happen to hold our tag key, so they cannot pass for a tag."""
    if isinstance(value, dict):
        items = [(k, _escape_tag_keys(v)) for k, v in value.items()]
        if _TAG in value:
            return _tagged("dict", [list(item) for item in items])
        return dict(items)
    if isinstance(value, (list, tuple)):
        return [_escape_tag_keys(v) for v in value]
    return value


class JsonSerializer:
    """The default serializer: compact JSON, ASCII-only so any store accepts it."""

    _encode = staticmethod(
        json_encoder(default=_encode_default, sort_keys=False, ensure_ascii=True, separators=(",", ":"))
    )

    def dumps(self, value: Any, /) -> str:
        try:
            text = self._encode(value)
            # Rare path: the text holds our tag key. If the user's data put it there,
            # escape those dicts; tags we wrote ourselves pass through unchanged.
            if _TAG_MARK in text and _has_tag_key(value):
                text = self._encode(_escape_tag_keys(value))
        except (TypeError, ValueError, RecursionError) as exc:
            raise ResultEncodingError(f"cannot encode a result of type {exc}") from exc
        return text

    def loads(self, text: str, /) -> Any:
        if _TAG_MARK not in text:
            return json.loads(text)
        return json.loads(text, object_hook=_decode_hook)


def _has_tag_key(value: Any) -> bool:
    if isinstance(value, dict):
        return _TAG in value or any(_has_tag_key(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_tag_key(v) for v in value)
    return False


# --- turning decoded data back into the annotated return type ---------------------

Reviver = Callable[[Any], Any]
_PLAIN = frozenset({str, int, float, bool, type(None), dict, list, object})


def reviver_for(annotation: Any) -> Reviver | None:
    """A function that rebuilds ``annotation`` from decoded data, or ``None`` if nothing to do."""
    if annotation is Any or annotation in _PLAIN or isinstance(annotation, (str, typing.ForwardRef)):
        return None
    if isinstance(annotation, type):
        if dataclasses.is_dataclass(annotation):
            return _dataclass_reviver(annotation)
        validate = getattr(annotation, "model_validate", None)
        if callable(validate):  # a pydantic model
            return lambda data: data if isinstance(data, annotation) else validate(data)
        if issubclass(annotation, enum.Enum):
            return lambda data: data if isinstance(data, annotation) else annotation(data)
        if annotation in (tuple, set, frozenset):
            return lambda data: annotation(data) if isinstance(data, list) else data
        return None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        inner = [reviver_for(a) for a in args if a is not type(None)]
        if len(inner) != 1 or inner[0] is None:
            return None  # an ambiguous union is returned as decoded
        one = inner[0]
        return lambda data: None if data is None else one(data)
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            each = reviver_for(args[0])
            return lambda data: tuple(each(v) for v in data) if each else tuple(data)
        positional = [reviver_for(a) for a in args]
        return lambda data: tuple(r(v) if r else v for r, v in zip(positional, data, strict=False))
    if origin in (list, set, frozenset) and args:
        item = reviver_for(args[0])
        container: Callable[[Any], Any] = origin
        if item is None and origin is list:
            return None
        return lambda data: container(item(v) for v in data) if item else container(data)
    if origin is dict and len(args) == 2:
        value_reviver = reviver_for(args[1])
        if value_reviver is None:
            return None
        return lambda data: {k: value_reviver(v) for k, v in data.items()} if isinstance(data, dict) else data
    return None


def _dataclass_reviver(cls: type) -> Reviver:
    hints = typing.get_type_hints(cls)
    fields = [(f.name, reviver_for(hints.get(f.name, Any))) for f in dataclasses.fields(cls) if f.init]

    def revive(data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return cls(**{name: (r(data[name]) if r else data[name]) for name, r in fields if name in data})

    return revive
