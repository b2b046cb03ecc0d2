"""Stable digests of calls and arguments, and idempotency keys."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import importlib
import json.encoder
import math
import uuid
import zoneinfo
from collections.abc import Callable, Collection, Mapping
from typing import Any

from ._errors import ArgumentDigestError
from ._json import JSON_SCALARS, TAG_KEY, is_plain, json_encoder

# Canonical JSON: sorted keys, no whitespace, unicode kept as is. Equal data gives
# equal bytes in every process, whatever the hash seed. Call keys and idempotency
# keys are built with it: their values must never change, or stored records and
# keys handed to providers would no longer match.
_canonical = json_encoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=lambda o: _canonical_default(o)
)


def _canonical_default(obj: Any) -> Any:
    """Tag values JSON has no type for, so that ``"2026-01-01"`` and a date differ."""
    if isinstance(obj, dt.datetime):
        return ["$datetime", obj.isoformat()]
    if isinstance(obj, dt.date):
        return ["$date", obj.isoformat()]
    if isinstance(obj, dt.time):
        return ["$time", obj.isoformat()]
    if isinstance(obj, decimal.Decimal):
        return ["$decimal", str(obj)]
    if isinstance(obj, uuid.UUID):
        return ["$uuid", str(obj)]
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return ["$bytes", base64.b64encode(bytes(obj)).decode("ascii")]
    if isinstance(obj, (set, frozenset)):
        return ["$set", sorted(_canonical(item) for item in obj)]
    if isinstance(obj, enum.Enum):
        return ["$enum", type(obj).__qualname__, obj.value]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return ["$dataclass", type(obj).__qualname__, fields]
    model_dump = getattr(obj, "model_dump", None)
    if callable(model_dump):  # a pydantic model
        return ["$model", type(obj).__qualname__, model_dump(mode="json")]
    raise TypeError(type(obj).__qualname__)


# --- argument digests: an injective canonical form -----------------------------------
#
# Two argument mappings digest alike exactly when they are equal as typed data. Plain
# JSON data of exact types (the common case) is sorted-key JSON, which is injective
# on that domain (and the same text as before this form existed, so those digests did
# not change). Anything else is a tree in which every JSON array is a tagged node
# (["list", ...], ["date", "2026-01-01"], ...) and every JSON object a dict with
# ``str`` keys, behind a prefix no JSON object starts with: the two forms cannot meet.

_TAGGED_FORM = "~"


def _unexpected(obj: Any) -> Any:
    raise TypeError(f"{type(obj).__module__}.{type(obj).__qualname__}")


_sorted_json = json_encoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_unexpected)


def _args_text(arguments: Mapping[str, Any]) -> str:
    """The canonical text (rs1) of an argument mapping: equal texts exactly for equal typed data,
    numbers compared by value (docs/keys.md)."""
    if type(arguments) is dict:
        arguments = _plain_numbers(arguments)
        if is_plain(arguments):
            return _sorted_json(arguments)  # starts with "{"
    return _TAGGED_FORM + _sorted_json(_canonical_tree(dict(arguments)))


def _rs0_args_text(arguments: Mapping[str, Any]) -> str:
    """The canonical text of the earlier rules (rs0): numbers by type (``59`` is not ``59.0``).
    Only to find records written under them again."""
    if type(arguments) is dict and is_plain(arguments):
        return _sorted_json(arguments)
    return _TAGGED_FORM + _sorted_json(_canonical_tree(dict(arguments), rs0=True))


# --- numbers: by value (rs1) ---------------------------------------------------------
#
# A model asked twice may send 59 then 59.0 for one amount, and a framework may hand
# the same number as a float or a Decimal: equal numbers are one call. Integral values
# are written as integers (so int arguments digest as they always did), other floats as
# their shortest round-trip text (as before), and a Decimal as the float of the same
# value when there is one, else as a tagged exact decimal. NaN and infinities have no
# value to compare: they are refused. ``True`` stays ``true``: a bool is not a number here.

#: Integral values with more digits than this are refused, as CPython refuses to print such ints.
_MAX_DIGITS = 4300


def _number(value: float | decimal.Decimal) -> int | float | decimal.Decimal:
    """A float or Decimal as the int or float of its value; a Decimal no float holds stays one."""
    if isinstance(value, float):
        if value != value or value in (math.inf, -math.inf):
            raise ValueError("NaN and infinite numbers have no value to compare: send a number")
        return int(value) if value.is_integer() else value
    if not value.is_finite():
        raise ValueError("NaN and infinite numbers have no value to compare: send a number")
    if value == value.to_integral_value():
        if value.adjusted() >= _MAX_DIGITS:
            raise ValueError(f"an integral number of more than {_MAX_DIGITS} digits")
        return int(value)
    near = float(value)
    if near.is_integer() or near in (math.inf, -math.inf) or decimal.Decimal(repr(near)) != value:
        return value  # more digits than a float holds: an exact decimal of its own
    return near


def _exact_decimal(value: decimal.Decimal) -> str:
    """The value's digits without trailing zeros and its exponent: one text per value (not
    ``normalize()``, which rounds to the context's precision)."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite: NaN and infinities were refused
    text = "".join(map(str, digits))
    significant = text.rstrip("0")  # never empty: zero is integral, and never reaches here
    return f"{'-' if sign else ''}{significant}E{exponent + len(text) - len(significant)}"


