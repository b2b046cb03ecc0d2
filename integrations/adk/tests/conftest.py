"""Fixtures and helpers of the ADK adapter tests: a SQLite ledger per test, and agents run on ADK's own runner."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from replaysafe import SqliteLedger


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SqliteLedger]:
    with SqliteLedger(tmp_path / "ledger.db") as opened:
        yield opened
