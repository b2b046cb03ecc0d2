"""Real crashes around steps, pauses and chosen keys: a child is SIGKILLed, a new process resumes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

CHILD = str(Path(__file__).with_name("steps_child.py"))


def run_child(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, CHILD, *args], capture_output=True, text=True, timeout=120)


def effects_of(path: Path) -> list[list[str]]:
    """Each side effect as [what, idempotency key, attempt]."""
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def new_thread() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def test_killed_between_two_steps_the_resume_runs_only_the_second(durable_ledger_url: str, tmp_path: Path) -> None:
    effects = tmp_path / "effects.log"
    thread = new_thread()
    killed = run_child("steps", durable_ledger_url, str(effects), thread, "between-steps")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert [e[0] for e in effects_of(effects)] == ["charge"]
    resumed = run_child("steps", durable_ledger_url, str(effects), thread, "none")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"result": "ch_1042 sh_1042"}
    assert [e[0] for e in effects_of(effects)] == ["charge", "ship"]
    again = run_child("steps", durable_ledger_url, str(effects), thread, "none")
    assert json.loads(again.stdout) == {"result": "ch_1042 sh_1042"}
    assert len(effects_of(effects)) == 2


def test_killed_inside_the_second_step_only_that_step_is_in_doubt(durable_ledger_url: str, tmp_path: Path) -> None:
    """In doubt shrinks to the step that was running: it runs again with the same idempotency key
    (for the provider to dedupe); the finished first step does not run again."""
    effects = tmp_path / "effects.log"
    thread = new_thread()
    killed = run_child("steps", durable_ledger_url, str(effects), thread, "inside-second-step")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run_child("steps", durable_ledger_url, str(effects), thread, "none")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"result": "ch_1042 sh_1042"}
    charge, first_ship, second_ship = effects_of(effects)
    assert charge[0] == "charge" and first_ship[0] == second_ship[0] == "ship"
    assert first_ship[1] == second_ship[1] != charge[1]  # one idempotency key per step, kept across attempts
    assert (first_ship[2], second_ship[2]) == ("1", "2")


def test_a_step_then_a_pause_then_a_resume_in_a_new_process_refunds_once(
    durable_ledger_url: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    thread = new_thread()
    paused = run_child("pause", durable_ledger_url, str(effects), thread, "-")
    assert paused.returncode == -signal.SIGKILL, paused.stderr
    resumed = run_child("pause", durable_ledger_url, str(effects), thread, "approved")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"result": "re_1042 approved"}
    assert [e[0] for e in effects_of(effects)] == ["refund"]


def test_a_step_renamed_by_a_deploy_while_its_call_is_paused_is_refused_in_the_new_process(
    durable_ledger_url: str, tmp_path: Path
) -> None:
    """Issue #29 across a real deploy: the process waiting for approval is killed after the refund step and
    the pause are recorded; the new process ships the step renamed. Its resume is refused with
    ReplayMismatchError naming both names, and refunds nothing; the call stays paused, and the next
    process, with the recorded name back, finishes it: one refund in all."""
    effects = tmp_path / "effects.log"
    thread = new_thread()
    paused = run_child("pause", durable_ledger_url, str(effects), thread, "-")
    assert paused.returncode == -signal.SIGKILL, paused.stderr
    for _ in range(2):
        renamed = run_child("pause", durable_ledger_url, str(effects), thread, "approved", "issue_refund")
        assert renamed.returncode == 1, renamed.stderr
        error = renamed.stderr.strip().splitlines()[-1]
        assert error.startswith("replaysafe.ReplayMismatchError: issue_refund (")
        assert "made the step 'refund' at that place" in error
        assert [e[0] for e in effects_of(effects)] == ["refund"]
    resumed = run_child("pause", durable_ledger_url, str(effects), thread, "approved")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"result": "re_1042 approved"}
    assert [e[0] for e in effects_of(effects)] == ["refund"]


def test_key_args_a_replanned_call_under_new_ids_in_a_new_process_replays(
    durable_ledger_url: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    thread = new_thread()
    first = run_child("args", durable_ledger_url, str(effects), thread, "msg_1", "call_a", "after-record")
    assert first.returncode == -signal.SIGKILL, first.stderr
    resumed = run_child("args", durable_ledger_url, str(effects), thread, "msg_2", "call_b", "none")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"result": "Refunded 59.00 for order 1042"}
    assert len(effects_of(effects)) == 1
