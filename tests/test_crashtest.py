"""``replaysafe crashtest`` on small agents (tests/crashtest_agents.py), with real SIGKILLs and resumes.

Every case runs the agent in a child process that is SIGKILLed at its point, then resumes it in
another: the verdicts below are what those processes did, counted from their logs.
"""

from __future__ import annotations

import json
import urllib.parse
import xml.etree.ElementTree as ET
from pathlib import Path

import psycopg
import pytest

from replaysafe._cli import main
from replaysafe.testing import CrashReport, CrashTestError, crashtest
from replaysafe.testing._crashtest import _namespaced

from . import servers

ROOT = Path(__file__).resolve().parent.parent
AGENTS = "tests/crashtest_agents.py"

pytestmark = pytest.mark.slow


def run(agent: str, **options: object) -> CrashReport:
    return crashtest(f"{AGENTS}:{agent}", cwd=ROOT, jobs=2, **options)  # type: ignore[arg-type]


def verdicts(report: CrashReport) -> dict[str, tuple[int, str]]:
    return {case.case: (case.ran, case.verdict) for case in report.cases}


def test_a_protected_agent_holds_at_every_point() -> None:
    """Each refund: killed before its claim or after its record it ran once; killed inside or before its
    record it was in doubt and ran again under the default policy (rerun), and the report says so."""
    report = run("protected")
    assert [(call.index, call.tool, call.key) for call in report.calls] == [
        (1, "refund_order", ("thread-1", "msg_0", "call_1")),
        (2, "refund_order", ("thread-1", "msg_1", "call_1")),
    ]
    assert verdicts(report) == {
        "1@before": (1, "holds"),
        "1@inside": (2, "in doubt, settled by policy"),
        "1@after-return": (2, "in doubt, settled by policy"),
        "1@after-record": (1, "holds"),
        "2@before": (1, "holds"),
        "2@inside": (2, "in doubt, settled by policy"),
        "2@after-return": (2, "in doubt, settled by policy"),
        "2@after-record": (1, "holds"),
    }
    assert report.exit_code == 0 and report.holds


def test_under_the_raise_policy_an_in_doubt_call_does_not_run_again() -> None:
    report = run("protected", points=["inside", "after-record"], policy="raise")
    assert verdicts(report) == {
        "1@inside": (1, "in doubt, settled by policy"),
        "1@after-record": (1, "holds"),
        "2@inside": (1, "in doubt, settled by policy"),
        "2@after-record": (1, "holds"),
    }
    assert any("raised CallInDoubtError" in detail for detail in report.cases[0].details)
    assert report.exit_code == 0


def test_an_unprotected_side_effect_is_named_with_the_command_that_reproduces_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = run("with_an_sms", points=["after-record"])
    sms = "crashtest_agents.py:send_sms"
    assert verdicts(report) == {
        # Killed after a refund's record, before its SMS: the refund replays, the SMS is sent once.
        "1@after-record": (1, "holds"),
        "2@after-record": (1, "holds"),
        # Killed after the first SMS: the resume sends it again (3 where one run sends 2).
        f"{sms}@after-return": (3, "UNPROTECTED"),
    }
    assert report.exit_code == 1
    case = report.cases[-1]
    assert f"ran 3 times, where the run that was not killed ran it 2: `{sms}` is not protected" in case.details[0]
    assert case.reproduce == f"replaysafe crashtest {AGENTS}:with_an_sms --case {sms}@after-return"
    table = report.table()
    assert f"reproduce it alone: {case.reproduce}" in table and "2 held, 1 broke the promise" in table

    # The command it prints, run alone, finds the same.
    alone = crashtest(f"{AGENTS}:with_an_sms", cwd=ROOT, case=f"{sms}@after-return")
    assert verdicts(alone) == {f"{sms}@after-return": (3, "UNPROTECTED")}
    assert alone.cases[0].folder is not None and Path(alone.cases[0].folder).is_dir()  # kept, to look into


def test_the_same_agent_without_replaysafe_refunds_twice() -> None:
    """The control: the refund left plain is an unprotected side effect, run again by every resume."""
    report = run("without_replaysafe")
    bank = "crashtest_agents.py:bank_refund"
    assert report.calls == []
    assert verdicts(report) == {f"{bank}@after-return": (3, "UNPROTECTED")}
    assert report.exit_code == 1


def test_a_ledger_that_does_not_survive_the_crash_is_a_duplicate() -> None:
    """A MemoryLedger loses the record with the process: the call whose record was written runs again."""
    report = run("forgetful_ledger", points=["after-record"])
    assert verdicts(report) == {"1@after-record": (2, "DUPLICATE"), "2@after-record": (2, "DUPLICATE")}
    assert (
        "refund_order (thread-1 / msg_0 / call_1) ran 2 times, 1 allowed: its outcome was written before the crash"
        in (report.cases[0].details)
    )
    assert report.exit_code == 1


