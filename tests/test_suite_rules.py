"""The test suite's own rules: a missing server fails the run, and a hanging test fails instead of hanging.

Each runs pytest in a subprocess, so that the run under test has its own environment
and configuration; none touches the shared servers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import servers
from .conftest import ALLOW_SKIP_ENV

ROOT = Path(__file__).parents[1]


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A local port that refuses connections: bound, never listening, so no one else takes it meanwhile."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def run_pytest(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def without_ci(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", ALLOW_SKIP_ENV)}
    return {**env, **extra}


@pytest.mark.parametrize(
    ("variable", "url", "backend"),
    [
        (servers.POSTGRES_ENV, "postgresql://root@127.0.0.1:{port}/test", "postgres"),
        (servers.REDIS_ENV, "redis://127.0.0.1:{port}/0", "redis"),
    ],
)
def test_a_missing_server_fails_the_readme_command(closed_port: int, variable: str, url: str, backend: str) -> None:
    """Without CI set, a backend whose server does not answer fails its tests; skipping is an explicit opt-in."""
    env = without_ci(**{variable: url.format(port=closed_port)})
    selection = ["tests/ledgers/test_contract.py", "-x", "-k", backend]

    failed = run_pytest(*selection, env=env)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"{variable} names a" in failed.stdout and "does not answer" in failed.stdout, failed.stdout
    assert f"Set {ALLOW_SKIP_ENV}=1 to skip" in failed.stdout
    assert " skipped" not in failed.stdout.splitlines()[-1]

    skipped = run_pytest(*selection, env={**env, ALLOW_SKIP_ENV: "1"})
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    summary = skipped.stdout.splitlines()[-1]
    assert " skipped" in summary and "failed" not in summary and "error" not in summary, summary

    # CI proves every backend: there the opt-in is ignored.
    under_ci = run_pytest(*selection, env={**env, ALLOW_SKIP_ENV: "1", "CI": "true"})
    assert under_ci.returncode == 1, under_ci.stdout + under_ci.stderr


def test_every_test_has_a_time_limit(pytestconfig: pytest.Config) -> None:
    """A default limit applies to every test, by a watchdog thread: SIGALRM belongs to the library's timeouts."""
    assert float(pytestconfig.getini("timeout")) > 0
    assert pytestconfig.getini("timeout_method") == "thread"


def test_a_hanging_test_fails_instead_of_hanging(tmp_path: Path) -> None:
    """Under the project's configuration, a test that never returns is ended and reported as a failure."""
    hanging = tmp_path / "test_hangs.py"
    hanging.write_text("import threading\n\ndef test_never_returns():\n    threading.Event().wait()\n")
    done = run_pytest(
        "-c",
        str(ROOT / "pyproject.toml"),
        "--rootdir",
        str(tmp_path),
        "-o",
        "timeout=2",
        str(hanging),
        env=without_ci(),
    )
    assert done.returncode != 0
    assert " Timeout " in done.stdout, done.stdout
    assert "test_never_returns" in done.stdout, done.stdout
