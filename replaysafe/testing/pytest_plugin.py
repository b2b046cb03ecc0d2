"""replaysafe's pytest plugin: loaded automatically once replaysafe is installed.

Fixtures: ``replaysafe_ledger``, ``replaysafe_calls``, ``replaysafe_clock`` and ``replaysafe_events``. Nothing happens
in a test that uses none of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .. import _config
from .._config import set_default_ledger
from .._events import Event, on_event
from ..ledgers import MemoryLedger
from ._calls import CallLog, record_calls
from ._clock import SteppedClock


@pytest.fixture
def replaysafe_ledger() -> Iterator[MemoryLedger]:
    """A fresh ``MemoryLedger``, the default ledger for this test; the default it found is put back after it.

    Only the default ledger changes: the application's own (``set_default_ledger`` or the one
    ``REPLAYSAFE_LEDGER_URL`` opened) protects its tools again in every later test.
    """
    found = _config.explicit_default_ledger()
    ledger = MemoryLedger()
    set_default_ledger(ledger)
    try:
        yield ledger
    finally:
        set_default_ledger(found)
        ledger.close()


@pytest.fixture
def replaysafe_calls() -> Iterator[CallLog]:
    """The protected calls this test made: ``replaysafe_calls.assert_ran_once(tool)``."""
    with record_calls() as log:
        yield log


@pytest.fixture
def replaysafe_clock() -> Iterator[SteppedClock]:
    """A ``SteppedClock`` replaysafe reads for this test: ``replaysafe_clock.advance(31)`` runs a lease out.

    The machine's clocks are put back after the test.
    """
    with SteppedClock() as clock:
        yield clock


@pytest.fixture
def replaysafe_events() -> Iterator[list[Event]]:
    """Every event replaysafe emits while the test runs, in order (``replaysafe.on_event``)."""
    seen: list[Event] = []
    unsubscribe = on_event(seen.append)
    try:
        yield seen
    finally:
        unsubscribe()
