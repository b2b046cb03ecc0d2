"""Result encoding: JSON with tagged types, never pickle.

A shared store must not become a code-execution path, so results are data. The
encoder accepts only what it rebuilds exactly, type for type, and refuses anything
else when the call is recorded (``ResultEncodingError``), so that a replay never
discovers a loss. Plain JSON data (dicts with ``str`` keys, lists, ``str``, ``int``,
``float``, ``bool``, ``None``, of exactly those types) is written as is, by json's C
encoder. Every other supported value is a tagged object ``{"__replaysafe__": tag,
"v": payload}``: tuples, sets, frozensets, dicts with other keys (or holding the tag
key themselves), ``bytes``, ``bytearray``, the datetime family, ``Decimal``, ``UUID``,
Enum members, dataclasses and pydantic models. Classes are named by module and
qualified name and found again only among modules already imported: stored data
never imports a module, and a name that does not resolve to the expected kind of
class fails to decode.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import re
import sys
import types
import typing
import uuid
import weakref
import zoneinfo
from collections.abc import Callable
from typing import Any, Protocol, Union

from ._errors import ResultEncodingError
from ._json import JSON_SCALARS, TAG_KEY, is_plain, json_decoder, json_encoder

_TAG = TAG_KEY
_TAG_MARK = f'"{_TAG}"'


class Serializer(Protocol):
    """Turns a tool's result into text and back. Pass one as ``@replay_safe(serializer=...)``."""

    def dumps(self, value: Any, /) -> str: ...

    def loads(self, text: str, /) -> Any: ...


class ResultDecodingError(ValueError):
    """Stored text that does not decode to a value; the message names types, never values."""


class _RefusedError(TypeError):
    """A value the encoder cannot rebuild exactly; the message is a type name and why."""


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# --- encoding -------------------------------------------------------------------------


def _tagged(tag: str, payload: Any) -> dict[str, Any]:
    return {_TAG: tag, "v": payload}


def _tree(value: Any) -> Any:
    """``value`` as plain JSON data, tagging every node JSON cannot rebuild by itself."""
    kind = type(value)
    if kind in JSON_SCALARS:
        return value
    if kind is list:
        return [_tree(item) for item in value]
    if kind is dict:
        if _TAG not in value and all(type(key) is str for key in value):
            return {key: _tree(item) for key, item in value.items()}
        # Other keys, or user data holding our tag key: pairs, so keys keep their types.
        return _tagged("dict", [[_tree(key), _tree(item)] for key, item in value.items()])
    encode = _ENCODERS.get(kind)
    if encode is not None:
        return encode(value)
    return _class_tree(value)


def _clock_tree(value: dt.datetime | dt.time) -> Any:
    """An ISO string when it says everything; else the naive ISO form, fold and zone."""
    zone = value.tzinfo
    if value.fold == 0 and (zone is None or _is_plain_offset(zone)):
        return value.isoformat()
    return [value.replace(tzinfo=None, fold=0).isoformat(), value.fold, _zone_tree(zone)]


def _is_plain_offset(zone: dt.tzinfo) -> bool:
    """A fixed offset whose name is the default one: what ``fromisoformat`` rebuilds."""
    if type(zone) is not dt.timezone:
        return False
    offset = zone.utcoffset(None)
    # fromisoformat misreads some offsets finer than a minute (-00:00:00.5 as UTC).
    return offset % _MINUTE == _ZERO and zone.tzname(None) == dt.timezone(offset).tzname(None)


_MINUTE, _ZERO = dt.timedelta(minutes=1), dt.timedelta(0)


