"""``replaysafe crashtest`` on the SDK-loop example agent (examples/sdk_loops_agent.py): every case holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from replaysafe.testing import crashtest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


def test_the_example_agent_holds_at_every_recorded_call() -> None:
    report = crashtest("examples/sdk_loops_agent.py:main", cwd=ROOT, points=["after-record"], jobs=2)
    assert report.exit_code == 0, report.table()
    assert [(case.case, case.tool) for case in report.cases] == [
        ("1@after-record", "lookup_order"),
        ("2@after-record", "refund_order"),
        ("3@after-record", "send_email"),
    ]
