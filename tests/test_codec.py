"""Result encoding: JSON with tagged types, never pickle; exact round trips or a refusal at dumps."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import json
import subprocess
import sys
import uuid
from typing import Any, NamedTuple, Optional

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaysafe import JsonSerializer, ResultEncodingError
from replaysafe._codec import ResultDecodingError, reviver_for

from .ids import stable_repr
from .result_domain import TAG, Aliased, Color, Label, Level, Mode, Perm, Point, Receipt, Sized, assert_exact, values

codec = JsonSerializer()
SECRET = "4111111111111111"


@settings(max_examples=200, deadline=None)
@given(values)
def test_round_trip_is_exact(value: Any) -> None:
    """Every value of the domain decodes equal and of the same type at every level, with no annotation."""
    assert_exact(codec.loads(codec.dumps(value)), value)


REPORTED = [
    {(1, "a"), (2, "b")},  # a set of tuples was written but could not be read
    frozenset({("x", 1)}),
    {TAG: "bytes", "v": "AA=="},  # user data shaped like a tag replayed as bytes
    {TAG: "nope", "v": 1},
    {TAG: "set", "v": [1], "extra": (1, 2)},
    [{"v": {TAG: "tuple", "v": []}}],
    {1: "a"},  # keys changed type
    {True: 1, None: 2},
    {1: "int", "1": "str"},  # keys collided
    {1.5: "float", (1, "a"): "tuple", False: "bool"},
    Color.RED,  # an Enum came back as its value
    Color.PAIR,
    Level.HIGH,
    Mode.READ,
    Perm.R | Perm.W,
    (1, [2, (3,)]),  # a tuple came back as a list
    ("content", {"artifact": [1, 2]}),  # LangChain's content_and_artifact
    Point(Label("a", 1), (1, 2)),
    Sized([1, 2, 3]),
    Receipt(id=uuid.UUID(int=7), total=decimal.Decimal("9.90"), tags=("x",), payload={"p": Point(1)}),
    Aliased(orderId="1042"),
    bytearray(b"\x00\xff"),
    b"\x00",
    dt.timedelta(days=-1, microseconds=3),
    dt.time(0, 0, tzinfo=dt.timezone(-dt.timedelta(microseconds=999993))),  # fromisoformat reads it as UTC
    decimal.Decimal("-0.00"),
    -0.0,
]


@pytest.mark.parametrize("value", REPORTED, ids=stable_repr)
def test_reported_cases_round_trip_exactly(value: Any) -> None:
    """The values that came back wrong, or not at all, come back as themselves."""
    assert_exact(codec.loads(codec.dumps(value)), value)


def test_aware_times_keep_their_zone_and_fold() -> None:
    """A zone-aware datetime keeps its zone object (not just the offset) and its fold."""
    from zoneinfo import ZoneInfo

    paris = ZoneInfo("Europe/Paris")
    second = dt.datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=paris)  # the second 02:30 of that night
    named = dt.time(9, 0, tzinfo=dt.timezone(dt.timedelta(hours=-3), "BRT"))
    for value in (second, named, dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)):
        back = codec.loads(codec.dumps(value))
        assert back == value
        assert back.fold == value.fold
        assert back.tzinfo is value.tzinfo or (back.tzinfo == value.tzinfo and back.tzname() == value.tzname())
    assert codec.loads(codec.dumps(second)).tzinfo is paris


def test_plain_data_is_written_as_plain_json() -> None:
    """The fast path: plain data is json's own text, which any reader parses as is."""
    plain = {"order": "1042", "amount": 12.5, "lines": [{"sku": "a", "qty": 2}], "ok": True, "none": None}
    text = codec.dumps(plain)
    assert text == json.dumps(plain, separators=(",", ":"))
    assert json.loads(text) == plain


def test_stored_text_is_ascii_json() -> None:
    """Stored text is ASCII JSON, readable by any store and any operator."""
    text = codec.dumps({"amount": decimal.Decimal("1.10"), "name": "Zoë", "nul": "\x00", 1: (2,)})
    assert text.isascii()
    assert "\x00" not in text
    json.loads(text)


