"""Fixtures of the SDK-loop helper tests: a SQLite ledger and an effects file per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from replaysafe import SqliteLedger


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def ledger(ledger_path: Path) -> Iterator[SqliteLedger]:
    with SqliteLedger(ledger_path) as opened:
        yield opened


@pytest.fixture
def effects_path(tmp_path: Path) -> Path:
    return tmp_path / "effects.txt"
