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
    assert held.exit_code == 0
    assert control.exit_code == 1
