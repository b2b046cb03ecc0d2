"""``replaysafe crashtest`` on ``examples/tenxgraph_agent.py``: every case holds: killed right after each
tool call's record was written, the resumed agent replays it (CI's time: one kill point of the four)."""

from __future__ import annotations

from pathlib import Path

from replaysafe.testing import crashtest

ROOT = Path(__file__).resolve().parents[3]


def test_the_example_agent_holds_every_case() -> None:
    report = crashtest("examples/tenxgraph_agent.py:main", cwd=ROOT, points=["after-record"], jobs=2)
    assert report.exit_code == 0, report.table()
    assert [call.tool for call in report.calls] == ["refund_order", "send_email"]
    assert [case.case for case in report.cases] == ["1@after-record", "2@after-record"]
    assert report.effects == {}, report.table()  # every provider call is made inside a protected tool
