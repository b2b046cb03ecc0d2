"""Streaming (generator) tools: chunks flow as they come, the whole sequence is recorded."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from replaysafe import CallKey, Ledger, Status, current_call, replay_safe, tool_call

CHILD = str(Path(__file__).with_name("child.py"))


def new_key() -> CallKey:
    return CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")


def test_a_stream_replays_its_recorded_chunks(ledger: Ledger) -> None:
    """Chunks reach the caller one by one; a replay yields the recorded chunks without running."""
    produced: list[str] = []

    @replay_safe(ledger=ledger)
    def lines(n: int) -> Iterator[str]:
        for i in range(n):
            info = current_call()
            assert info is not None
            produced.append(f"line {i}")
            yield f"line {i}"

    key = new_key()
    received: list[tuple[str, int]] = []
    with tool_call(*key):
        for chunk in lines(3):
            received.append((chunk, len(produced)))  # the caller sees each chunk as it is made
    assert received == [("line 0", 1), ("line 1", 2), ("line 2", 3)]
    with tool_call(*key):
        assert list(lines(3)) == ["line 0", "line 1", "line 2"]
    assert len(produced) == 3
    record = ledger.get(key)
    assert record is not None
    assert record.status is Status.COMPLETED


async def test_an_async_stream_replays(ledger: Ledger) -> None:
    """Async generator tools are protected the same way."""
    produced: list[int] = []

    @replay_safe(ledger=ledger)
    async def numbers(n: int) -> AsyncIterator[int]:
        for i in range(n):
            produced.append(i)
            yield i

    key = new_key()
    for _ in range(2):
        async with tool_call(*key):
            assert [x async for x in numbers(4)] == [0, 1, 2, 3]
    assert produced == [0, 1, 2, 3]


@dataclasses.dataclass
class Row:
    id: int
    name: str


def test_streamed_dataclasses_revive_by_annotation(ledger: Ledger) -> None:
    """Iterator[Row] chunks come back as Row on replay."""

    @replay_safe(ledger=ledger)
    def rows() -> Iterator[Row]:
        yield Row(1, "a")
        yield Row(2, "b")

    key = new_key()
    with tool_call(*key):
        first = list(rows())
    with tool_call(*key):
        assert list(rows()) == first == [Row(1, "a"), Row(2, "b")]


def test_a_consumer_that_stops_early_leaves_the_call_in_doubt(ledger: Ledger) -> None:
    """Closing the stream early stops the tool; part of it ran, so the call is in doubt."""
    closed: list[bool] = []

    @replay_safe(ledger=ledger)
    def lines() -> Iterator[str]:
        try:
            yield from ("a", "b", "c")
        finally:
            closed.append(True)

    key = new_key()
    with tool_call(*key):
        stream = lines()
        assert next(stream) == "a"
        stream.close()
    assert closed == [True]
    record = ledger.get(key)
    assert record is not None
    assert record.status is Status.IN_DOUBT


def test_an_error_mid_stream_releases_the_call(ledger: Ledger) -> None:
    """A stream that raises is treated like any raising tool: released, error propagates."""

    @replay_safe(ledger=ledger)
    def broken() -> Iterator[int]:
        yield 1
        raise ValueError("feed broke")

    key = new_key()
    with tool_call(*key), pytest.raises(ValueError, match="feed broke"):
        list(broken())
    assert ledger.get(key) is None


def test_a_crash_mid_stream_is_in_doubt(durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path) -> None:
    """A process SIGKILLed after two chunks leaves the call in doubt; the resume runs it again."""
    effects = tmp_path / "effects"
    thread = f"t-{uuid.uuid4().hex[:8]}"
    crashed = subprocess.run(
        [sys.executable, CHILD, "stream", durable_ledger_url, str(effects), thread], capture_output=True, text=True
    )
    assert crashed.returncode == -9, crashed.stderr
    key = CallKey(thread, "msg_1", "call_1")
    record = durable_ledger.get(key)
    assert record is not None
    assert record.status is Status.RUNNING

    @replay_safe(ledger=durable_ledger, in_doubt="raise")
    def lines(n: int) -> Iterator[str]:
        yield "never"

    from replaysafe import CallInDoubtError

    with tool_call(*key), pytest.raises(CallInDoubtError):
        list(lines(5))
    assert effects.read_text().splitlines() == ["chunk 0", "chunk 1"]


def test_a_stream_past_its_timeout_stops_between_chunks_on_the_runs_clock(
    memory_ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's deadline is checked between chunks, on the run's own monotonic clock (the one
    the protocol is handed), not on the process's: here that clock moves 10 s per look, so a
    stream with a 25 s timeout ends with ``ToolTimeoutError`` after a few chunks, its source
    closed, and nothing of it recorded as a result."""
    from replaysafe import ToolTimeoutError, _drivers

    # Far ahead of the process's own monotonic clock, so that reading that one instead never looks late.
    ticks = itertools.count(time.monotonic() + 1e6, 10)
    fast = _drivers.HOST._replace(monotonic=lambda: next(ticks))
    monkeypatch.setattr(_drivers, "HOST", fast)
    monkeypatch.setattr(_drivers, "hosts", {})  # hosts made per ledger kind derive from HOST anew
    made: list[int] = []
    closed: list[bool] = []

    @replay_safe(ledger=memory_ledger, timeout=25)
    def numbers() -> Iterator[int]:
        try:
            for i in range(1000):
                made.append(i)
                yield i
        finally:
            closed.append(True)

    key = new_key()
    received: list[int] = []

    def consume() -> None:
        with tool_call(*key):
            received.extend(numbers())

    with pytest.raises(ToolTimeoutError) as raised:
        consume()
    assert raised.value.timeout == 25 and raised.value.key == key
    assert 1 <= len(made) < 10 and received == made[:-1] and closed == [True]
    record = memory_ledger.get(key)
    assert record is not None and record.status is not Status.COMPLETED