def test_nan_and_infinity_round_trip() -> None:
    """Non-finite floats survive (as JSON's NaN/Infinity extension), and Decimal's too."""
    assert codec.loads(codec.dumps([float("inf"), float("-inf")])) == [float("inf"), float("-inf")]
    (nan,) = codec.loads(codec.dumps([float("nan")]))
    assert nan != nan
    for text in ("NaN", "-sNaN", "Infinity", "NaN12"):
        assert str(codec.loads(codec.dumps(decimal.Decimal(text)))) == text


TEXTS = [
    '{"a":1}',
    ' {"a":1}',  # surrounding whitespace: json.loads reads it, the scanner alone does not
    '{"a":1}\n',
    "\ufeff[1]",  # a BOM: json.loads refuses it
    "[1] [2]",  # extra data
    "",
    "   ",
    "[1,",
    "nul",
    '"\\ud800"',
    "NaN",
    "-Infinity",
    '{"a": [1, 2.5e3, true, null, "x"]}',
]


def _assert_loads_like_json_loads(text: str) -> None:
    try:
        expected: Any = json.loads(text)
    except ValueError:
        with pytest.raises(ResultDecodingError):
            codec.loads(text)
    else:
        assert repr(codec.loads(text)) == repr(expected)  # repr: NaN is not equal to itself


@pytest.mark.parametrize("text", TEXTS)
def test_loads_reads_text_as_json_loads_does(text: str) -> None:
    """The decoder that calls json's scanner directly gives json.loads' value, or fails where it fails."""
    _assert_loads_like_json_loads(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=' {}[]",:0123456789.eE+-truefalsnul\\ \n\ufeff', max_size=24))
def test_loads_matches_json_loads_on_any_text(text: str) -> None:
    _assert_loads_like_json_loads(text)


class Refused(NamedTuple):
    """A named tuple: a tuple subclass the codec would give back as a bare tuple."""

    number: str


class SecretStr(str):
    pass


class SecretInt(int):
    pass


