"""The domain of values a result (and an argument) may be, as hypothesis strategies.

Shared by the codec, digest and ledger tests: the classes live at module level, as a
tool's return types would, so the codec finds them again by name. ``shape`` is an
independent exact form: two values have the same shape exactly when they are equal
with the same type at every level (NaN equal to itself, a Decimal's exponent and a
time zone's identity counted).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import math
import uuid
import zoneinfo
from typing import Any

import pydantic
from hypothesis import strategies as st

TAG = "__replaysafe__"


class Color(enum.Enum):
    RED = "red"
    GREEN = 2
    PAIR = (1, "a")


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mode(str, enum.Enum):  # enum.StrEnum before 3.11
    READ = "read"
    WRITE = "write"


class Perm(enum.Flag):
    R = 4
    W = 2
    X = 1


@dataclasses.dataclass
class Point:
    x: Any
    y: Any = None


@dataclasses.dataclass(frozen=True)
class Label:
    name: str
    n: int


@dataclasses.dataclass
class Sized:
    """A field set in ``__post_init__`` (init=False) must come back as it was."""

    items: list[Any]
    size: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.size = len(self.items)


class Receipt(pydantic.BaseModel):
    id: uuid.UUID
    total: decimal.Decimal
    tags: tuple[str, ...] = ()
    payload: Any = None


class Aliased(pydantic.BaseModel):
    order_id: str = pydantic.Field(alias="orderId")


ZONES = [
    dt.timezone.utc,
    dt.timezone(dt.timedelta(hours=5, minutes=30)),
    dt.timezone(dt.timedelta(hours=-3), "BRT"),
    dt.timezone(dt.timedelta(seconds=-1, microseconds=7)),
    zoneinfo.ZoneInfo("Europe/Paris"),
    zoneinfo.ZoneInfo("America/New_York"),
    zoneinfo.ZoneInfo("UTC"),
]
zones = st.sampled_from(ZONES)
folds = st.sampled_from([0, 1])

floats = st.floats(allow_nan=True, allow_infinity=True) | st.just(-0.0)
hashable_decimals = st.decimals(allow_nan=False, allow_infinity=True) | st.sampled_from(
    [decimal.Decimal(text) for text in ("-0.00", "1E+3", "NaN", "-NaN", "NaN12")]
)
decimals = hashable_decimals | st.just(decimal.Decimal("sNaN"))  # a signalling NaN cannot be hashed
datetimes = st.builds(lambda d, zone, fold: d.replace(tzinfo=zone, fold=fold), st.datetimes(), st.none() | zones, folds)
times = st.builds(lambda t, zone, fold: t.replace(tzinfo=zone, fold=fold), st.times(), st.none() | zones, folds)
members = st.sampled_from([*Color, *Level, *Mode, *Perm, Perm.R | Perm.W, Perm.R | Perm.W | Perm.X, Perm(0)])
json_scalars = st.none() | st.booleans() | st.integers() | floats | st.text(max_size=8) | st.just(TAG) | st.just("v")
hashable_scalars = (
    json_scalars
    | st.binary(max_size=8)
    | datetimes
    | st.dates()
    | times
    | st.timedeltas()
    | hashable_decimals
    | st.uuids()
    | members
)
scalars = hashable_scalars | decimals
hashables = st.recursive(
    hashable_scalars | st.builds(Label, st.text(max_size=4), st.integers()),
    lambda inner: st.tuples(inner, inner) | st.lists(inner, max_size=3).map(tuple) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
dict_keys = json_scalars | st.lists(json_scalars, max_size=3).map(tuple)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.sets(hashables, max_size=3)
        | st.frozensets(hashables, max_size=3)
        | st.dictionaries(st.text(max_size=6) | st.just(TAG) | st.just("v"), inner, max_size=4)
        | st.dictionaries(dict_keys, inner, max_size=4)
        | st.builds(Point, inner, inner)
        | st.builds(Sized, st.lists(inner, max_size=3))
        | st.builds(Receipt, id=st.uuids(), total=st.decimals(allow_nan=False, allow_infinity=False), payload=inner)
    )


#: Everything a result may be.
values = st.recursive(
    scalars | hashables | st.binary(max_size=8).map(bytearray) | st.builds(Aliased, orderId=st.text(max_size=6)),
    _containers,
    max_leaves=12,
)


def shape(value: Any) -> Any:
    """An exact, type-tagged form of ``value``: equal shapes mean equal values of equal types."""
    kind = type(value)
    if kind is float:
        return ("float", "nan" if math.isnan(value) else repr(value))
    if kind is decimal.Decimal:
        return ("Decimal", str(value))
    if kind in (list, tuple):
        return (kind.__name__, tuple(shape(v) for v in value))
    if kind in (set, frozenset):
        return (kind.__name__, tuple(sorted((shape(v) for v in value), key=repr)))
    if kind is dict:
        return ("dict", tuple(sorted(((shape(k), shape(v)) for k, v in value.items()), key=repr)))
    if kind in (dt.datetime, dt.time):
        zone = value.tzinfo
        return (kind.__name__, value.replace(tzinfo=None).isoformat(), value.fold, _zone_shape(zone))
    if isinstance(value, enum.Enum):
        return (kind.__qualname__, value._value_)
    if dataclasses.is_dataclass(value):
        return (kind.__qualname__, shape(vars(value)))
    if isinstance(value, pydantic.BaseModel):
        return (kind.__qualname__, shape(dict(value)), shape(value.__pydantic_extra__ or {}))
    return (kind.__qualname__, repr(value))


def _zone_shape(zone: dt.tzinfo | None) -> Any:
    if zone is None:
        return None
    if isinstance(zone, zoneinfo.ZoneInfo):
        return ("ZoneInfo", zone.key)
    return (type(zone).__qualname__, zone.utcoffset(None), zone.tzname(None))


def has_nan(value: Any) -> bool:
    """Whether a NaN (float or Decimal) hides in ``value``: then ``==`` cannot say equal."""
    return _has_nan(shape(value))


def _has_nan(node: Any) -> bool:
    if type(node) is not tuple:
        return False
    if len(node) == 2 and node[0] in ("float", "Decimal") and type(node[1]) is str:
        return node[1] == "nan" or "NaN" in node[1]
    return any(_has_nan(part) for part in node)


def assert_exact(got: Any, expected: Any) -> None:
    """``got`` equals ``expected`` with the same type at every level."""
    assert shape(got) == shape(expected)
    if not has_nan(expected):
        assert got == expected
