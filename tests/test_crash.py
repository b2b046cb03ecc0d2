"""Real crashes: a child process is SIGKILLed, and a new process resumes on the same ledger."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

CHILD = str(Path(__file__).with_name("child.py"))


def run_child(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, CHILD, *args], capture_output=True, text=True, timeout=timeout)


def effects_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_kill_after_the_record_then_resume_replays(durable_ledger_url: str, tmp_path: Path) -> None:
    """Killed right after refund_order returned: the resumed process gets the record, no second refund."""
    effects = tmp_path / "effects.log"
    thread = f"t-{uuid.uuid4().hex[:8]}"
    crashed = run_child("crash", durable_ledger_url, str(effects), thread, "after-record")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    first = json.loads(crashed.stdout)
    resumed = run_child("crash", durable_ledger_url, str(effects), thread, "none")
    assert resumed.returncode == 0, resumed.stderr
    second = json.loads(resumed.stdout)
    assert second["result"] == first["result"] == "Refunded 59.00 for order 1042"
    assert second["pid"] != first["pid"]
    assert len(effects_of(effects)) == 1


def test_without_a_ledger_the_same_crash_refunds_twice(tmp_path: Path) -> None:
    """The control: in memory only, the resumed process refunds again."""
    effects = tmp_path / "effects.log"
    assert run_child("crash", "memory://", str(effects), "t", "after-record").returncode == -signal.SIGKILL
    assert run_child("crash", "memory://", str(effects), "t", "none").returncode == 0
    assert len(effects_of(effects)) == 2


@pytest.mark.slow
def test_processes_and_threads_race_on_one_key(durable_ledger_url: str, tmp_path: Path) -> None:
    """4 processes x 4 threads replay the same keys at once: each body runs once, all see one result."""
    effects = tmp_path / "effects.log"
    thread = f"t-{uuid.uuid4().hex[:8]}"
    keys, processes, threads = 5, 4, 4
    children = [
        subprocess.Popen(
            [sys.executable, CHILD, "race", durable_ledger_url, str(effects), thread, str(keys), str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        # Every racer is up, its ledger open, before any starts: the race is not one process after another.
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n", child.stderr.read() if child.stderr else ""
        outputs = [child.communicate("go\n", timeout=240) for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
    reports = [json.loads(out) for out, _ in outputs]
    for key in range(keys):
        seen = {per_thread[key] for report in reports for per_thread in report["results"]}
        assert len(seen) == 1, f"key {key} gave {seen}"
    assert sorted(effects_of(effects)) == sorted(str(k) for k in range(keys))
    # Some caller found a key running under another owner and waited: the race really happened.
    assert sum(report["waits"] for report in reports) >= 1
