"""``register_ledger``: URL schemes are a registry, the built-in ones included."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import replaysafe
from replaysafe import MemoryLedger, open_ledger, register_ledger, replay_safe, tool_call
from replaysafe import ledgers as ledgers_module
from replaysafe.ledgers import SqliteLedger

from ..installed import installed_package


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The scheme registry, restored after the test (registrations are process-wide)."""
    saved = dict(ledgers_module._registry)
    yield ledgers_module._registry
    ledgers_module._registry.clear()
    ledgers_module._registry.update(saved)


def test_a_registered_scheme_opens_through_open_ledger_and_the_environment(
    registry: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The factory gets the whole URL and the keyword options; the env var uses the same registry."""
    opened: list[tuple[str, dict[str, Any]]] = []

    def factory(url: str, **options: Any) -> MemoryLedger:
        opened.append((url, options))
        return MemoryLedger(**options)

    register_ledger("Team-Store", factory)
    ledger = open_ledger("team-store+v2://host/ledgers?x=1", signing_key="k" * 32)
    assert isinstance(ledger, MemoryLedger)
    assert opened == [("team-store+v2://host/ledgers?x=1", {"signing_key": "k" * 32})]

    monkeypatch.setenv("REPLAYSAFE_LEDGER_URL", "TEAM-STORE://env")
    runs: list[str] = []

    @replay_safe
    def refund(order: str) -> str:
        runs.append(order)
        return f"refunded {order}"

    with tool_call("t", "m", "c"):
        assert refund("42") == "refunded 42"
    with tool_call("t", "m", "c"):
        assert refund("42") == "refunded 42"
    assert runs == ["42"]  # the second call replayed from the ledger the env var named
    assert opened[-1][0] == "TEAM-STORE://env"


def test_the_built_in_schemes_are_registered_the_same_way(registry: dict[str, Any], tmp_path: Path) -> None:
    """Replacing a built-in scheme is one call with replace=True; without it, it is refused."""
    with pytest.raises(ValueError, match=r"'sqlite' already has a ledger: pass replace=True"):
        register_ledger("sqlite", lambda url, **options: MemoryLedger())
    assert isinstance(open_ledger(f"sqlite:///{tmp_path / 'a.db'}"), SqliteLedger)
    register_ledger("sqlite", lambda url, **options: MemoryLedger(), replace=True)
    assert isinstance(open_ledger(f"sqlite:///{tmp_path / 'a.db'}"), MemoryLedger)


def test_an_unknown_scheme_names_the_registered_ones_and_the_fix(registry: dict[str, Any]) -> None:
    """The error lists every registered scheme, says how to add one, and hides the password."""
    register_ledger("dynamo", lambda url, **options: MemoryLedger())
    with pytest.raises(ValueError, match=r"scheme 'mysql' is not registered") as raised:
        open_ledger("mysql://bob:hunter2@db/x")
    message = str(raised.value)
    for scheme in ("dynamo", "memory", "postgres", "postgresql", "redis", "rediss", "sqlite", "unix"):
        assert f"{scheme}://" in message
    assert "replaysafe.register_ledger(scheme, factory)" in message
    assert "hunter2" not in message


@pytest.mark.parametrize("scheme", ["", "1db", "my+driver", "my db", "sch:eme"])
def test_a_malformed_scheme_is_refused(registry: dict[str, Any], scheme: str) -> None:
    with pytest.raises(ValueError, match="is not a URL scheme"):
        register_ledger(scheme, lambda url, **options: MemoryLedger())


def test_a_factory_must_be_callable(registry: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=r"needs a callable factory"):
        register_ledger("nothing", "not callable")  # type: ignore[arg-type]


def test_register_ledger_is_public() -> None:
    assert replaysafe.register_ledger is ledgers_module.register_ledger
    assert "register_ledger" in replaysafe.__all__
    assert "register_ledger" in ledgers_module.__all__


# --- schemes an installed package declares: the replaysafe.ledgers entry points ---------------------------

#: A third party's ledger package: a SQLite ledger under its own scheme, found by its entry point alone.
TEAM_LEDGER = """
from replaysafe.ledgers import SqliteLedger

def open_team_store(url, **options):
    return SqliteLedger("sqlite:///" + url.partition("://")[2], **options)
"""


def run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_a_scheme_an_installed_package_declares_opens_in_every_process(tmp_path: Path) -> None:
    """No register_ledger call anywhere: the application (through REPLAYSAFE_LEDGER_URL) and the replaysafe
    ledger command, two other processes, both open team-store:// URLs through the package's entry point."""
    env = installed_package(
        tmp_path / "site",
        "replaysafe-team-store",
        "replaysafe_team_store",
        TEAM_LEDGER,
        "[replaysafe.ledgers]\nteam-store = replaysafe_team_store:open_team_store\n",
    )
    url = f"team-store://{tmp_path / 'team.db'}"
    app = run(
        "from replaysafe import replay_safe, tool_call\n"
        "@replay_safe\n"
        "def refund(order: str) -> str:\n"
        "    return 'refunded ' + order\n"
        "with tool_call('t-team', 'msg_1', 'call_1'):\n"
        "    print(refund('42'))\n",
        {**env, "REPLAYSAFE_LEDGER_URL": url},
    )
    assert app.returncode == 0, app.stderr
    assert app.stdout.strip() == "refunded 42"
    listed = subprocess.run(
        [sys.executable, "-m", "replaysafe", "ledger", "list", "--ledger", url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert listed.returncode == 0, listed.stderr
    assert "t-team" in listed.stdout and "completed" in listed.stdout
    with SqliteLedger(tmp_path / "team.db") as ledger:
        assert [record.key.thread_id for record in ledger.records()] == ["t-team"]


def test_a_declared_scheme_that_does_not_load_is_named(tmp_path: Path) -> None:
    env = installed_package(
        tmp_path / "site",
        "replaysafe-team-store",
        "replaysafe_team_store",
        TEAM_LEDGER,
        "[replaysafe.ledgers]\nteam-store = replaysafe_team_store:missing\n",
    )
    opened = run("from replaysafe import open_ledger; open_ledger('team-store://x')", env)
    assert opened.returncode != 0
    assert "the ledger replaysafe-team-store declares for the scheme 'team-store'" in opened.stderr
    assert "does not load: AttributeError" in opened.stderr


def test_an_unknown_scheme_says_how_to_declare_one(registry: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"an entry point of the group 'replaysafe.ledgers'"):
        open_ledger("nowhere://x")
