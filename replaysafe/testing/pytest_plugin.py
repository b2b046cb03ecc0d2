"""replaysafe's pytest plugin: loaded automatically once replaysafe is installed.

Fixtures: ``replaysafe_ledger`` and ``replaysafe_calls``. Nothing happens in a test that
uses neither.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .._config import set_default_ledger
from ..ledgers import MemoryLedger
from ._calls import CallLog, record_calls
from ._state import reset


@pytest.fixture
def replaysafe_ledger() -> Iterator[MemoryLedger]:
    """A fresh ``MemoryLedger``, the default ledger for this test; replaysafe is reset after it."""
    reset()
    ledger = MemoryLedger()
    set_default_ledger(ledger)
    try:
        yield ledger
    finally:
        reset()
        ledger.close()


@pytest.fixture
def replaysafe_calls() -> Iterator[CallLog]:
    """The protected calls this test made: ``replaysafe_calls.assert_ran_once(tool)``."""
    with record_calls() as log:
        yield log