def _zone_tree(zone: dt.tzinfo | None) -> Any:
    if zone is None:
        return None
    if type(zone) is dt.timezone:
        offset = zone.utcoffset(None)
        return ["offset", offset // dt.timedelta(microseconds=1), zone.tzname(None)]
    if type(zone) is zoneinfo.ZoneInfo and zone.key is not None:
        return ["zone", zone.key]
    raise _RefusedError(f"a time zone of type {_type_name(type(zone))} (use datetime.timezone or zoneinfo.ZoneInfo)")


_ENCODERS: dict[type, Callable[[Any], Any]] = {
    tuple: lambda value: _tagged("tuple", [_tree(item) for item in value]),
    set: lambda value: _tagged("set", [_tree(item) for item in value]),
    frozenset: lambda value: _tagged("frozenset", [_tree(item) for item in value]),
    bytes: lambda value: _tagged("bytes", base64.b64encode(value).decode("ascii")),
    bytearray: lambda value: _tagged("bytearray", base64.b64encode(value).decode("ascii")),
    dt.datetime: lambda value: _tagged("datetime", _clock_tree(value)),
    dt.date: lambda value: _tagged("date", value.isoformat()),
    dt.time: lambda value: _tagged("time", _clock_tree(value)),
    dt.timedelta: lambda value: _tagged("timedelta", [value.days, value.seconds, value.microseconds]),
    decimal.Decimal: lambda value: _tagged("decimal", str(value)),
    uuid.UUID: lambda value: _tagged("uuid", str(value)),
}


def _class_tree(value: Any) -> Any:
    """Enum members, dataclasses and pydantic models: a type reference and their data."""
    cls = type(value)
    if isinstance(value, enum.Enum):
        if isinstance(value, enum.Flag):  # a combination of flags may have no name of its own
            return _tagged("flag", [*_type_ref(cls), _tree(value._value_)])
        return _tagged("enum", [*_type_ref(cls), value._name_])
    if dataclasses.is_dataclass(cls):
        fields = {field.name: getattr(value, field.name) for field in dataclasses.fields(cls)}
        # Rebuilt from its fields alone: state held anywhere else (a builtin base's
        # contents, an attribute set in __post_init__) would not come back.
        if isinstance(value, _BUILTIN_STATE) or not set(getattr(value, "__dict__", ())) <= set(fields):
            raise _RefusedError(f"{_type_name(cls)} (it holds state outside its fields)")
        return _tagged("dataclass", [*_type_ref(cls), _tree(fields)])
    base_model = _pydantic_base_model()
    if base_model is not None and isinstance(value, base_model):
        return _tagged("model", [*_type_ref(cls), *_model_tree(value)])
    raise _RefusedError(_type_name(cls))


#: Builtin bases whose contents a dataclass's fields do not hold.
_BUILTIN_STATE = (dict, list, set, frozenset, tuple, str, bytes, bytearray, int, float, complex)


def _model_tree(model: Any) -> list[Any]:
    """A model's state as it is: its field values by name, extra fields, private attributes
    and which fields were set. Rebuilt as is on replay, never validated again: a validator
    that transforms its input would transform it twice.

    Not ``model_dump``: it turns a dataclass or a model held in an ``Any`` field into a dict.
    """
    return [
        _tree(dict(model.__dict__)),
        _tree(model.__pydantic_extra__),
        _tree(model.__pydantic_private__),
        sorted(model.__pydantic_fields_set__),
    ]


def _pydantic_base_model() -> type | None:
    """pydantic's ``BaseModel`` if pydantic is imported (no model exists otherwise)."""
    pydantic = sys.modules.get("pydantic")
    base = getattr(pydantic, "BaseModel", None) if pydantic is not None else None
    return base if isinstance(base, type) else None


# Classes already checked to be found again by name. Weak: a class defined and
# dropped at run time must not be kept alive by having been encoded once.
_REFERENCES: weakref.WeakKeyDictionary[type, tuple[str, str]] = weakref.WeakKeyDictionary()


def _type_ref(cls: type) -> tuple[str, str]:
    """(module, qualified name) of a class that resolves back to itself, or refused."""
    ref = _REFERENCES.get(cls)
    if ref is None:
        ref = (cls.__module__, cls.__qualname__)
        if _resolve(*ref) is not cls:
            raise _RefusedError(f"{_type_name(cls)} (a replay could not find it by name: define it at module level)")
        _REFERENCES[cls] = ref
    return ref


def _resolve(module: str, qualname: str) -> Any:
    """The object ``module.qualname`` names, looked up in namespaces only.

    Only modules already in ``sys.modules``: never an import, and no ``__getattr__``
    hook (which may import), since the names come from stored data.
    """
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if found is None:
            return None
        try:
            namespace = vars(found)
        except TypeError:
            return None
        found = namespace.get(part)
    return found


# --- decoding -------------------------------------------------------------------------


def _decode_hook(obj: dict[str, Any]) -> Any:
    """json's ``object_hook``: objects are decoded innermost first, so payloads arrive decoded."""
    if _TAG not in obj:
        return obj
    tag = obj[_TAG]
    decode = _DECODERS.get(tag) if type(tag) is str and len(obj) == 2 and "v" in obj else None
    if decode is None:
        raise ResultDecodingError("the recorded result holds a malformed tagged value")
    try:
        return decode(obj["v"])
    except ResultDecodingError:
        raise
    except Exception as exc:  # the message may quote the data (fromisoformat, pydantic): type names only
        reason = type(exc).__name__
        raise ResultDecodingError(f"the recorded result holds a {tag} that does not decode ({reason})") from None


def _of(kind: type, payload: Any) -> Any:
    if type(payload) is not kind:
        found = type(payload).__name__
        raise ResultDecodingError(f"the recorded result holds a {found} where a {kind.__name__} belongs")
    return payload


def _pairs(payload: Any) -> dict[Any, Any]:
    result = {}
    for pair in _of(list, payload):
        key, value = _of(list, pair)
        result[key] = value
    return result


def _clock(kind: type[dt.datetime] | type[dt.time], payload: Any) -> Any:
    if type(payload) is str:
        return kind.fromisoformat(payload)
    naive, fold, zone = _of(list, payload)
    return kind.fromisoformat(_of(str, naive)).replace(tzinfo=_zone(zone), fold=_of(int, fold))


def _zone(payload: Any) -> dt.tzinfo | None:
    if payload is None:
        return None
    kind, *rest = _of(list, payload)
    if kind == "offset":
        micros, name = rest
        return dt.timezone(dt.timedelta(microseconds=_of(int, micros)), _of(str, name))
    if kind == "zone":
        (key,) = rest
        return zoneinfo.ZoneInfo(_of(str, key))
    raise ResultDecodingError("the recorded result holds an unknown kind of time zone")


_NAME = re.compile(r"[\w.<>\[\], ]{1,200}")


def _class(payload: Any, kind: str, accept: Callable[[type], bool]) -> tuple[Any, Any]:
    """The class a type reference names, if it is loaded and of the expected kind; and the data."""
    module, qualname, data = _of(list, payload)
    found = _resolve(module, qualname) if type(module) is str and type(qualname) is str else None
    if not (isinstance(found, type) and accept(found)):
        name = f"{module}.{qualname}"
        shown = name if _NAME.fullmatch(name) else "a class"
        raise ResultDecodingError(
            f"the recorded result names {shown} as its {kind} class, and no such {kind} class is loaded: "
            "import the module that defines it before replaying"
        )
    return found, data


def _enum(payload: Any) -> Any:
    cls, name = _class(payload, "Enum", lambda cls: issubclass(cls, enum.Enum))
    member = cls.__members__.get(_of(str, name))
    if member is None:
        raise ResultDecodingError(f"the recorded result names a member {_type_name(cls)} no longer has")
    return member


def _flag(payload: Any) -> Any:
    cls, value = _class(payload, "Flag", lambda cls: issubclass(cls, enum.Flag))
    return cls(value)


def _dataclass(payload: Any) -> Any:
    """A dataclass rebuilt field by field, without ``__init__``: the state it had, exactly."""
    cls, data = _class(payload, "dataclass", dataclasses.is_dataclass)
    _of(dict, data)
    fields = dataclasses.fields(cls)
    if not set(data) <= {field.name for field in fields}:
        raise ResultDecodingError(f"the recorded {_type_name(cls)} has a field the class no longer has")
    obj = cls.__new__(cls)
    for field in fields:
        if field.name in data:
            value = data[field.name]
        elif field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            raise ResultDecodingError(f"the recorded {_type_name(cls)} lacks a field the class now requires")
        object.__setattr__(obj, field.name, value)  # frozen dataclasses too
    return obj


def _model(payload: Any) -> Any:
    """A model rebuilt with the state it had, without validation (see ``_model_tree``); a
    model whose fields changed since (a field added without a default, one removed) fails."""
    module, qualname, fields, extra, private, fields_set = _of(list, payload)
    cls, _ = _class([module, qualname, None], "pydantic model", _is_model_class)
    fields = dict(_of(dict, fields))
    known = cls.model_fields
    if not set(fields) <= set(known):
        raise ResultDecodingError(f"the recorded {_type_name(cls)} has a field the class no longer has")
    for name, field in known.items():
        if name not in fields:
            if field.is_required():
                raise ResultDecodingError(f"the recorded {_type_name(cls)} lacks a field the class now requires")
            fields[name] = field.get_default(call_default_factory=True)
    model = cls.__new__(cls)
    object.__setattr__(model, "__dict__", fields)  # frozen models too
    object.__setattr__(model, "__pydantic_extra__", None if extra is None else dict(_of(dict, extra)))
    object.__setattr__(model, "__pydantic_private__", None if private is None else dict(_of(dict, private)))
    object.__setattr__(model, "__pydantic_fields_set__", {_of(str, name) for name in _of(list, fields_set)})
    return model


def _is_model_class(cls: type) -> bool:
    base = _pydantic_base_model()
    return base is not None and issubclass(cls, base)


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "tuple": lambda payload: tuple(_of(list, payload)),
    "set": lambda payload: set(_of(list, payload)),
    "frozenset": lambda payload: frozenset(_of(list, payload)),
    "dict": _pairs,
    "bytes": lambda payload: base64.b64decode(_of(str, payload).encode("ascii"), validate=True),
    "bytearray": lambda payload: bytearray(base64.b64decode(_of(str, payload).encode("ascii"), validate=True)),
    "datetime": lambda payload: _clock(dt.datetime, payload),
    "date": lambda payload: dt.date.fromisoformat(_of(str, payload)),
    "time": lambda payload: _clock(dt.time, payload),
    "timedelta": lambda payload: dt.timedelta(*(_of(int, part) for part in _of(list, payload))),
    "decimal": lambda payload: decimal.Decimal(_of(str, payload)),
    "uuid": lambda payload: uuid.UUID(_of(str, payload)),
    "enum": _enum,
    "flag": _flag,
    "dataclass": _dataclass,
    "model": _model,
}


