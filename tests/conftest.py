"""Fixtures shared by every test: one ``ledger`` fixture, parametrised over all backends.

Adding a backend to the whole semantic suite is one fixture below plus one entry
in ``LEDGER_BACKENDS``. Each backend also has a ``<backend>_url`` fixture: a URL
``open_ledger`` turns into the same store, for tests that resume in a new process.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import replaysafe
from replaysafe import _config, _decorator
from replaysafe.ledgers import Ledger, MemoryLedger

#: Backends the shared suite runs on; each names a ``<backend>_url`` fixture.
LEDGER_BACKENDS = ["memory", "sqlite"]
#: Backends that survive the process, for crash and multi-process tests.
DURABLE_BACKENDS = [b for b in LEDGER_BACKENDS if b != "memory"]


@pytest.fixture
def memory_url() -> str:
    return "memory://"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture(params=LEDGER_BACKENDS)
def ledger_url(request: pytest.FixtureRequest) -> str:
    """A URL of each backend, for a test that opens the ledger in several processes."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture(params=DURABLE_BACKENDS)
def durable_ledger_url(request: pytest.FixtureRequest) -> str:
    """A URL of each backend that survives a process, for crash tests."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    """A fresh, empty ledger of each backend."""
    with replaysafe.open_ledger(ledger_url) as opened:
        yield opened


@pytest.fixture
def durable_ledger(durable_ledger_url: str) -> Iterator[Ledger]:
    with replaysafe.open_ledger(durable_ledger_url) as opened:
        yield opened


@pytest.fixture
def memory_ledger() -> MemoryLedger:
    return MemoryLedger()


@pytest.fixture(autouse=True)
def _isolate_global_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees another's default ledger, env var or once-per-process warning."""
    monkeypatch.delenv("REPLAYSAFE_LEDGER_URL", raising=False)
    monkeypatch.setattr(_config, "_default", None)
    monkeypatch.setattr(_config, "_from_env", None)
    monkeypatch.setattr(_decorator, "_warned_no_ledger", False)


@pytest.fixture
def ids() -> replaysafe.tool_call:
    """A ``tool_call`` scope with ids unique to this test."""
    return replaysafe.tool_call(f"thread-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")


def pytest_configure(config: pytest.Config) -> None:
    # Tests assert on replaysafe's own warnings; anything else is an error (pyproject).
    warnings.filterwarnings("default", category=ResourceWarning)
