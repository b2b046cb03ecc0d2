"""Result encoding round trips: JSON with tagged types, never pickle."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
from typing import Any, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replaysafe import JsonSerializer, ResultEncodingError
from replaysafe._codec import reviver_for

codec = JsonSerializer()

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.datetimes()
    | st.datetimes(timezones=st.timezones())
    | st.dates()
    | st.times()
    | st.decimals(allow_nan=False)
    | st.uuids()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.just("__replaysafe__") | st.just("v"), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(values)
def test_round_trip_is_exact(value: Any) -> None:
    """Every supported value decodes equal and of the same type, even dicts shaped like our tags.

    An aware datetime comes back with a fixed UTC offset: the same instant and offset,
    though not its zone's name (which ISO 8601 cannot carry).
    """
    decoded = codec.loads(codec.dumps(value))
    assert _instants(decoded) == _instants(value)
    assert _types(decoded) == _types(value)


def _instants(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _instants(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_instants(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return value


def _types(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


def test_stored_text_is_ascii_json() -> None:
    """Stored text is plain ASCII JSON, readable by any store and any operator."""
    text = codec.dumps({"amount": decimal.Decimal("1.10"), "name": "Zoë", "nul": "\x00"})
    assert text.isascii()
    assert "\x00" not in text


def test_nan_and_infinity_round_trip() -> None:
    """Non-finite floats survive (as JSON's NaN/Infinity extension)."""
    decoded = codec.loads(codec.dumps([float("inf"), float("-inf")]))
    assert decoded == [float("inf"), float("-inf")]
    (nan,) = codec.loads(codec.dumps([float("nan")]))
    assert nan != nan


def test_unencodable_type_is_named() -> None:
    """The error says which type could not be encoded."""

    class Socket:
        pass

    with pytest.raises(ResultEncodingError, match="Socket"):
        codec.dumps({"conn": Socket()})


def test_circular_data_is_an_encoding_error() -> None:
    """A circular structure is a clear error, not a crash."""
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ResultEncodingError):
        codec.dumps(loop)


@dataclasses.dataclass
class Point:
    x: int
    when: dt.date


def test_revivers_follow_the_annotation() -> None:
    """Annotations rebuild dataclasses, tuples, sets and optionals; plain types need nothing."""
    point = Point(1, dt.date(2026, 1, 2))
    data = codec.loads(codec.dumps(point))
    assert data == {"x": 1, "when": dt.date(2026, 1, 2)}
    assert reviver_for(Point)(data) == point  # type: ignore[misc]
    assert reviver_for(Optional[Point])(None) is None  # type: ignore[misc] # noqa: UP045
    assert reviver_for(tuple[Point, ...])([data]) == (point,)  # type: ignore[misc]
    assert reviver_for(dict[str, Point])({"a": data}) == {"a": point}  # type: ignore[misc]
    assert reviver_for(set[int])([1, 2]) == {1, 2}  # type: ignore[misc]
    assert reviver_for(str) is None
    assert reviver_for(Any) is None
    assert reviver_for(int | str) is None