def _unexpected(obj: Any) -> Any:
    """json's ``default``: never reached, as ``_tree`` leaves only JSON types; a guard all the same."""
    raise _RefusedError(_type_name(type(obj)))


class JsonSerializer:
    """The default serializer: compact JSON, ASCII-only so any store accepts it.

    ``dumps`` refuses (``ResultEncodingError``) any value ``loads`` would not give back
    equal and of the same types at every level; ``loads`` raises ``ResultDecodingError``,
    whose message names types only, for text it cannot rebuild a value from.
    """

    _encode = staticmethod(json_encoder(default=_unexpected, sort_keys=False, ensure_ascii=True, separators=(",", ":")))

    def dumps(self, value: Any, /) -> str:
        try:
            return self._encode(value if is_plain(value) else _tree(value))
        except _RefusedError as exc:
            raise ResultEncodingError(f"cannot record a result holding {exc}: a replay could not rebuild it") from None
        except Exception as exc:  # e.g. circular data, an int too long for str(), a failing property
            raise ResultEncodingError(f"cannot record this result ({type(exc).__name__})") from None

    _decode = staticmethod(json_decoder())
    _decode_tagged = staticmethod(json_decoder(object_hook=_decode_hook))

    def loads(self, text: str, /) -> Any:
        try:
            if _TAG_MARK not in text:
                return self._decode(text)
            return self._decode_tagged(text)
        except ResultDecodingError:
            raise
        except Exception as exc:
            raise ResultDecodingError(f"the recorded result is not valid JSON ({type(exc).__name__})") from None


