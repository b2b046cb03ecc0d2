"""Optional OpenTelemetry spans, from events (``pip install "replaysafe-tools[otel]"``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._events import Event, EventKind, on_event


def instrument_opentelemetry(tracer_provider: Any = None) -> Callable[[], None]:
    """Turn replaysafe's events into OpenTelemetry spans; returns a function that stops it.

    An executed call becomes a span covering the tool's run; every other event
    (replayed, in doubt, duplicate, ledger error, ...) a short span of its own. Each
    carries the tool name and ids as ``replaysafe.*`` attributes, never arguments or
    results. Needs ``opentelemetry-api``; without an SDK configured the spans go nowhere.
    """
    try:
        from opentelemetry import trace
    except ImportError as exc:  # pragma: no cover - the extra is installed in tests
        raise ImportError(
            'instrument_opentelemetry() needs opentelemetry-api: pip install "replaysafe-tools[otel]"'
        ) from exc

    tracer = trace.get_tracer("replaysafe", tracer_provider=tracer_provider)

    def to_span(event: Event) -> None:
        end = int(event.at.timestamp() * 1e9)
        start = end - int((event.duration or 0) * 1e9)
        attributes: dict[str, Any] = {"replaysafe.event": event.kind.value, "replaysafe.tool_name": event.tool_name}
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
        span = tracer.start_span(
            f"replaysafe {event.kind.value} {event.tool_name}", start_time=start, attributes=attributes
        )
        if event.kind in (EventKind.LEDGER_ERROR, EventKind.DUPLICATE_DETECTED, EventKind.MISMATCH):
            span.set_status(trace.Status(trace.StatusCode.ERROR, event.kind.value))
        span.end(end_time=end)

    return on_event(to_span)
