"""Events: what happened to a protected call, for logs, metrics and traces.

Every event is logged through the stdlib logger ``replaysafe`` with the call's ids
as ``extra`` fields, and handed to the callbacks registered with ``on_event``.
Arguments and results are never logged, only the argument digest.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from ._clock import utcnow
from ._records import CallKey

logger = logging.getLogger("replaysafe")


class EventKind(str, enum.Enum):
    """What happened."""

    STARTED = "started"  # the tool's body starts, as attempt ``Event.attempt`` (it may then raise, pause or die)
    EXECUTED = "executed"  # the tool returned (``Event.recorded``: whether its result was recorded)
    REPLAYED = "replayed"  # a recorded result was returned; the tool did not run
    IN_DOUBT = "in_doubt"  # the call's owner died or gave up mid-call
    RECONCILED = "reconciled"  # an in-doubt call was settled by a reconciler or by hand
    DUPLICATE_DETECTED = "duplicate_detected"  # a late finisher found its claim taken over
    LEDGER_ERROR = "ledger_error"  # the ledger could not be read or written
    TIMEOUT = "timeout"  # the tool passed its deadline
    MISMATCH = "mismatch"  # the key is recorded for another tool or other arguments
    TAMPERED = "tampered"  # a record's seal does not check
    UNPROTECTED = "unprotected"  # the tool ran without protection (no ids, no ledger)
    PAUSED = "paused"  # the tool raised a pause; the next call of the same key resumes it
    UNDONE = "undone"  # a completed call's compensation (@replay_safe(undo=...)) ran, by ledger.undo
    APPROVAL_REQUESTED = "approval_requested"  # the call waits for an approval (docs/approvals.md)
    APPROVED = "approved"  # an approver approved the call (``Event.approver``)
    REJECTED = "rejected"  # an approver rejected the call
    APPROVAL_REFUSED = "approval_refused"  # an approval did not let the call run (``Event.reason``)
    LATE_RESULT = "late_result"  # a run ended after its call was settled elsewhere; kept beside its record

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One event about one call. ``key`` is ``None`` when the call had no ids."""

    kind: EventKind
    tool_name: str
    key: CallKey | None
    message: str
    attempt: int | None = None
    owner: str | None = None
    args_digest: str | None = None
    #: Seconds the tool ran (``EXECUTED``).
    duration: float | None = None
    #: The key the call hands its provider, to look its effect up (``IN_DOUBT``).
    idempotency_key: str | None = None
    #: The kind of ledger the call used (``memory``, ``sqlite``, ``postgres``, ``redis``, or a registered one).
    ledger: str | None = None
    at: datetime = dataclasses.field(default_factory=utcnow)
    #: Whether the tool's result was recorded (``EXECUTED``): ``False`` when the write failed, when
    #: another worker had taken the call over while it ran, or when the result could not be stored;
    #: the call's ``LEDGER_ERROR`` or ``DUPLICATE_DETECTED`` event says which. A write that failed
    #: transiently is tried again in the background, so ``False`` may yet become recorded.
    recorded: bool | None = None
    #: Who approved or rejected the call (``APPROVED``, ``REJECTED``, ``APPROVAL_REFUSED``).
    approver: str | None = None
    #: Why an approval did not let the call run: ``mismatch``, ``expired``, ``rejected`` or ``spent``
    #: (``APPROVAL_REFUSED``).
    reason: str | None = None


class EventHandler(Protocol):
    def __call__(self, event: Event, /) -> None: ...


_LEVELS = {
    EventKind.STARTED: logging.DEBUG,
    EventKind.EXECUTED: logging.DEBUG,
    EventKind.REPLAYED: logging.DEBUG,
    EventKind.RECONCILED: logging.INFO,
    EventKind.PAUSED: logging.INFO,
    EventKind.UNDONE: logging.INFO,
    EventKind.APPROVAL_REQUESTED: logging.INFO,
    EventKind.APPROVED: logging.INFO,
    EventKind.REJECTED: logging.INFO,
    EventKind.APPROVAL_REFUSED: logging.WARNING,
    EventKind.LATE_RESULT: logging.ERROR,
    EventKind.IN_DOUBT: logging.WARNING,
    EventKind.TIMEOUT: logging.WARNING,
    EventKind.UNPROTECTED: logging.WARNING,
    EventKind.MISMATCH: logging.ERROR,
    EventKind.TAMPERED: logging.ERROR,
    EventKind.LEDGER_ERROR: logging.ERROR,
    EventKind.DUPLICATE_DETECTED: logging.ERROR,
}

_handlers: tuple[EventHandler, ...] = ()
_lock = threading.Lock()


def _new_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a fork may copy it held by another thread


os.register_at_fork(after_in_child=_new_lock_in_child)


def on_event(handler: EventHandler) -> Callable[[], None]:
    """Call ``handler(event)`` for every event; returns a function that unsubscribes it.

    Handlers run in the thread of the call and must be quick; an exception in one is
    logged and never reaches the tool's caller.
    """
    global _handlers
    with _lock:
        _handlers = (*_handlers, handler)

    def unsubscribe() -> None:
        global _handlers
        with _lock:
            _handlers = tuple(h for h in _handlers if h is not handler)

    return unsubscribe


def wanted(kind: EventKind) -> bool:
    """Whether anyone listens for ``kind``: lets the hot path skip building a message."""
    return bool(_handlers) or logger.isEnabledFor(_LEVELS[kind])


def emit(
    kind: EventKind,
    message: str,
    *,
    tool_name: str,
    key: CallKey | None,
    level: int | None = None,
    **fields: object,
) -> None:
    level = _LEVELS[kind] if level is None else level
    handlers = _handlers
    if not handlers and not logger.isEnabledFor(level):
        return  # the hot path: nobody listens
    if logger.isEnabledFor(level):
        extra: dict[str, object] = {"replaysafe_event": kind.value, "replaysafe_tool_name": tool_name}
        if key is not None:
            extra.update(
                replaysafe_thread_id=key.thread_id,
                replaysafe_message_id=key.message_id,
                replaysafe_tool_call_id=key.tool_call_id,
            )
        extra.update({f"replaysafe_{name}": value for name, value in fields.items() if value is not None})
        logger.log(level, message, extra=extra, stacklevel=2)
    if handlers:
        event = Event(kind, tool_name, key, message, **fields)  # type: ignore[arg-type]
        for handler in handlers:
            try:
                handler(event)
            except Exception:
                logger.exception("replaysafe event handler %r failed on a %s event", handler, kind.value)