# --- turning decoded data back into the annotated return type ---------------------
#
# A value recorded by this codec decodes to its own types already; the revivers
# below rebuild what older records stored untyped (a tuple as a list, a dataclass
# or model as a dict, an Enum member as its value) and leave typed values alone.

Reviver = Callable[[Any], Any]
_PLAIN = frozenset({str, int, float, bool, type(None), dict, list, object})


def reviver_for(annotation: Any) -> Reviver | None:
    """A function that rebuilds ``annotation`` from decoded data, or ``None`` if nothing to do."""
    if annotation is Any or annotation in _PLAIN or isinstance(annotation, (str, typing.ForwardRef)):
        return None
    # Python 3.10 counts a parametrised generic (``tuple[int, ...]``) as a type: it is handled below.
    if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias):
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
            return lambda data: _rebuilt(data, tuple, each)
        positional = [reviver_for(a) for a in args]

        def revive_tuple(data: Any) -> Any:
            if not isinstance(data, (list, tuple)):
                return data
            return tuple(r(v) if r else v for r, v in zip(positional, data, strict=False))

        return revive_tuple
    if origin in (list, set, frozenset) and args:
        item = reviver_for(args[0])
        container: Callable[[Any], Any] = origin
        if item is None and origin is list:
            return None
        return lambda data: _rebuilt(data, container, item)
    if origin is dict and len(args) == 2:
        value_reviver = reviver_for(args[1])
        if value_reviver is None:
            return None
        return lambda data: {k: value_reviver(v) for k, v in data.items()} if isinstance(data, dict) else data
    return None


def _rebuilt(data: Any, container: Callable[[Any], Any], item: Reviver | None) -> Any:
    """A list (an older record's tuple or set) as ``container``; a typed container kept as its type."""
    if isinstance(data, list):
        return container(item(v) for v in data) if item else container(data)
    if isinstance(data, (tuple, set, frozenset)) and item is not None:
        return type(data)(item(v) for v in data)
    return data


def _dataclass_reviver(cls: type) -> Reviver:
    hints = typing.get_type_hints(cls)
    fields = [(f.name, reviver_for(hints.get(f.name, Any))) for f in dataclasses.fields(cls) if f.init]

    def revive(data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return cls(**{name: (r(data[name]) if r else data[name]) for name, r in fields if name in data})

    return revive
