"""Fixtures of the CrewAI adapter tests: offline CrewAI (no telemetry, no tracing) and a SQLite ledger per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from replaysafe import SqliteLedger

# Before CrewAI is imported, in this process and in the child processes the crash tests start (they inherit it).
for _name in ("CREWAI_DISABLE_TELEMETRY", "OTEL_SDK_DISABLED"):
    os.environ.setdefault(_name, "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SqliteLedger]:
    with SqliteLedger(tmp_path / "ledger.db") as opened:
        yield opened
