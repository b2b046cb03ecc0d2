"""The operator's `replaysafe ledger` commands, run for real in a subprocess on every durable ledger."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from replaysafe import CallKey, Ledger, open_ledger, replay_safe, tool_call

CHILD = str(Path(__file__).with_name("child.py"))


def cli(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replaysafe", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def incident(durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path) -> tuple[CallKey, CallKey]:
    """A ledger after an incident: one completed call and one in doubt (its process was SIGKILLed)."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    crashed = subprocess.run(
        [sys.executable, CHILD, "matrix", durable_ledger_url, str(tmp_path / "fx"), thread, "after-effect"],
        capture_output=True,
        text=True,
    )
    assert crashed.returncode == -9, crashed.stderr
    done = CallKey(thread, "msg_8", "call_1")
    with tool_call(*done):
        replay_safe(ledger=durable_ledger, name="send_email")(lambda to: {"sent": to})("ana@example.com")
    return CallKey(thread, "msg_7", "call_1"), done


def test_list_shows_the_incident(durable_ledger_url: str, incident: tuple[CallKey, CallKey]) -> None:
    """list prints a table, newest first, with the dead owner's call in doubt; --json for scripts."""
    in_doubt, done = incident
    table = cli("ledger", "--ledger", durable_ledger_url, "list", "--thread", in_doubt.thread_id)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["THREAD", "MESSAGE", "CALL", "TOOL", "STATUS", "ATTEMPTS", "AGE", "OWNER"]
    assert "send_email" in lines[1] and "completed" in lines[1]
    assert "refund_order" in lines[2] and "in-doubt" in lines[2]
    assert "2 record(s); page 1 of 1" in lines[-1]
    data = json.loads(cli("ledger", "--ledger", durable_ledger_url, "list", "--json", "--status", "in-doubt").stdout)
    found = [r for r in data["records"] if r["thread_id"] == in_doubt.thread_id]
    assert [(r["tool_name"], r["status"], r["stored_status"]) for r in found] == [
        ("refund_order", "in-doubt", "running")
    ]
    by_tool = json.loads(
        cli("ledger", "--ledger", durable_ledger_url, "list", "--json", "--tool", "send_email", "--since", "1h").stdout
    )
    assert {r["tool_call_id"] for r in by_tool["records"] if r["thread_id"] == done.thread_id} == {"call_1"}


def test_show_decodes_the_result(durable_ledger_url: str, incident: tuple[CallKey, CallKey]) -> None:
    """show prints one record with its result decoded; a missing one exits 1."""
    _, done = incident
    shown = cli("ledger", "--ledger", durable_ledger_url, "show", *done, "--json")
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    assert record["result"] == {"sent": "ana@example.com"}
    assert record["result_check"] == "ok"
    missing = cli("ledger", "--ledger", durable_ledger_url, "show", done.thread_id, "nope", "nope")
    assert missing.returncode == 1
    assert "no record" in missing.stderr


def test_resolve_settles_an_in_doubt_call_end_to_end(
    durable_ledger: Ledger, durable_ledger_url: str, incident: tuple[CallKey, CallKey]
) -> None:
    """Declined, nothing changes (exit 4); confirmed, the result is recorded and a replay returns it."""
    in_doubt, _ = incident
    declined = cli("ledger", "--ledger", durable_ledger_url, "resolve", *in_doubt, "--result", '"re_1"', stdin="n\n")
    assert declined.returncode == 4
    assert "not settled" in declined.stdout
    settled = cli("ledger", "--ledger", durable_ledger_url, "resolve", *in_doubt, "--result", '"re_1"', stdin="y\n")
    assert settled.returncode == 0, settled.stderr
    assert "settled" in settled.stdout
    runs: list[int] = []

    @replay_safe(ledger=durable_ledger, in_doubt="raise")
    def refund_order(order_id: str, amount: float) -> str:
        runs.append(1)
        return "ran again"

    with tool_call(*in_doubt):
        assert refund_order("1042", 59.0) == "re_1"
    assert runs == []


def test_resolve_rerun(durable_ledger: Ledger, durable_ledger_url: str, incident: tuple[CallKey, CallKey]) -> None:
    """--rerun --yes removes the record, so the next replay runs the tool."""
    in_doubt, _ = incident
    assert cli("ledger", "--ledger", durable_ledger_url, "resolve", *in_doubt, "--rerun", "--yes").returncode == 0
    assert durable_ledger.get(in_doubt) is None


