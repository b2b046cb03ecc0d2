"""The replaysafe command, run for real in a subprocess."""

from __future__ import annotations

import subprocess
import sys


def test_demo_refunds_once_with_the_decorator_and_twice_without() -> None:
    """`replaysafe demo` kills a real agent process, resumes it, and tells the story."""
    done = subprocess.run(
        [sys.executable, "-m", "replaysafe", "demo"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count("is killed (SIGKILL)") == 2
    assert "recorded result returned, tool not run" in out
    assert "result: the customer was refunded once. Correct." in out
    assert "result: the customer was refunded 2 times" in out
    assert "refunds with replaysafe: 1, without: 2" in out
    # The two lines of code that make the difference are shown; the unprotected story runs without them.
    assert '@replay_safe(ledger=SqliteLedger("ledger.db"))' in out
    assert 'with tool_call(thread_id, message["id"], call["id"]):' in out


def test_help_lists_the_commands() -> None:
    """--help works and names the demo."""
    done = subprocess.run([sys.executable, "-m", "replaysafe", "--help"], capture_output=True, text=True, check=True)
    assert "demo" in done.stdout
