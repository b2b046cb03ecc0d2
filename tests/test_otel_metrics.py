"""OpenTelemetry metrics: call counters by event, tool and ledger, and a ledger latency histogram."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from replaysafe import (
    LedgerError,
    PostgresLedger,
    SqliteLedger,
    UnprotectedCallWarning,
    instrument_opentelemetry,
    replay_safe,
    tool_call,
)


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    stop = instrument_opentelemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        yield reader
    finally:
        stop()


def _points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    if data is None:  # nothing was ever measured
        return []
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def _counts(reader: InMemoryMetricReader) -> dict[tuple[str, str, str | None], int]:
    return {
        (
            str(p.attributes["replaysafe.event"]),
            str(p.attributes["replaysafe.tool_name"]),
            p.attributes.get("replaysafe.ledger"),
        ): p.value
        for p in _points(reader, "replaysafe.calls")
    }


def test_executed_and_replayed_calls_are_counted_by_tool_and_ledger(
    reader: InMemoryMetricReader, tmp_path: Path
) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.db")

    @replay_safe(ledger=ledger)
    def refund_order(card: str) -> str:
        return "ok"

    thread = f"t-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        with tool_call(thread, "msg_1", "call_1"):
            refund_order("4111-SECRET")
    counts = _counts(reader)
    assert counts[("executed", "refund_order", "sqlite")] == 1
    assert counts[("replayed", "refund_order", "sqlite")] == 2

    durations = {
        (p.attributes["replaysafe.ledger"], p.attributes["replaysafe.operation"], p.attributes["replaysafe.outcome"]): p
        for p in _points(reader, "replaysafe.ledger.duration")
    }
    claims = durations[("sqlite", "claim", "ok")]
    assert claims.count == 3 and claims.sum > 0
    assert durations[("sqlite", "complete", "ok")].count == 1
    # Metrics carry tool names and ledger kinds only: no ids (a series per call), never values.
    everything = repr([dict(p.attributes) for p in _points(reader, "replaysafe.calls")]) + repr(list(durations))
    assert thread not in everything and "SECRET" not in everything and "call_1" not in everything
    ledger.close()


def test_every_unprotected_call_is_counted(reader: InMemoryMetricReader) -> None:
    @replay_safe
    def send_email(to: str) -> None:
        pass

    with pytest.warns(UnprotectedCallWarning):  # said once ...
        for _ in range(3):
            send_email("someone")
    assert _counts(reader)[("unprotected", "send_email", None)] == 3  # ... counted every time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_failed_ledger_operation_is_measured_as_an_error(reader: InMemoryMetricReader) -> None:
    """A PostgreSQL ledger whose server is gone: the claim fails, and is measured and counted as such."""
    ledger = PostgresLedger(f"postgresql://root@127.0.0.1:{_free_port()}/test", connect_timeout=1, create_schema=False)

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    def refund_order(order_id: str) -> str:
        return "ok"

    with tool_call(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1"), pytest.raises(LedgerError):
        refund_order("o-1")
    failed = [
        p
        for p in _points(reader, "replaysafe.ledger.duration")
        if p.attributes["replaysafe.outcome"] == "error" and p.attributes["replaysafe.operation"] == "claim"
    ]
    assert [p.attributes["replaysafe.ledger"] for p in failed] == ["postgres"]
    assert _counts(reader)[("ledger_error", "refund_order", "postgres")] == 1
    ledger.close()


def test_stopping_stops_both(tmp_path: Path) -> None:
    reader = InMemoryMetricReader()
    stop = instrument_opentelemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    stop()
    ledger = SqliteLedger(tmp_path / "ledger.db")

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str) -> str:
        return "ok"

    with tool_call("t1", "msg_1", "call_1"):
        refund_order("o-1")
    assert _points(reader, "replaysafe.calls") == [] and _points(reader, "replaysafe.ledger.duration") == []
    ledger.close()
