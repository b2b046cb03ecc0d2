"""The test suite's own rules: a missing server fails the run, and a hanging test fails instead of hanging.

Each runs pytest in a subprocess, so that the run under test has its own environment
and configuration; none touches the shared servers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

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


def test_ci_runs_the_readme_test_command() -> None:
    """Each step of the README's second command stands in .ci/run as written (CI adds only its reports)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = readme.split("```sh notest\n")[2].split("\n```", 1)[0].strip()
    assert "pytest" in command, command
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for step in command.split(" && "):
        assert f"{step} " in script or f"{step};" in script or f"{step}\n" in script, f"{step!r} is not in .ci/run"


def test_a_run_that_leaves_a_key_on_a_shared_server_fails(tmp_path: Path) -> None:
    """The rule that lets tests run in parallel is checked every run: a test that writes outside a prefix of its own
    (or leaves it behind) fails the run, naming what it left."""
    leaked = f"replaysafe-rule-check:{uuid.uuid4()}"  # outside any test's own namespace
    redis_url = os.environ.get(servers.REDIS_ENV) or servers.LOCAL_REDIS
    test = tmp_path / "test_leaks.py"
    test.write_text(
        f"import redis\ndef test_leaks():\n    redis.Redis.from_url({redis_url!r}).set({leaked!r}, b'1')\n",
        encoding="utf-8",
    )
    client = redis.Redis.from_url(redis_url)
    try:
        # The suite's own conftest, on a test file outside it: -p loads it as a plugin.
        result = run_pytest("-p", "tests.conftest", "--rootdir", str(ROOT), str(test), env=os.environ.copy())
    finally:
        client.delete(leaked)
        client.close()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 passed" in result.stdout, result.stdout
    assert f"outside any test's own namespace: redis key {leaked}" in result.stdout, result.stdout