def test_new_ids_on_every_run_cannot_be_crash_tested() -> None:
    report = run("new_ids_each_run", points=["after-record"])
    assert {case.verdict for case in report.cases} == {"not reached"}
    assert "give its model fixed ids (a scripted model)" in report.cases[0].details[0]
    assert report.exit_code == 2


def test_a_resume_that_hangs_is_reported_as_hung() -> None:
    report = run("hangs_on_resume", points=["after-record"], timeout=3)
    assert {case.verdict for case in report.cases} == {"hung"}
    assert report.cases[0].details == ["hung after resume: it did not finish within 3 s"]
    assert report.exit_code == 2


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ("no_tool_call", "made no protected tool call and ran no marked side effect"),
        ("fails_first", "failed before any tool call in its first run (not killed): the entry point raised "),
        ("missing", "cannot load tests/crashtest_agents.py:missing: ImportError"),
    ],
)
def test_what_cannot_be_tested_says_why(agent: str, message: str) -> None:
    with pytest.raises(CrashTestError) as raised:
        run(agent)
    assert message in str(raised.value)


def test_an_unusable_ledger_is_refused_before_any_run() -> None:
    with pytest.raises(CrashTestError, match=r"the ledger redis://127.0.0.1:1/0\?connect_timeout=1 cannot be used"):
        run("protected", ledger="redis://127.0.0.1:1/0?connect_timeout=1")


@pytest.mark.parametrize("ledger", ["postgres", "redis", "tiered"])
def test_a_server_ledger_gives_each_case_its_own_namespace(ledger: str, postgres_url: str, redis_url: str) -> None:
    """Both refunds' cases share a server: each case has its own table or key prefix, so none replays another's."""
    urls = {"postgres": postgres_url, "redis": redis_url, "tiered": servers.with_query(postgres_url, cache=redis_url)}
    report = run("protected", points=["after-record"], ledger=urls[ledger])
    assert verdicts(report) == {"1@after-record": (1, "holds"), "2@after-record": (1, "holds")}
    if ledger != "redis":  # each case's table and claim function, dropped once the cases ran
        schema = urllib.parse.parse_qs(urllib.parse.urlsplit(postgres_url).query)["schema"][0]
        with psycopg.connect(servers.libpq_url(postgres_url.split("?")[0]), autocommit=True) as conn:
            left = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s UNION ALL SELECT proname FROM pg_proc "
                "JOIN pg_namespace n ON n.oid = pronamespace WHERE n.nspname = %s",
                (schema, schema),
            ).fetchall()
        assert left == []


def test_a_case_on_a_tiered_ledger_gets_a_table_and_a_cache_prefix_of_its_own() -> None:
    """PostgreSQL with a Redis cache: a cache shared by the cases would answer one case with another's record."""
    given = servers.with_query("postgresql://root@db/test", cache="redis://cache:6379/0?prefix=app:")
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(_namespaced(given, "case_7")).query))
    assert query["table"] == "case_7"
    cache = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(query["cache"]).query))
    assert cache["prefix"] == "app:case_7"


@pytest.mark.parametrize(("given", "prefix"), [("", "case_7"), ("app", "app:case_7"), ("app:", "app:case_7")])
def test_a_case_on_redis_keeps_under_the_given_prefix(given: str, prefix: str) -> None:
    """The case's keys stay under the user's prefix (its keys are ``<prefix>:...``), as an ACL's ``~app:*`` allows."""
    url = "redis://cache:6379/0" + (f"?prefix={given}" if given else "")
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(_namespaced(url, "case_7")).query))
    assert query["prefix"] == prefix


def test_the_command_writes_junit_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    junit = tmp_path / "report.xml"
    code = main(["crashtest", f"{AGENTS}:with_an_sms", "--points", "after-record", "--json", "--junit", str(junit)])
    assert code == 1
    document = json.loads(capsys.readouterr().out)
    assert document["exit_code"] == 1
    assert [case["verdict"] for case in document["cases"]] == ["holds", "holds", "UNPROTECTED"]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "0")
    failures = [case.find("failure") for case in suite.iter("testcase")]
    assert [failure is not None for failure in failures] == [False, False, True]

    assert main(["crashtest", f"{AGENTS}:no_tool_call"]) == 2
    assert "made no protected tool call" in capsys.readouterr().err


def test_a_call_made_again_under_new_ids_is_a_duplicate() -> None:
    """Each restart's model answers with new ids: the resumed run refunds again under a new key, caught per tool
    and per marked side effect (each key alone ran once)."""
    report = run("replans_with_new_ids", points=["after-record"])
    assert verdicts(report) == {"1@after-record": (1, "DUPLICATE"), "2@after-record": (1, "DUPLICATE")}
    first = report.cases[0].details
    assert (
        "refund_order started 3 times, where a run that is not killed starts it 2; calls the first run did not "
        "make: thread-1 / msg_0 / call_2, thread-1 / msg_1 / call_2 (new ids?)" in first
    )
    assert "`crashtest_agents.py:bank_refund` ran 3 times, where a run that is not killed runs it 2" in first


