"""Bad input and hostile data: each gets a clear error, and nothing is lost."""

from __future__ import annotations

import logging
import sqlite3
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from replaysafe import (
    ArgumentDigestError,
    CallKey,
    InvalidCallIdError,
    Ledger,
    RecordUnreadableError,
    ResultEncodingError,
    SqliteLedger,
    Status,
    replay_safe,
    tool_call,
)
from replaysafe._keys import reserved_id


@pytest.mark.parametrize(
    ("bad", "why"),
    [("a\x00b", "NUL"), ("\ud800", "lone surrogate"), ("x" * 65537, "limit is 65536"), ("é" * 40000, "limit")],
)
def test_unstorable_ids_are_refused_before_any_io(bad: str, why: str) -> None:
    """NUL bytes, lone surrogates and ids over 64 KB raise InvalidCallIdError naming the id."""
    for position in range(3):
        ids = ["t", "m", "c"]
        ids[position] = bad
        with pytest.raises(InvalidCallIdError, match=why):
            tool_call(*ids)


def test_ids_at_the_limit_are_accepted_however_long_together() -> None:
    """Each id is held to the limit alone: three of 64 KB (checked together on the fast path) are accepted."""
    longest = "x" * 65536
    assert tool_call(longest, longest, longest).scope.key == CallKey(longest, longest, longest)
    assert tool_call("é" * 30000, "m", None).scope.key == CallKey("é" * 30000, "m", "")


valid_ids = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(message=valid_ids, call=valid_ids, other=valid_ids)
def test_any_storable_ids_replay_their_own_record(ledger: Ledger, message: str, call: str, other: str) -> None:
    """Ids with separators, patterns, quotes, control characters or unicode replay only their own record."""
    thread = f"t-{uuid.uuid4().hex}"

    @replay_safe(ledger=ledger)
    def echo(value: str) -> str:
        return value

    keys = {CallKey(thread, message, call), CallKey(thread, message, call + other), CallKey(thread, other, call)}
    assume(all(reserved_id(key) is None for key in keys))  # replaysafe's own key spaces: tests/test_reserved_ids.py
    for key in keys:
        with tool_call(*key):
            assert echo("|".join(key)) == "|".join(key)
    for key in keys:
        with tool_call(*key):
            assert echo("|".join(key)) == "|".join(key)
        record = ledger.get(key)
        assert record is not None
        assert record.key == key
    assert ledger.purge_thread(thread) == len(keys)


def test_ten_kilobyte_ids_are_accepted(ledger: Ledger) -> None:
    """Long ids are stored as they are and replay."""
    key = CallKey("t" * 10240, "m" * 10240, "c" * 10240)
    runs: list[int] = []

    @replay_safe(ledger=ledger)
    def tool() -> int:
        runs.append(1)
        return 7

    for _ in range(2):
        with tool_call(*key):
            assert tool() == 7
    assert runs == [1]
    record = ledger.get(key)
    assert record is not None
    assert record.key == key
    ledger.purge_thread(key.thread_id)


def test_a_huge_result_is_returned_and_the_call_recorded_as_run(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """A 50 MB result is over max_result_bytes: a clear error is logged, the caller still gets it,
    and the call is recorded as run without its result, so a replay does not run it again."""
    big = "x" * (50 * 1024 * 1024)
    runs: list[int] = []

    @replay_safe(ledger=ledger)
    def export() -> str:
        runs.append(1)
        return big

    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c")
    with caplog.at_level(logging.ERROR, logger="replaysafe"), tool_call(*key):
        assert export() is big
    assert any("max_result_bytes" in r.getMessage() and key.thread_id in r.getMessage() for r in caplog.records)
    record = ledger.get(key)
    assert record is not None
    assert record.status is Status.COMPLETED
    with tool_call(*key), pytest.raises(ResultEncodingError):
        export()
    assert runs == [1]


def test_max_result_bytes_is_configurable(ledger: Ledger) -> None:
    """A small limit fails closed with the result kept on the error."""

    @replay_safe(ledger=ledger, max_result_bytes=10, on_ledger_error="raise")
    def tool() -> str:
        return "more than ten bytes"

    with tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c"), pytest.raises(ResultEncodingError) as raised:
        tool()
    assert raised.value.result == "more than ten bytes"


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def test_deeply_nested_data(ledger: Ledger) -> None:
    """A result too deep to encode is returned; an argument too deep to digest is a clear error."""
    deep = nested(100_000)

    @replay_safe(ledger=ledger)
    def make() -> Any:
        return deep

    with tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c1"):
        assert make() is deep

    @replay_safe(ledger=ledger)
    def take(value: Any) -> None:
        return None

    with tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c2"), pytest.raises(ArgumentDigestError, match="value"):
        take(deep)


def corrupt(ledger: SqliteLedger, text: str) -> None:
    with closing(sqlite3.connect(ledger.path)) as connection, connection:
        connection.execute("UPDATE tool_executions SET result = ?", (text,))


@pytest.mark.parametrize("on_ledger_error", ["warn", "raise"])
def test_a_corrupt_record_raises_and_nothing_runs(tmp_path: Path, on_ledger_error: Any) -> None:
    """A record whose result cannot be decoded: the call ran, so RecordUnreadableError, whatever the
    ledger-error policy, and the tool does not run again."""
    ledger = SqliteLedger(tmp_path / "l.db")
    runs: list[int] = []

    @replay_safe(ledger=ledger, on_ledger_error=on_ledger_error)
    def tool() -> dict[str, int]:
        runs.append(1)
        return {"n": len(runs)}

    with tool_call("t", "m", "c"):
        tool()
    corrupt(ledger, '{"n": 1')
    with tool_call("t", "m", "c"), pytest.raises(RecordUnreadableError, match="cannot be decoded"):
        tool()
    assert runs == [1]
