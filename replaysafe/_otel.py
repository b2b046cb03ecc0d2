"""Optional OpenTelemetry spans and metrics, from events (``pip install "replaysafe-tools[otel]"``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _metrics
from ._events import Event, EventKind, on_event


def instrument_opentelemetry(tracer_provider: Any = None, *, meter_provider: Any = None) -> Callable[[], None]:
    """Turn replaysafe's events into OpenTelemetry spans and metrics; returns a function that stops both.

    Spans: an executed call becomes a span covering the tool's run; every other event
    (replayed, in doubt, duplicate, ledger error, ...) a short span of its own.

    Metrics (meter ``replaysafe``):

    - ``replaysafe.calls``, a counter of events by ``replaysafe.event`` (``executed``,
      ``replayed``, ``in_doubt``, ``duplicate_detected``, ``timeout``, ``unprotected``,
      ``paused``, ...), ``replaysafe.tool_name`` and ``replaysafe.ledger``;
    - ``replaysafe.ledger.duration``, a histogram of seconds per ledger operation by
      ``replaysafe.ledger``, ``replaysafe.operation`` (``claim``, ``complete``, ``get``, ...)
      and ``replaysafe.outcome`` (``ok`` or ``error``).

    Spans carry the tool name and ids as ``replaysafe.*`` attributes; metrics only the
    tool name, ledger kind and operation (ids would make every call its own series).
    Neither ever carries arguments or results. Needs ``opentelemetry-api``; without an SDK
    configured, spans and measurements go nowhere.
    """
    try:
        from opentelemetry import metrics, trace
    except ImportError as exc:  # pragma: no cover - the extra is installed in tests
        raise ImportError(
            'instrument_opentelemetry() needs opentelemetry-api: pip install "replaysafe-tools[otel]"'
        ) from exc

    tracer = trace.get_tracer("replaysafe", tracer_provider=tracer_provider)
    meter = metrics.get_meter("replaysafe", meter_provider=meter_provider)
    calls = meter.create_counter(
        "replaysafe.calls", unit="{event}", description="Events of protected tool calls, by event kind and tool"
    )
    ledger_duration = meter.create_histogram(
        "replaysafe.ledger.duration", unit="s", description="Time of one ledger operation, retries included"
    )

    def to_span_and_count(event: Event) -> None:
        counted: dict[str, Any] = {"replaysafe.event": event.kind.value, "replaysafe.tool_name": event.tool_name}
        if event.ledger is not None:
            counted["replaysafe.ledger"] = event.ledger
        calls.add(1, counted)
        if event.kind is EventKind.STARTED:
            return  # counted only: the executed event's span covers the run from its start
        end = int(event.at.timestamp() * 1e9)
        start = end - int((event.duration or 0) * 1e9)
        attributes: dict[str, Any] = dict(counted)
        if event.key is not None:
            attributes.update(
                {
                    "replaysafe.thread_id": event.key.thread_id,
                    "replaysafe.message_id": event.key.message_id,
                    "replaysafe.tool_call_id": event.key.tool_call_id,
                }
            )
        if event.attempt is not None:
            attributes["replaysafe.attempt"] = event.attempt
        if event.recorded is not None:
            attributes["replaysafe.recorded"] = event.recorded
        span = tracer.start_span(
            f"replaysafe {event.kind.value} {event.tool_name}", start_time=start, attributes=attributes
        )
        if event.kind in (EventKind.LEDGER_ERROR, EventKind.DUPLICATE_DETECTED, EventKind.MISMATCH):
            span.set_status(trace.Status(trace.StatusCode.ERROR, event.kind.value))
        span.end(end_time=end)

    def observe(ledger: str, operation: str, seconds: float, ok: bool) -> None:
        outcome = "ok" if ok else "error"
        attributes = {"replaysafe.ledger": ledger, "replaysafe.operation": operation, "replaysafe.outcome": outcome}
        ledger_duration.record(seconds, attributes)

    unsubscribe = on_event(to_span_and_count)
    stop_observing = _metrics.observe_ledger(observe)

    def stop() -> None:
        unsubscribe()
        stop_observing()

    return stop
