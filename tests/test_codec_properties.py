"""Exact replays through a real decorated tool and a real ledger, over the whole result domain."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool as langchain_tool

import replaysafe
from replaysafe import ResultEncodingError, replay_safe, tool_call
from replaysafe.ledgers import Ledger

from .ids import stable_repr
from .result_domain import Color, Label, Perm, Point, Receipt, assert_exact, values


@pytest.fixture(scope="module")
def sqlite_ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    """One SQLite file for every example of a property (a fixture per example would be too slow)."""
    path: Path = tmp_path_factory.mktemp("codec") / "ledger.db"
    with replaysafe.open_ledger(f"sqlite:///{path}") as ledger:
        yield ledger


def _ids() -> tuple[str, str, str]:
    return (f"thread-{uuid.uuid4().hex[:12]}", "msg_1", "call_1")


def _first_and_replay(ledger: Ledger, value: Any, tool: Any, runs: list[int]) -> Any:
    ids = _ids()
    with tool_call(*ids):
        assert tool() is value
    with tool_call(*ids):
        replayed = tool()
    assert runs == [1], "the replay ran the tool again"
    return replayed


@settings(max_examples=150, deadline=None)
@given(values)
def test_replay_from_sqlite_is_exact_without_annotation(sqlite_ledger: Ledger, value: Any) -> None:
    """A tool with no return annotation replays, from a SQLite record, exactly what it returned."""
    runs: list[int] = []

    @replay_safe(ledger=sqlite_ledger)
    def tool():  # type: ignore[no-untyped-def] # no annotation: the record alone must say the types
        runs.append(1)
        return value

    assert_exact(_first_and_replay(sqlite_ledger, value, tool, runs), value)


@dataclasses.dataclass(frozen=True)
class Shipment:
    label: Label
    parts: tuple[int, ...]
    at: dt.datetime


ANNOTATED: list[tuple[Any, Any]] = [
    (tuple[str, dict[str, Any]], ("content", {"artifact": (1, 2)})),
    (set[tuple[int, str]], {(1, "a"), (2, "b")}),
    (frozenset[Label], frozenset({Label("a", 1)})),
    (dict[int, str], {1: "int", 2: "two"}),
    (Color, Color.PAIR),
    (Perm, Perm.R | Perm.X),
    (Point, Point((1, 2), {3: {4}})),
    (Shipment, Shipment(Label("x", 2), (1, 2), dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))),
    (Receipt, Receipt(id=uuid.UUID(int=3), total=decimal.Decimal("1.50"), payload=[Point(1)])),
    (list[Receipt], [Receipt(id=uuid.UUID(int=4), total=decimal.Decimal("0"))]),
    (Any, {"__replaysafe__": "bytes", "v": "AA=="}),
]


@pytest.mark.parametrize(("annotation", "value"), ANNOTATED, ids=stable_repr)
def test_replay_from_sqlite_is_exact_with_annotation(sqlite_ledger: Ledger, annotation: Any, value: Any) -> None:
    """With a return annotation naming the type, the replay is exact too."""
    runs: list[int] = []

    def tool() -> Any:
        runs.append(1)
        return value

    tool.__annotations__["return"] = annotation
    assert_exact(_first_and_replay(sqlite_ledger, value, replay_safe(ledger=sqlite_ledger)(tool), runs), value)


def test_content_and_artifact_tool_replays_as_a_tuple(sqlite_ledger: Ledger) -> None:
    """A LangChain content_and_artifact tool over a protected function, with no annotation:
    the replay hands LangChain a (content, artifact) tuple again, not a list it rejects."""
    runs: list[str] = []

    @langchain_tool(response_format="content_and_artifact")
    @replay_safe(ledger=sqlite_ledger)
    def search(query: str):  # type: ignore[no-untyped-def] # as such tools are often written
        """Search the catalogue."""
        runs.append(query)
        return f"found {query}", {"hits": [1, 2], "at": dt.date(2026, 1, 1)}

    call = {"type": "tool_call", "id": "call_1", "name": "search", "args": {"query": "lamp"}}
    ids = _ids()
    with tool_call(*ids):
        first = search.invoke(call)
    with tool_call(*ids):
        replayed = search.invoke(call)
    assert runs == ["lamp"]
    assert isinstance(replayed, ToolMessage)
    assert replayed.content == first.content == "found lamp"
    assert replayed.artifact == first.artifact == {"hits": [1, 2], "at": dt.date(2026, 1, 1)}


def test_a_result_that_cannot_come_back_is_refused_when_recorded(sqlite_ledger: Ledger) -> None:
    """The first caller learns at record time that its result cannot be replayed exactly."""

    class Opaque:  # no name a replay could find it by
        pass

    @replay_safe(ledger=sqlite_ledger, on_ledger_error="raise")
    def tool() -> Any:
        return {"handle": Opaque()}

    with tool_call(*_ids()), pytest.raises(replaysafe.ReplaySafeError) as caught:
        tool()
    refusal = caught.value if isinstance(caught.value, ResultEncodingError) else caught.value.__cause__
    assert isinstance(refusal, ResultEncodingError)
    assert "Opaque" in str(refusal)
