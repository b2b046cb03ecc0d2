"""Who measures ledger operations: nobody (the hot path pays one global read), or the observers.

``instrument_opentelemetry`` registers one; ``_operations`` times each ledger operation
only while one is registered.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

#: ``observer(ledger_kind, operation, seconds, ok)``.
LedgerObserver = Callable[[str, str, float, bool], None]

#: The registered observers; ``None`` (not an empty tuple) so the hot path tests one thing.
observers: tuple[LedgerObserver, ...] | None = None
_lock = threading.Lock()


def observe_ledger(observer: LedgerObserver) -> Callable[[], None]:
    """Call ``observer`` after every ledger operation; returns a function that stops it."""
    global observers
    with _lock:
        observers = (*(observers or ()), observer)

    def stop() -> None:
        global observers
        with _lock:
            remaining = tuple(o for o in observers or () if o is not observer)
            observers = remaining or None

    return stop


def ledger_kind(ledger: Any) -> str:
    """The label metrics and events give a ledger: ``SqliteLedger`` -> ``sqlite``, ``MyStore`` -> ``mystore``."""
    name = type(ledger).__name__
    return (name.removesuffix("Ledger") or name).lower()


def _new_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a fork may copy it held by another thread


os.register_at_fork(after_in_child=_new_lock_in_child)