def test_a_call_paused_and_resumed_in_one_run_holds() -> None:
    """A start that ended in a pause made no side effect; killed after the pause was recorded (its first record),
    the resume pauses and is approved again: the refund itself is made once."""
    report = run("pauses_for_approval", points=["before", "after-record"])
    assert verdicts(report) == {
        "1@before": (1, "holds"),
        "1@after-record": (1, "holds"),
        "2@before": (1, "holds"),
        "2@after-record": (1, "holds"),
    }


def test_a_resume_that_runs_arguments_the_first_run_never_used_is_reported() -> None:
    """Killed once the first refund was recorded, the resumed model asks for the second with another order under
    the same ids: by name the refunds ran as often as in a run that is not killed, but one ran with arguments that
    run never used."""
    report = run("replans_another_order", points=["after-record"], case="1@after-record")
    assert verdicts(report) == {"1@after-record": (1, "NEW ARGUMENTS")}
    (detail,) = report.cases[0].details
    assert detail.startswith(
        "`crashtest_agents.py:bank_refund` ran 1 time(s) with arguments the run that was not killed never used"
    )
    assert report.cases[0].effects == {"crashtest_agents.py:bank_refund": 2}
    assert report.cases[0].resumed_effects == {"crashtest_agents.py:bank_refund": 1}
    assert report.exit_code == 1


def test_one_refund_made_twice_is_a_duplicate_though_another_was_dropped() -> None:
    """Killed after the first plain refund ran, the resumed model refunds it again and forgets the second: two
    refunds by name, as in a run that is not killed; by arguments, the first ran twice."""
    report = run("repeats_one_refund_and_drops_the_other", case="crashtest_agents.py:bank_refund@after-return")
    (case,) = report.cases
    assert case.verdict == "DUPLICATE"
    assert case.effects == {"crashtest_agents.py:bank_refund": 2}
    assert any(
        detail.startswith("`crashtest_agents.py:bank_refund` ran 2 times with the same arguments")
        for detail in case.details
    )


def test_an_approved_call_is_killed_once_its_decision_is_written_not_while_it_is_asked() -> None:
    """A call that asks for an approval is paused before its body ever runs: that pause is no outcome, and no case
    kills there. Its points: the claim, the decision written, then its run. Killed with the decision written, it
    runs once on resume; killed while it ran, it asks again and its human approves again (in doubt, settled)."""
    report = run("approved_by_its_human")
    assert [call.points for call in report.calls] == [
        ["before", "decided", "inside", "after-return", "after-record"]
    ] * 2
    assert {name: verdict for name, (_, verdict) in verdicts(report).items() if name.startswith("1@")} == {
        "1@before": "holds",
        "1@decided": "holds",
        "1@inside": "in doubt, settled by policy",
        "1@after-return": "in doubt, settled by policy",
        "1@after-record": "holds",
    }
    assert verdicts(report)["1@decided"] == (1, "holds")  # killed with the approval written and unspent: runs once


def test_a_start_after_the_resume_must_run_nothing() -> None:
    """With restarts=2 each case starts the agent once more after its resume, nothing killed: a done agent that
    refunds again then is a duplicate. With one restart (the default) that start is not made."""
    once = run("refunds_again_when_started_once_more", case="1@after-record")
    assert verdicts(once) == {"1@after-record": (1, "holds")}
    twice = run("refunds_again_when_started_once_more", case="1@after-record", restarts=2)
    assert verdicts(twice) == {"1@after-record": (1, "DUPLICATE")}
    assert twice.cases[0].details == [
        "started once more after its resume (start 2 after the crash, nothing killed), the agent ran "
        "crashtest_agents.py:bank_refund 1 time(s), refund_order 1 time(s): an agent that is done, or waits for its "
        "human, runs nothing when started again"
    ]


def test_postgres_scheme_cases_get_their_own_tables_and_the_users_records_stay(postgres_url: str) -> None:
    from replaysafe import CallKey, open_ledger, replay_safe, tool_call

    url = postgres_url.replace("postgresql://", "postgres://", 1)
    with open_ledger(url) as ledger:
        with tool_call("production-thread", "msg_1", "call_1"):
            replay_safe(ledger=ledger, name="refund_order")(lambda order: order)("Z9")
        report = run("protected", points=["after-record"], ledger=url)
        assert verdicts(report) == {"1@after-record": (1, "holds"), "2@after-record": (1, "holds")}
        assert ledger.get(CallKey("production-thread", "msg_1", "call_1")) is not None


def test_the_readme_quick_start_agent_holds() -> None:
    """The README's example, as examples/quickstart_agent.py: every case of both refunds holds (8 cases)."""
    report = crashtest("examples/quickstart_agent.py:main", cwd=ROOT, jobs=2)
    assert len(report.cases) == 8 and report.exit_code == 0, report.table()


def test_an_in_doubt_error_inside_an_exception_group_is_the_raise_policy_at_work() -> None:
    report = run("in_a_task_group", points=["inside"], policy="raise")
    assert verdicts(report) == {
        "1@inside": (1, "in doubt, settled by policy"),
        "2@inside": (1, "in doubt, settled by policy"),
    }
