"""``examples/adk_agent.py`` under ``replaysafe crashtest``: every case holds."""

from __future__ import annotations

from pathlib import Path

from replaysafe.testing import crashtest

ROOT = Path(__file__).resolve().parents[3]


def test_the_example_agent_holds_every_case() -> None:
    """Three protected calls (a lookup, then a refund and an email in one turn), each killed once its outcome is
    recorded: 3 cases, each resumed from the saved session's invocation, none broken. (Without the plugin the
    refund, killed after its record while the email was pending, would run again: ADK saves a turn's responses
    only once every call of the turn ran.)"""
    report = crashtest("examples/adk_agent.py:main", cwd=ROOT, points=["after-record"], jobs=2, timeout=120)
    assert [call.tool for call in report.calls] == ["lookup_order", "refund_order", "email_customer"]
    assert [case.case for case in report.cases] == ["1@after-record", "2@after-record", "3@after-record"]
    assert report.exit_code == 0, report.table()
    assert not any(case.broken or case.untested for case in report.cases), report.table()
