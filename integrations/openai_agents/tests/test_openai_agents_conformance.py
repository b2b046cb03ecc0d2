"""The conformance kit on the Agents SDK (tests/agents_conformance.py): every scenario holds with
``replay_safe_agent`` and breaks without it, with real SIGKILLs and resumes in child processes."""

from __future__ import annotations

import pytest

from replaysafe.testing import conformance

from agents_conformance import DRIVER


@pytest.mark.parametrize("scenario", conformance.scenarios_for(DRIVER), ids=str)
def test_every_scenario_holds_with_the_adapter_and_breaks_without(scenario: conformance.Scenario) -> None:
    held, control = conformance.check("agents_conformance:DRIVER", scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    assert held.exit_code == 0
    assert control.exit_code == 1
