"""``examples/llamaindex_agent.py`` under ``replaysafe crashtest``: every case holds."""

from __future__ import annotations

from pathlib import Path

from replaysafe.testing import crashtest

ROOT = Path(__file__).resolve().parents[3]


def test_the_example_agent_holds_every_case() -> None:
    """Three protected calls (a lookup, then a refund and an email in one turn), each killed once its outcome is
    recorded: 3 cases, each resumed from the saved ``Context`` (or from the start, when the kill came before one
    was saved), none broken. (LlamaIndex runs the turn's two calls side by side: a kill after one's record may find
    its sibling mid-call, in doubt, and rerun under the default policy, which the promise allows.)"""
    report = crashtest("examples/llamaindex_agent.py:main", cwd=ROOT, points=["after-record"], jobs=2, timeout=120)
    tools = [call.tool for call in report.calls]  # the refund and the email run side by side: in either order
    assert tools[0] == "lookup_order"
    assert sorted(tools[1:]) == ["email_customer", "refund_order"]
    assert [case.case for case in report.cases] == ["1@after-record", "2@after-record", "3@after-record"]
    assert report.exit_code == 0, report.table()
    assert not any(case.broken or case.untested for case in report.cases), report.table()
