"""``run_python`` (replaysafe/testing/_forkserver.py) starts the child processes of the crash tests and of
``run_in_child``: the first run of a script or module is a new interpreter, the later ones fork from servers
that imported its installed modules ahead. Each run must still behave as ``python SCRIPT`` would: its own
argv, input, output, exit code, environment and import path, killed for real, under another hash seed than
the run before it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from replaysafe.testing import _forkserver
from replaysafe.testing._forkserver import run_python

#: Reports what a run saw, as JSON; ``kill`` SIGKILLs it, ``exit N`` ends it with N, ``raise`` raises.
SCRIPT = """\
import json, os, sys
ahead = "xml.dom.minidom" in sys.modules  # imported below: present at the start only when a server did it
import xml.dom.minidom
if sys.argv[1:2] == ["kill"]:
    os.kill(os.getpid(), 9)
if sys.argv[1:2] == ["raise"]:
    raise RuntimeError("the script failed")
print(json.dumps({
    "name": __name__, "argv": sys.argv, "path0": sys.path[0], "ahead": ahead, "hash": hash("seed"),
    "input": sys.stdin.read(), "env": os.environ.get("RUN_PYTHON_TEST"), "cwd": os.getcwd(), "pid": os.getpid(),
}))
print("to stderr", file=sys.stderr)
if sys.argv[1:2] == ["exit"]:
    sys.exit(int(sys.argv[2]))
"""


@pytest.fixture(autouse=True)
def _fresh_servers() -> None:
    _forkserver.close_all()


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "child_script.py"  # a file of its own: no run of another test taught its modules
    path.write_text(SCRIPT, encoding="utf-8")
    return path


def seen(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_a_script_runs_as_python_would_run_it_the_first_time_and_forked(script: Path, tmp_path: Path) -> None:
    runs = [
        run_python([str(script), "a", "b"], input="in", env={**os.environ, "RUN_PYTHON_TEST": "x"}, cwd=tmp_path)
        for _ in range(3)
    ]
    views = [seen(done) for done in runs]
    assert [view["ahead"] for view in views] == [False, True, True]  # the later runs were forked
    for done, view in zip(runs, views, strict=True):
        assert done.args == [sys.executable, str(script), "a", "b"]
        assert done.stderr == "to stderr\n"
        assert view["name"] == "__main__"
        assert view["argv"] == [str(script), "a", "b"]
        assert view["path0"] == str(script.parent)
        assert view["input"] == "in"
        assert view["env"] == "x"
        assert Path(view["cwd"]) == tmp_path
    assert len({view["pid"] for view in views}) == 3


def test_consecutive_forked_runs_have_other_hash_seeds(script: Path) -> None:
    """A run resumed after a crash has another hash seed than the run that crashed, as after a real crash."""
    hashes = [seen(run_python([str(script)]))["hash"] for _ in range(3)]
    assert hashes[1] != hashes[2]


def test_exit_codes_errors_and_sigkills_reach_the_caller(script: Path) -> None:
    for _ in range(2):  # the first run (a new interpreter), then forked ones
        assert run_python([str(script), "exit", "3"]).returncode == 3
        killed = run_python([str(script), "kill"])
        assert killed.returncode == -signal.SIGKILL
        failed = run_python([str(script), "raise"])
        assert failed.returncode == 1
        assert "RuntimeError: the script failed" in failed.stderr
    assert seen(run_python([str(script)]))["ahead"] is True


def test_a_run_past_its_timeout_is_killed(tmp_path: Path) -> None:
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(
        "import sys, time\nprint('started', flush=True)\nif sys.argv[1:] == ['hang']:\n    time.sleep(60)\n"
    )
    assert run_python([str(sleeper)]).stdout == "started\n"  # learn it: the next run is forked
    with pytest.raises(subprocess.TimeoutExpired):
        run_python([str(sleeper), "hang"], timeout=1)


def test_a_module_runs_as_python_dash_m_would(tmp_path: Path) -> None:
    package = tmp_path / "run_python_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text(SCRIPT)
    views = [seen(run_python(["-m", "run_python_pkg.main", "z"], cwd=tmp_path)) for _ in range(2)]
    assert [view["ahead"] for view in views] == [False, True]
    for view in views:
        assert view["name"] == "__main__"
        assert view["argv"] == [str(package / "main.py"), "z"]
        assert view["path0"] == str(tmp_path)


def test_with_the_servers_turned_off_every_run_is_a_new_interpreter(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_forkserver.FORK_ENV, "0")
    assert [seen(run_python([str(script)]))["ahead"] for _ in range(3)] == [False, False, False]


def test_a_run_with_one_output_keeps_both_streams_whole(tmp_path: Path) -> None:
    """A crash test's run writes stdout and stderr to one file: neither overwrites what the other wrote."""
    script = tmp_path / "both_streams.py"
    script.write_text(
        "import sys\nprint('first line on stdout', flush=True)\n"
        "print('then stderr', file=sys.stderr, flush=True)\nprint('then stdout again', flush=True)\n"
    )
    server = _forkserver.ForkServer([], dict(os.environ), tmp_path)
    try:
        assert server.usable
        output = tmp_path / "output"
        request = {"kind": "path", "target": str(script), "argv": [], "env": dict(os.environ), "cwd": str(tmp_path)}
        assert server.run({**request, "output": str(output)}, timeout=60) == 0
    finally:
        server.close()
    assert output.read_text().splitlines() == ["first line on stdout", "then stderr", "then stdout again"]


def test_a_run_that_starts_otherwise_is_a_new_interpreter(script: Path, tmp_path: Path) -> None:
    """What an interpreter reads as it starts (PYTHONHASHSEED, PYTHONPATH...) a forked run would take from its
    server: a run given other values starts as a new interpreter, which honours them."""
    extra = tmp_path / "extra_path"
    extra.mkdir()
    seen(run_python([str(script)]))  # learnt: the next runs with this environment fork
    assert seen(run_python([str(script)]))["ahead"] is True
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(extra)}
    views = [seen(run_python([str(script)], env=env)) for _ in range(2)]
    assert [view["ahead"] for view in views] == [False, False]
    fresh = subprocess.run([sys.executable, "-c", "print(hash('seed'))"], env=env, capture_output=True, text=True)
    assert {view["hash"] for view in views} == {int(fresh.stdout)}


def test_a_script_given_by_a_relative_path_has_an_absolute_file(tmp_path: Path) -> None:
    (tmp_path / "where.py").write_text("print(__file__)\n")
    assert [run_python(["where.py"], cwd=tmp_path).stdout.strip() for _ in range(2)] == [str(tmp_path / "where.py")] * 2
