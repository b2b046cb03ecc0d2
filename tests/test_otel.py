"""OpenTelemetry spans from events, captured by the SDK's in-memory exporter."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from replaysafe import MemoryLedger, instrument_opentelemetry, replay_safe, tool_call


def test_calls_become_spans_with_ids_and_no_data() -> None:
    """An executed and a replayed call give two spans carrying the ids, not the arguments."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    stop = instrument_opentelemetry(provider)
    ledger = MemoryLedger()

    @replay_safe(ledger=ledger)
    def refund_order(card: str) -> str:
        return "ok"

    try:
        for _ in range(2):
            with tool_call("t-otel", "msg_1", "call_1"):
                refund_order("4111-SECRET")
    finally:
        stop()
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["replaysafe executed refund_order", "replaysafe replayed refund_order"]
    attributes = dict(spans[0].attributes or {})
    assert attributes["replaysafe.thread_id"] == "t-otel"
    assert attributes["replaysafe.tool_call_id"] == "call_1"
    assert attributes["replaysafe.attempt"] == 1
    assert attributes["replaysafe.recorded"] is True  # the executed call's result is in the ledger
    assert "replaysafe.recorded" not in dict(spans[1].attributes or {})  # a replay has no such outcome
    assert spans[0].end_time is not None and spans[0].start_time is not None
    assert spans[0].end_time >= spans[0].start_time
    assert "SECRET" not in repr([dict(s.attributes or {}) for s in spans])