def test_stats(durable_ledger_url: str, incident: tuple[CallKey, CallKey]) -> None:
    """stats counts per status and tool and names the oldest in-doubt call."""
    in_doubt, _ = incident
    stats = cli("ledger", "--ledger", durable_ledger_url, "stats")
    assert stats.returncode == 0, stats.stderr
    assert "in-doubt" in stats.stdout
    assert "oldest in-doubt call: refund_order" in stats.stdout
    assert in_doubt.thread_id in stats.stdout


def test_purge(durable_ledger: Ledger, durable_ledger_url: str, incident: tuple[CallKey, CallKey]) -> None:
    """purge --dry-run counts, purge deletes, both say how many."""
    in_doubt, _ = incident
    old = cli("ledger", "--ledger", durable_ledger_url, "purge", "--older-than", "0s", "--dry-run")
    assert old.returncode == 0, old.stderr
    assert "would delete" in old.stdout
    dry = cli("ledger", "--ledger", durable_ledger_url, "purge", "--thread", in_doubt.thread_id, "--dry-run")
    assert "would delete 2 record(s)" in dry.stdout
    assert len(list(durable_ledger.records(thread_id=in_doubt.thread_id))) == 2
    real = cli("ledger", "--ledger", durable_ledger_url, "purge", "--thread", in_doubt.thread_id)
    assert "deleted 2 record(s)" in real.stdout
    assert list(durable_ledger.records(thread_id=in_doubt.thread_id)) == []
    expired = cli("ledger", "--ledger", durable_ledger_url, "purge", "--expired")
    assert expired.returncode == 0, expired.stderr


def test_clear_errors_and_exit_codes(tmp_path: Path) -> None:
    """No URL, a wrong URL, a missing file, a missing table, an unreachable server: each says so."""
    no_url = cli("ledger", "list", env={"REPLAYSAFE_LEDGER_URL": ""})
    assert (no_url.returncode, "--ledger URL" in no_url.stderr) == (2, True)
    wrong = cli("ledger", "--ledger", "mysql://db/x", "list")
    assert (wrong.returncode, "expected memory://" in wrong.stderr) == (2, True)
    missing = cli("ledger", "--ledger", f"sqlite:///{tmp_path}/none.db", "list")
    assert (missing.returncode, "no ledger file" in missing.stderr) == (3, True)
    assert not (tmp_path / "none.db").exists()
    sqlite3.connect(tmp_path / "empty.db").close()
    no_table = cli("ledger", "--ledger", f"sqlite:///{tmp_path}/empty.db", "stats")
    assert (no_table.returncode, "table is missing" in no_table.stderr) == (3, True)
    for url in ("postgresql://root@127.0.0.1:1/test", "redis://127.0.0.1:1/0"):
        down = cli("ledger", "--ledger", url, "stats")
        assert down.returncode == 3, (url, down.stderr)
        assert "cannot reach the ledger" in down.stderr
        assert "Traceback" not in down.stderr


@pytest.mark.parametrize("command", [[], ["ledger"], ["ledger", "list"], ["ledger", "resolve"], ["ledger", "purge"]])
def test_help_everywhere(command: list[str]) -> None:
    """Every command and action answers --help."""
    done = cli(*command, "--help")
    assert done.returncode == 0
    assert "usage: replaysafe" in done.stdout


def test_purge_expired(durable_ledger_url: str) -> None:
    """Records past their ttl are counted by --dry-run and deleted by purge --expired (Redis expires its own)."""
    import time

    url = f"{durable_ledger_url}{'&' if '?' in durable_ledger_url else '?'}ttl=1"
    with open_ledger(url) as ledger, tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c"):
        replay_safe(ledger=ledger, name="short_lived")(lambda: 1)()
    time.sleep(1.2)
    dry = cli("ledger", "--ledger", durable_ledger_url, "purge", "--expired", "--dry-run")
    real = cli("ledger", "--ledger", durable_ledger_url, "purge", "--expired")
    assert (dry.returncode, real.returncode) == (0, 0), dry.stderr + real.stderr
    if durable_ledger_url.startswith("redis"):
        assert "expires records by itself" in real.stdout
    else:
        assert "would delete 1 expired record(s)" in dry.stdout
        assert "deleted 1 expired record(s)" in real.stdout
        again = cli("ledger", "--ledger", durable_ledger_url, "purge", "--expired", "--dry-run")
        assert "would delete 0 expired record(s)" in again.stdout
