"""The conformance kit on MCP's client side (tests/mcp_conformance.py): every scenario that applies holds with
``replay_safe_session`` and breaks without it, with real SIGKILLs and resumes in child processes."""

from __future__ import annotations

import pytest

from replaysafe.testing import conformance

from mcp_conformance import DRIVER

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("scenario", conformance.scenarios_for(DRIVER), ids=str)
def test_every_scenario_holds_with_the_session_and_breaks_without(scenario: conformance.Scenario) -> None:
    held, control = conformance.check("mcp_conformance:DRIVER", scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    assert held.exit_code == (1 if scenario.runs_unprotected else 0)
    assert not scenario.broken_by(held)
    assert scenario.broken_by(control)
