"""The conformance kit on the Agents SDK (tests/agents_conformance.py): every scenario that applies holds with
``replay_safe_agent`` and breaks without it (or, for an approval case whose control is the adapter with the human
or the clock changed, breaks with that change), with real SIGKILLs and resumes in child processes."""

from __future__ import annotations

import pytest

from replaysafe.testing import conformance

from agents_conformance import DRIVER


@pytest.mark.parametrize("scenario", conformance.scenarios_for(DRIVER), ids=str)
def test_every_scenario_holds_with_the_adapter_and_breaks_without(scenario: conformance.Scenario) -> None:
    held, control = conformance.check("agents_conformance:DRIVER", scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    # A tool that runs unprotected (missing ids) is reported so, naming it: the crash test's exit code is 1.
    assert held.exit_code == (1 if scenario.runs_unprotected else 0)
    assert not scenario.broken_by(held)
    assert scenario.broken_by(control)


def test_the_cases_the_sdk_cannot_have_are_named_with_their_reason() -> None:
    applicable = {scenario.name for scenario in conformance.scenarios_for(DRIVER)}
    assert set(DRIVER.not_applicable) == {"approval_edited", "approval_args_changed", "approval_reused"}
    assert not applicable & set(DRIVER.not_applicable)
    assert {"approved_crash_inside", "approval_expired", "approval_rejected"} <= applicable