class OwnZone(dt.tzinfo):
    def utcoffset(self, when: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(hours=1)

    def tzname(self, when: dt.datetime | None) -> str:
        return "OWN"

    def dst(self, when: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(0)


def _local_dataclass() -> Any:
    @dataclasses.dataclass
    class Local:  # found by no name in another process
        card: str

    return Local(SECRET)


def _local_enum() -> Any:
    class Local(enum.Enum):
        CARD = SECRET

    return Local.CARD


REFUSED = [
    lambda: object(),
    lambda: memoryview(SECRET.encode()),
    lambda: SecretStr(SECRET),
    lambda: SecretInt(int(SECRET)),
    lambda: Refused(SECRET),
    lambda: collections.OrderedDict(card=SECRET),
    lambda: collections.defaultdict(list, card=[SECRET]),
    lambda: dt.datetime(2026, 1, 1, tzinfo=OwnZone()),
    _local_dataclass,
    _local_enum,
    lambda: {frozenset({SecretStr(SECRET)})},
    lambda: {SecretStr(SECRET): 1},
    lambda: Point(object()),
    lambda: _mapping_holding(SECRET),  # a dataclass that is a dict: its contents are not fields
    lambda: Derived(SECRET),  # an attribute set in __post_init__, not a field
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(REFUSED), st.integers(0, 3), values)
def test_values_that_would_not_come_back_are_refused_at_dumps(make: Any, depth: int, sibling: Any) -> None:
    """A value the codec cannot rebuild exactly, anywhere in a result, is refused when recorded.

    The message names the type, never the value.
    """
    value = make()
    for level in range(depth):
        value = [sibling, value] if level % 2 else {"k": value, "s": sibling}
    with pytest.raises(ResultEncodingError) as caught:
        codec.dumps(value)
    assert SECRET not in str(caught.value)
    assert SECRET[:6] not in str(caught.value)


def test_unencodable_type_is_named() -> None:
    """The error says which type could not be encoded, and why."""

    class Socket:
        pass

    with pytest.raises(ResultEncodingError, match="Socket"):
        codec.dumps({"conn": Socket()})
    with pytest.raises(ResultEncodingError, match="define it at module level"):
        codec.dumps(_local_dataclass())


def test_circular_data_is_an_encoding_error() -> None:
    """A circular structure is a clear error, not a crash."""
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ResultEncodingError):
        codec.dumps(loop)
    looped: dict[str, Any] = {}
    looped["me"] = (looped,)
    with pytest.raises(ResultEncodingError):
        codec.dumps(looped)


def _tag(tag: str, payload: Any) -> str:
    return json.dumps({TAG: tag, "v": payload})


def test_stored_names_never_import_a_module() -> None:
    """A class named by stored data is looked up among loaded modules only; nothing is imported."""
    code = (
        "import sys, json; from replaysafe import JsonSerializer; from replaysafe._codec import ResultDecodingError\n"
        f"text = json.dumps({{'{TAG}': 'enum', 'v': ['this', 'Zen', 'A']}})\n"
        "try:\n    JsonSerializer().loads(text)\nexcept ResultDecodingError as exc:\n    print('refused', exc)\n"
        "print('imported' if 'this' in sys.modules else 'not imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert "not imported" in out
    assert "refused" in out
    assert "Zen of Python" not in out  # importing `this` prints it


@pytest.mark.parametrize(
    ("tag", "payload"),
    [
        ("enum", ["os", "system", "A"]),  # a function, not an Enum
        ("enum", ["subprocess", "Popen", "A"]),  # a class, not an Enum
        ("flag", ["tests.result_domain", "Color", 1]),  # an Enum, not a Flag
        ("dataclass", ["subprocess", "Popen", {"args": "x"}]),  # not a dataclass
        ("model", ["tests.result_domain", "Point", {"x": 1}]),  # a dataclass, not a model
        ("dataclass", ["tests.result_domain", "nope.Point", {}]),
        ("dataclass", ["tests.result_domain", "Point", {"x": 1, "z": 2}]),  # a field the class lacks
        ("dataclass", ["tests.result_domain", "Label", {"name": "a"}]),  # a required field missing
        ("enum", ["tests.result_domain", "Color", "BLUE"]),  # a member the Enum lacks
        ("model", ["tests.test_codec", "Cached", {"n": 1, "gone": 2}, None, None, ["n"]]),  # a removed field
        ("model", ["tests.test_codec", "Cached", {}, None, None, []]),  # a required field missing
        ("nope", 1),
        ("tuple", "not a list"),
    ],
)
def test_a_name_that_is_not_the_expected_kind_of_class_does_not_decode(tag: str, payload: Any) -> None:
    """Only a loaded Enum, Flag, dataclass or pydantic model of the right kind is rebuilt."""
    with pytest.raises(ResultDecodingError):
        codec.loads(_tag(tag, payload))


def test_a_dataclass_field_added_with_a_default_takes_it() -> None:
    """A record written before a field with a default was added decodes with that default."""
    assert codec.loads(_tag("dataclass", ["tests.result_domain", "Point", {"x": 1}])) == Point(1, None)


def test_decode_errors_carry_no_stored_values() -> None:
    """A record that does not decode (a changed model, a corrupt value) names types only."""
    changed = _tag("model", ["tests.result_domain", "Receipt", {"id": SECRET, "total": "1"}])
    corrupt = [
        changed,
        _tag("datetime", f"{SECRET}T00:00"),
        _tag("decimal", SECRET + "x"),
        _tag("uuid", SECRET),
        _tag("bytes", SECRET + "!"),
        _tag("enum", ["tests.result_domain", "Color", SECRET]),
        _tag("dataclass", ["tests.result_domain", "Point", {SECRET: 1}]),
        '{"a": "' + SECRET,
    ]
    for text in corrupt:
        with pytest.raises(ResultDecodingError) as caught:
            codec.loads(text)
        assert SECRET not in str(caught.value), text
        error = caught.value
        assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


def test_records_of_the_previous_format_still_decode() -> None:
    """Tags the previous codec wrote read back as before."""
    old = (
        '[{"__replaysafe__":"datetime","v":"2026-01-01T00:00:00+00:00"},'
        '{"__replaysafe__":"set","v":[1,2]},{"__replaysafe__":"bytes","v":"AA=="},'
        '{"__replaysafe__":"dict","v":[["__replaysafe__","x"]]},{"__replaysafe__":"decimal","v":"1.10"}]'
    )
    assert codec.loads(old) == [
        dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        {1, 2},
        b"\x00",
        {TAG: "x"},
        decimal.Decimal("1.10"),
    ]


@dataclasses.dataclass
class Dated:
    x: int
    when: dt.date


class Tier(enum.Enum):
    GOLD = "gold"


def test_revivers_rebuild_older_untyped_records_by_annotation() -> None:
    """An older record stored a dataclass as a dict, a tuple as a list, an Enum as its value:
    the annotation rebuilds them; values this codec typed are left as they are."""
    point = Dated(1, dt.date(2026, 1, 2))
    data = {"x": 1, "when": dt.date(2026, 1, 2)}
    assert reviver_for(Dated)(data) == point  # type: ignore[misc]
    assert reviver_for(Optional[Dated])(None) is None  # type: ignore[misc] # noqa: UP045
    assert reviver_for(tuple[Dated, ...])([data]) == (point,)  # type: ignore[misc]
    assert reviver_for(dict[str, Dated])({"a": data}) == {"a": point}  # type: ignore[misc]
    assert reviver_for(set[int])([1, 2]) == {1, 2}  # type: ignore[misc]
    assert reviver_for(Tier)("gold") is Tier.GOLD  # type: ignore[misc]
    assert reviver_for(Receipt)({"id": str(uuid.UUID(int=1)), "total": "1"}) == Receipt(  # type: ignore[misc]
        id=uuid.UUID(int=1), total=decimal.Decimal("1")
    )
    typed = codec.loads(codec.dumps(frozenset({(1, point.when)})))
    kept = reviver_for(set[tuple[int, dt.date]])(typed)  # type: ignore[misc]
    assert type(kept) is frozenset and kept == typed
    assert reviver_for(tuple[int, str])((1, "a")) == (1, "a")  # type: ignore[misc]
    assert reviver_for(str) is None
    assert reviver_for(Any) is None
    assert reviver_for(int | str) is None


def test_pydantic_private_state_round_trips() -> None:
    """A model's private attributes come back with it."""

    value = Cached(n=2)
    value._hits = 5
    back = codec.loads(codec.dumps(value))
    assert back == value
    assert back._hits == 5


class Cached(pydantic.BaseModel):
    n: int
    _hits: int = pydantic.PrivateAttr(default=0)


@dataclasses.dataclass
class Mapping(dict):  # type: ignore[type-arg]
    x: int = 0


def _mapping_holding(secret: str) -> Mapping:
    mapping = Mapping()
    mapping["card"] = secret
    return mapping


@dataclasses.dataclass
class Derived:
    card: str

    def __post_init__(self) -> None:
        self.last4 = self.card[-4:]


class Scaled(pydantic.BaseModel):
    cents: int

    @pydantic.field_validator("cents")
    @classmethod
    def _to_cents(cls, value: int) -> int:
        return value * 100


class Ids(pydantic.RootModel[list[int]]):
    pass


def test_a_model_is_rebuilt_as_it_was_never_validated_again() -> None:
    """A validator that transforms its input ran when the model was made: a replay returns
    that model, not the validator applied a second time; so does a model changed after."""
    value = Scaled(cents=5)
    assert codec.loads(codec.dumps(value)) == value
    value.cents = 7  # no validation on assignment
    assert_exact(codec.loads(codec.dumps(value)), value)
    assert codec.loads(codec.dumps(value)).model_fields_set == {"cents"}


def test_a_root_model_round_trips() -> None:
    value = Ids([101, 102])
    assert_exact(codec.loads(codec.dumps(value)), value)