def _plain_numbers(value: Any) -> Any:
    """``value`` (dicts and lists of exact types, walked) with each float and Decimal by its value;
    ``value`` itself when nothing changes, the common case."""
    kind = type(value)
    if kind is float or kind is decimal.Decimal:
        return _number(value)
    if kind is dict:
        changed = None
        for name, item in value.items():
            kept = _plain_numbers(item)
            if kept is not item:
                if changed is None:
                    changed = dict(value)
                changed[name] = kept
        return value if changed is None else changed
    if kind is list:
        items = [_plain_numbers(item) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


def _sorted_nodes(items: Any) -> list[Any]:
    """Nodes in the order of their canonical text: a deterministic order for sets and mixed keys."""
    return [node for _, node in sorted((_sorted_json(node), node) for node in items)]


def _type_path(obj: Any) -> list[str]:
    return [type(obj).__module__, type(obj).__qualname__]


def _canonical_tree(value: Any, rs0: bool = False) -> Any:
    """``value`` as JSON data in which every array is a tagged node: an injective image
    (numbers by value; by type under the earlier rules, ``rs0``)."""
    kind = type(value)
    if kind is float and not rs0:
        return _number(value)
    if kind in JSON_SCALARS:
        return value
    if kind is dict:
        if all(type(key) is str for key in value):
            return {key: _canonical_tree(item, rs0) for key, item in value.items()}
        pairs = [[_canonical_tree(key, rs0), _canonical_tree(item, rs0)] for key, item in value.items()]
        return ["dict", *_sorted_nodes(pairs)]
    if kind is list or kind is tuple:
        return [kind.__name__, *(_canonical_tree(item, rs0) for item in value)]
    if kind is set or kind is frozenset:
        return [kind.__name__, *_sorted_nodes(_canonical_tree(item, rs0) for item in value)]
    if kind is bytes or kind is bytearray or kind is memoryview:
        return [kind.__name__, bytes(value).hex()]
    if kind is dt.datetime or kind is dt.time:
        naive = value.replace(tzinfo=None, fold=0).isoformat()
        return [kind.__name__, naive, value.fold, _zone_node(value)]
    if kind is dt.date:
        return ["date", value.isoformat()]
    if kind is dt.timedelta:
        return ["timedelta", value.days, value.seconds, value.microseconds]
    if kind is decimal.Decimal:
        if rs0:
            return ["decimal", str(value)]  # rs0: the exact digits and exponent (1.0 and 1.00 differed)
        number = _number(value)
        return ["decimal", _exact_decimal(number)] if type(number) is decimal.Decimal else number
    if kind is uuid.UUID:
        return ["uuid", value.hex]
    return _class_node(value, rs0)


def _zone_node(value: dt.datetime | dt.time) -> Any:
    zone = value.tzinfo
    if zone is None:
        return None
    if type(zone) is dt.timezone:
        return ["offset", zone.utcoffset(None) // _MICROSECOND, zone.tzname(None)]
    key = getattr(zone, "key", None)
    if type(zone) is zoneinfo.ZoneInfo and key is not None:
        return ["zone", key]
    # Another kind of zone: what it says about this moment, which is all that is portable.
    probe = value if isinstance(value, dt.datetime) else None
    offset = zone.utcoffset(probe)
    micros = None if offset is None else offset // _MICROSECOND
    return ["tzinfo", *_type_path(zone), micros, zone.tzname(probe)]


_MICROSECOND = dt.timedelta(microseconds=1)


def _class_node(value: Any, rs0: bool) -> Any:
    if isinstance(value, enum.Enum):
        if isinstance(value, enum.Flag):  # a combination of flags may have no name
            return ["flag", *_type_path(value), _canonical_tree(value._value_, rs0)]
        return ["enum", *_type_path(value), value._name_]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
        return ["dataclass", *_type_path(value), _canonical_tree(fields, rs0)]
    if callable(getattr(value, "model_dump", None)) and not isinstance(value, type):  # a pydantic model
        # Its fields and extra fields as they are: model_dump would turn a dataclass in an Any field into a dict.
        return ["model", *_type_path(value), _canonical_tree(dict(value), rs0)]
    for base in _BUILTIN_BASES:
        if isinstance(value, base):  # a subclass of a builtin (a named tuple, an OrderedDict...): its type and data
            return ["instance", *_type_path(value), _canonical_tree(_BUILTIN_BASES[base](value), rs0)]
    raise TypeError(f"{type(value).__module__}.{type(value).__qualname__}")


# The exact builtin value of an instance of a subclass, read without its overrides.
_BUILTIN_BASES: dict[type, Any] = {
    bool: bool,
    int: int.__int__,
    float: float.__float__,
    str: str.__str__,
    bytes: bytes,
    dict: dict,
    list: list,
    tuple: tuple,
    set: set,
    frozenset: frozenset,
}


def _builtin_sha256_constructor() -> Callable[[bytes], Any]:
    """CPython's own SHA-256 (``_sha2`` from 3.12, ``_sha256`` before); hashlib's if the build left it out."""
    for module in ("_sha2", "_sha256"):
        try:
            return importlib.import_module(module).sha256  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            continue
    return hashlib.sha256


_builtin_sha256 = _builtin_sha256_constructor()

#: Below this many bytes (two SHA-256 blocks, padding included) CPython's own SHA-256 takes about
#: half the time of OpenSSL's through hashlib, whose context set-up outweighs hashing a short text;
#: from three blocks on OpenSSL's is faster. Most call ids and argument texts are this short.
_BUILTIN_SHA256_BELOW = 120
_openssl_sha256 = hashlib.sha256


def _sha256(text: str) -> str:
    """The hex SHA-256 of ``text``'s UTF-8 bytes (whichever implementation is faster for its size)."""
    try:
        data = text.encode()  # the same bytes as below, unless the text holds a lone surrogate
    except UnicodeEncodeError:
        # surrogatepass: a lone surrogate in an id or argument must digest, not crash.
        data = text.encode("utf-8", "surrogatepass")
    if len(data) < _BUILTIN_SHA256_BELOW:
        return _builtin_sha256(data).hexdigest()  # type: ignore[no-any-return]
    return _openssl_sha256(data).hexdigest()


def args_digest(arguments: Mapping[str, Any], *, tool_name: str, rs0: bool = False) -> str:
    """The digest of a call's arguments, bound by name; stable across processes (docs/keys.md).
    ``rs0``: under the earlier rules, to find a record written under them."""
    try:
        return _sha256(_rs0_args_text(arguments) if rs0 else _args_text(arguments))
    except (TypeError, ValueError, RecursionError) as exc:
        name = _offending_argument(arguments)
        raise ArgumentDigestError(
            f"cannot digest argument {name!r} of {tool_name} ({exc}): it is not data. "
            f"Leave it out of the digest with @replay_safe(exclude_args=({name!r},)).",
            tool_name=tool_name,
        ) from exc


# --- the fast path: calls bound to one signature ----------------------------------------
#
# Sorted-key JSON is compositional: the text of a dict is "{", then for each key in
# sorted order the key's text, ":" and the value's text, joined by ",", then "}".
# A tool's bound arguments always carry the same names, so each "key:" head is
# computed once, and only the values are encoded per call, each scalar by the very
# function the C encoder calls for its type, a list or dict of plain data by the
# encoder itself. Any other value (or a name set that differs) takes the general
# path, which gives the same text by construction; the property tests compare the two.

_string_text = json.encoder.encode_basestring  # the C encoder's function for ensure_ascii=False


def _float_text(value: float) -> str:
    """A float's text by value (rs1): integral as an int; NaN and infinities raise ValueError
    (then the general path names the argument)."""
    if value.is_integer():
        return int.__repr__(int(value))
    if value != value or value in (math.inf, -math.inf):
        raise ValueError("NaN and infinite numbers have no value to compare")
    return float.__repr__(value)


_SCALAR_TEXT: dict[type, Callable[[Any], str]] = {
    int: int.__repr__,  # an int too long to print raises ValueError: the general path then names it
    float: _float_text,
    bool: lambda value: "true" if value else "false",
    type(None): lambda value: "null",
}


class SignatureDigest:
    """``args_digest`` of an argument mapping without the names in ``exclude`` and without the
    arguments equal to their parameter's default (``defaults``), fast for mappings of ``names``.

    The same digest, computed without the general path's checks when every value is
    a JSON scalar of an exact type, or plain JSON data; from the bound mapping, or
    (``of_positional``) straight from the values of every name in order. An argument
    equal to its default is left out (docs/keys.md): a parameter added with a default
    does not change the digest of the calls made before it existed.
    """

    __slots__ = ("_by_name", "_by_position", "_default_objects", "_defaults", "_exclude")

    def __init__(
        self, names: Collection[str], exclude: Collection[str] = (), defaults: Mapping[str, Any] | None = None
    ) -> None:
        self._exclude = frozenset(exclude)
        order = list(names)
        kept = sorted(name for name in order if name not in self._exclude)
        # Each default's canonical text, in the general form and in the fast one (None: a default
        # without one, which no argument is ever taken to equal).
        given = defaults or {}
        # An argument that is its default object is at its default, whether or not it has a digest
        # (``math.inf``, a sentinel ``object()``): a call that leaves it out is then digested as it is.
        self._default_objects = {name: given[name] for name in kept if name in given}
        self._defaults = {name: _tree_text(given[name]) for name in kept if name in given}
        fast_defaults = [_fast_text(given[name]) if name in given else None for name in kept]
        heads = ["," + _string_text(name) + ":" for name in kept]
        # A name the result codec reserves makes the mapping take the tagged form: never fast.
        fast = TAG_KEY not in kept
        self._by_name: tuple[tuple[str, str, str | None], ...] | None = (
            tuple(zip(heads, kept, fast_defaults, strict=True)) if fast else None
        )
        self._by_position: tuple[tuple[str, int, str | None], ...] | None = (
            tuple(zip(heads, [order.index(name) for name in kept], fast_defaults, strict=True)) if fast else None
        )

    def __call__(self, arguments: dict[str, Any], tool_name: str) -> str:
        text = self.text(arguments)
        if text is not None:
            return _sha256(text)
        general = {
            name: value
            for name, value in arguments.items()
            if name not in self._exclude and not self._at_default(name, value)
        }
        return args_digest(general, tool_name=tool_name)

    def _at_default(self, name: str, value: Any) -> bool:
        if name in self._default_objects and value is self._default_objects[name]:
            return True
        default = self._defaults.get(name)
        return default is not None and _tree_text(value) == default

    def of_positional(self, values: tuple[Any, ...]) -> str | None:
        """The digest of a call that gave ``values``, one for each of ``names`` in order; ``None``
        when a value is not of the common shapes (then the bound mapping goes to ``__call__``)."""
        heads = self._by_position
        text = None if heads is None else _joined(heads, values)
        return None if text is None else _sha256(text)

    def text(self, arguments: dict[str, Any]) -> str | None:
        """The canonical text of ``arguments`` without the excluded names; ``None`` for the general path."""
        heads = self._by_name
        if heads is None or type(arguments) is not dict:
            return None
        given = len(arguments)
        if self._exclude:
            given -= len(self._exclude.intersection(arguments))
        if given != len(heads):
            return None  # then each name found below makes the key sets equal
        return _joined(heads, arguments)


def _tree_text(value: Any) -> str | None:
    """A value's canonical text in the general form, ``None`` if it has none."""
    try:
        return _sorted_json(_canonical_tree(value))
    except (TypeError, ValueError, RecursionError):
        return None


def _fast_text(value: Any) -> str | None:
    """A value's text as ``_joined`` writes it, ``None`` if it takes the general path."""
    try:
        text = _joined(((",", 0, None),), (_plain_numbers(value),))  # "{" + its text + "}"
    except (TypeError, ValueError, RecursionError):
        return None
    return None if text is None else text[1:-1]


def _joined(
    heads: tuple[tuple[str, Any, str | None], ...],
    source: Any,
    _string: type = str,
    _string_text: Callable[[str], str] = _string_text,
    _scalars: dict[type, Callable[[Any], str]] = _SCALAR_TEXT,
) -> str | None:
    """``{`` then each head (``,"name":``) and the text of ``source[at]``, unless that is its default's
    text, then ``}``: sorted-key JSON of the values the heads name (by name in a mapping, by position
    in a tuple); ``None`` for the general path."""
    text = ""
    try:
        for head, at, default in heads:
            value = source[at]
            kind = type(value)
            if kind is _string:
                piece = _string_text(value)
            elif (encode := _scalars.get(kind)) is not None:
                piece = encode(value)
            elif (kind is dict or kind is list) and is_plain(value):
                piece = _sorted_json(_plain_numbers(value))  # sorted-key JSON is compositional: the value's own text
            else:
                return None
            if piece != default:
                text += head + piece
    except (KeyError, ValueError, RecursionError):
        return None  # another name set, or a value the general path reports
    return "{" + text[1:] + "}"


def _offending_argument(arguments: Mapping[str, Any]) -> str:
    for name, value in arguments.items():
        try:
            _sorted_json(_canonical_tree(value))
        except (TypeError, ValueError, RecursionError):
            return name
    return "?"  # pragma: no cover - only reached when the mapping itself cannot encode


def key_digest(thread_id: str, message_id: str, tool_call_id: str) -> str:
    """One fixed-size key for three ids of any length (a btree cannot hold 3 x 64 KB)."""
    return _sha256(_canonical([thread_id, message_id, tool_call_id]))


def idempotency_key(*parts: Any, namespace: str | None = None) -> str:
    """A deterministic key to hand to a payment or email provider.

    Built from stable inputs such as an order id, never from a random value or a
    clock: the same parts give the same key in every process. It is ``rs-`` and 40
    lowercase hex digits, which fits Stripe's 255-character limit and the
    alphabets email APIs accept.
    """
    if not parts:
        raise ValueError("idempotency_key() needs at least one part, such as an order id")
    try:
        text = _canonical([namespace, list(parts)])
    except (TypeError, ValueError) as exc:
        raise ArgumentDigestError(f"idempotency_key() parts must be data (str, int, UUID, ...); got {exc}") from exc
    return "rs-" + _sha256(text)[:40]


def call_idempotency_key(thread_id: str, message_id: str, tool_call_id: str, tool_name: str) -> str:
    """The key ``current_call().idempotency_key`` gives: the same on every attempt and replay."""
    return idempotency_key(thread_id, message_id, tool_call_id, tool_name, namespace="replaysafe.call")
