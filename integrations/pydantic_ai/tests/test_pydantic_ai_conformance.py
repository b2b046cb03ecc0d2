"""The conformance kit on Pydantic AI (tests/pydantic_ai_conformance.py): every scenario holds with the
``ReplaySafe`` capability and breaks without it, with real SIGKILLs and resumes in child processes."""

from __future__ import annotations

import pytest

from replaysafe.testing import conformance

from pydantic_ai_conformance import DRIVER


@pytest.mark.parametrize("scenario", conformance.scenarios_for(DRIVER), ids=str)
def test_every_scenario_holds_with_the_capability_and_breaks_without(scenario: conformance.Scenario) -> None:
    held, control = conformance.check("pydantic_ai_conformance:DRIVER", scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    # A tool that runs unprotected (missing ids) is reported so, naming it: the crash test's exit code is 1.
    assert held.exit_code == (1 if scenario.runs_unprotected else 0)
    assert not scenario.broken_by(held)
    assert scenario.broken_by(control)


def test_the_driver_leaves_out_only_what_pydantic_ai_cannot_have() -> None:
    """Every approval scenario runs but the one Pydantic AI cannot have (its reason is the driver's)."""
    names = {scenario.name for scenario in conformance.scenarios_for(DRIVER)}
    approvals = {scenario.name for scenario in conformance.SCENARIOS if "approvals" in scenario.needs}
    assert approvals - names == set(DRIVER.not_applicable) == {"approval_reused"}
