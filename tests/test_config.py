"""Choosing a ledger: the decorator's, tool_call's, the default, the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

import replaysafe
from replaysafe import MemoryLedger, SqliteLedger, open_ledger, replay_safe, set_default_ledger, tool_call


def test_open_ledger_urls(tmp_path: Path) -> None:
    """open_ledger understands memory:// and sqlite:/// with options in the query."""
    assert isinstance(open_ledger("memory://"), MemoryLedger)
    sqlite = open_ledger(f"sqlite:///{tmp_path}/a.db?table=calls&ttl=60")
    assert isinstance(sqlite, SqliteLedger)
    assert sqlite.table.name == "calls"  # type: ignore[attr-defined]
    assert sqlite.path == tmp_path / "a.db"  # type: ignore[attr-defined]


def test_open_ledger_rejects_unknown_schemes_without_leaking_passwords() -> None:
    """A wrong URL says which forms exist, and never echoes a password."""
    with pytest.raises(ValueError, match=r"registered: memory://, postgres://") as raised:
        open_ledger("mysql://bob:hunter2@db/x")
    assert "hunter2" not in str(raised.value)
    assert "bob:***@db" in str(raised.value)


def test_sqlite_refuses_in_memory_databases() -> None:
    """An in-memory SQLite file would be private to one connection: point to MemoryLedger."""
    with pytest.raises(ValueError, match="MemoryLedger"):
        SqliteLedger(":memory:")


def test_sqlite_rejects_bad_table_names(tmp_path: Path) -> None:
    """Table names are validated identifiers, never formatted into SQL as given."""
    with pytest.raises(ValueError, match="not a valid SQL identifier"):
        SqliteLedger(tmp_path / "x.db", table="calls; DROP TABLE x")


def _tool() -> object:
    @replay_safe
    def tool() -> str:
        return "ran"

    return tool


def test_ledger_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decorator's ledger wins, then tool_call's, then the default, then the env var."""
    decorator_ledger, call_ledger, default = MemoryLedger(), MemoryLedger(), MemoryLedger()
    monkeypatch.setenv("REPLAYSAFE_LEDGER_URL", f"sqlite:///{tmp_path}/env.db")

    @replay_safe(ledger=decorator_ledger)
    def pinned() -> str:
        return "ran"

    @replay_safe
    def free() -> str:
        return "ran"

    with tool_call("t", "m", "1", ledger=call_ledger):
        pinned()
    with tool_call("t", "m", "2", ledger=call_ledger):
        free()
    set_default_ledger(default)
    with tool_call("t", "m", "3"):
        free()
    set_default_ledger(None)
    with tool_call("t", "m", "4"):
        free()
    assert [r.key.tool_call_id for r in decorator_ledger.records()] == ["1"]
    assert [r.key.tool_call_id for r in call_ledger.records()] == ["2"]
    assert [r.key.tool_call_id for r in default.records()] == ["3"]
    with SqliteLedger(tmp_path / "env.db") as from_env:
        assert [r.key.tool_call_id for r in from_env.records()] == ["4"]


def test_env_ledger_is_opened_once_per_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """REPLAYSAFE_LEDGER_URL opens one ledger, reopened only if the URL changes."""
    from replaysafe._config import default_ledger

    monkeypatch.setenv("REPLAYSAFE_LEDGER_URL", "memory://")
    first = default_ledger()
    assert first is default_ledger()
    monkeypatch.setenv("REPLAYSAFE_LEDGER_URL", f"sqlite:///{tmp_path}/x.db")
    assert isinstance(default_ledger(), SqliteLedger)


def test_ledgers_close_and_reopen(tmp_path: Path) -> None:
    """A ledger used after close() reopens lazily; with-blocks close it."""
    ledger = SqliteLedger(tmp_path / "x.db")
    with tool_call("t", "m", "c", ledger=ledger):
        _tool()()  # type: ignore[operator]
    ledger.close()
    assert len(list(ledger.records())) == 1
    ledger.close()


def test_public_names_are_sorted_and_importable() -> None:
    """__all__ is short, sorted, and every name in it resolves."""
    assert replaysafe.__all__ == sorted(replaysafe.__all__)
    for name in replaysafe.__all__:
        assert getattr(replaysafe, name) is not None


def test_env_url_with_an_unknown_option_fails_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo in REPLAYSAFE_LEDGER_URL's options raises when the ledger is opened, not per call."""
    from replaysafe._config import default_ledger

    monkeypatch.setenv("REPLAYSAFE_LEDGER_URL", f"sqlite:///{tmp_path}/x.db?tabel=calls")
    with pytest.raises(ValueError, match="unknown URL option 'tabel'"):
        default_ledger()
    ran: list[int] = []

    @replay_safe
    def tool() -> int:
        ran.append(1)
        return 1

    with tool_call("t", "m", "c"), pytest.raises(ValueError, match="tabel"):
        tool()
    assert ran == []


def test_sqlite_url_options_and_arguments(tmp_path: Path) -> None:
    """A SQLite URL carries table, ttl and busy_timeout; an argument wins over the URL."""
    ledger = SqliteLedger(f"sqlite:///{tmp_path}/a.db?table=calls&busy_timeout=2", table="other")
    assert ledger.table.name == "other"
    assert ledger._busy_timeout_ms == 2000
