"""`replaysafe ledger list/show` with steps and pauses, after real crashes (SIGKILLed child processes), on every
durable ledger; the commands run in this process as a new one would run them (tests/cli.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from replaysafe import CallKey

from .cli import cli

STEPS_CHILD = str(Path(__file__).with_name("steps_child.py"))


def crashed_between_steps(url: str, tmp_path: Path) -> str:
    """A thread whose ``fulfil`` call was killed after its ``charge`` step: parent in doubt, one step done."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    args = ["steps", url, str(tmp_path / "fx"), thread, "between-steps"]
    killed = subprocess.run([sys.executable, STEPS_CHILD, *args], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    return thread


def test_list_shows_each_step_under_its_parent(durable_ledger_url: str, tmp_path: Path) -> None:
    thread = crashed_between_steps(durable_ledger_url, tmp_path)
    table = cli("ledger", "--ledger", durable_ledger_url, "list", "--thread", thread)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[3] == "TOOL"
    assert lines[1].split()[3:5] == ["fulfil", "in_doubt"]
    assert lines[2].split()[2:6] == ["call_1>charge#1", "└", "charge", "completed"]
    data = json.loads(cli("ledger", "--ledger", durable_ledger_url, "list", "--thread", thread, "--json").stdout)
    parent, step = data["records"]
    assert parent["tool_name"] == "fulfil" and parent["parent"] is None
    assert step["tool_name"] == "charge"
    assert step["parent"] == {"thread_id": thread, "message_id": "msg_1", "tool_call_id": "call_1"}


def test_show_lists_a_calls_steps_and_a_steps_parent(durable_ledger_url: str, tmp_path: Path) -> None:
    thread = crashed_between_steps(durable_ledger_url, tmp_path)
    shown = cli("ledger", "--ledger", durable_ledger_url, "show", thread, "msg_1", "call_1")
    assert shown.returncode == 0, shown.stderr
    assert "step: charge, completed, attempt 1, CALL call_1>charge#1" in shown.stdout
    data = json.loads(cli("ledger", "--ledger", durable_ledger_url, "show", thread, "msg_1", "call_1", "--json").stdout)
    assert [s["tool_call_id"] for s in data["steps"]] == ["call_1>charge#1"]
    step = json.loads(
        cli("ledger", "--ledger", durable_ledger_url, "show", thread, "msg_1", "call_1>charge#1", "--json").stdout
    )
    assert step["result"] == "ch_1042" and step["steps"] == []
    assert CallKey(**step["parent"]) == CallKey(thread, "msg_1", "call_1")


def test_a_paused_call_is_listed_as_paused(durable_ledger_url: str, tmp_path: Path) -> None:
    thread = f"t-{uuid.uuid4().hex[:8]}"
    args = ["pause", durable_ledger_url, str(tmp_path / "fx"), thread, "-"]
    paused = subprocess.run([sys.executable, STEPS_CHILD, *args], capture_output=True, text=True, timeout=120)
    assert paused.returncode == -signal.SIGKILL, paused.stderr
    data = json.loads(
        cli("ledger", "--ledger", durable_ledger_url, "list", "--thread", thread, "--status", "paused", "--json").stdout
    )
    assert [r["tool_name"] for r in data["records"]] == ["refund_and_confirm"]
    stats = cli("ledger", "--ledger", durable_ledger_url, "stats")
    assert stats.returncode == 0 and "paused" in stats.stdout
