"""The runs of a crash test after its discovery are forked from a server that imported the agent's
installed modules once (replaysafe/testing/_forkserver.py): each is still a process of its own, with
the environment it was given, really SIGKILLed and resumed (the verdicts of tests/test_crashtest.py
are read from such runs)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from replaysafe.testing import CrashReport, _forkserver, crashtest

ROOT = Path(__file__).resolve().parent.parent
AGENT = "tests/forkserver_agent.py:main"

pytestmark = pytest.mark.slow


def run(**options: object) -> CrashReport:
    return crashtest(AGENT, cwd=ROOT, points=["after-record"], keep=True, **options)  # type: ignore[arg-type]


def noted(report: CrashReport, what: str) -> dict[str, str]:
    folder = Path(report.cases[0].folder or "")
    return {run: (folder / f"{what}-{run}").read_text() for run in ("crash", "resume")}


def imported_ahead(report: CrashReport) -> dict[str, str]:
    return noted(report, "imported-ahead")


@pytest.fixture(autouse=True)
def _fresh_servers() -> None:
    """Each test starts with no server kept (another test of this process may have left one)."""
    _forkserver.close_all()


def test_the_runs_after_discovery_fork_from_a_server_that_imported_the_agents_modules() -> None:
    report = run()
    assert report.exit_code == 0
    assert [case.verdict for case in report.cases] == ["holds", "holds"]
    assert imported_ahead(report) == {"crash": "True", "resume": "True"}
    # The server's objects are frozen: a run's collections (on, as in any process) walk only what it made.
    assert noted(report, "collector") == {"crash": "on=True frozen=True", "resume": "on=True frozen=True"}


def test_the_resume_runs_under_another_hash_seed_than_the_run_that_crashed() -> None:
    """As after a real crash: an agent whose ids hang on the order of a set sees another order on resume."""
    hashes = noted(run(), "hash")
    assert hashes["crash"] != hashes["resume"]


def test_with_the_server_turned_off_each_run_is_a_new_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_forkserver.FORK_ENV, "0")
    report = run()
    assert report.exit_code == 0
    assert imported_ahead(report) == {"crash": "False", "resume": "False"}
    assert noted(report, "collector") == {"crash": "on=True frozen=False", "resume": "on=True frozen=False"}


def test_a_forked_run_reads_replaysafes_settings_from_its_own_environment() -> None:
    """The server imported replaysafe with protection on; runs given REPLAYSAFE_DISABLED=1 run their tools
    plainly, as new interpreters would: no protected call, and the refund is a side effect run twice."""
    assert run().exit_code == 0  # leaves the server, which imported replaysafe, for the runs below
    report = crashtest(AGENT, cwd=ROOT, points=["after-record"], env={"REPLAYSAFE_DISABLED": "1"})
    assert report.calls == []
    assert [(case.tool, case.verdict) for case in report.cases] == [("crashtest_agents:bank_refund", "UNPROTECTED")]


def test_a_server_whose_imports_start_a_thread_is_not_used() -> None:
    """Forking a process that runs a thread copies its locks mid-use: such a server says so, and the runs
    start as new interpreters."""
    env = {**os.environ, "REPLAYSAFE_CRASHTEST_SYS_PATH": json.dumps(sys.path)}
    server = _forkserver.ForkServer(["tests.forkserver_thread"], env, ROOT)
    assert not server.usable
    safe = _forkserver.ForkServer(["xml.dom.minidom"], env, ROOT)
    try:
        assert safe.usable
    finally:
        safe.close()
