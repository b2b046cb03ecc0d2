"""The conformance kit on the Agents SDK (tests/agents_conformance.py): every scenario holds with
``replay_safe_agent`` and breaks without it, with real SIGKILLs and resumes in child processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replaysafe.testing import conformance

from agents_conformance import DRIVER


@pytest.fixture(autouse=True)
def driver_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kit's children import the driver by its module name: this folder goes on their ``PYTHONPATH``."""
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))


@pytest.mark.parametrize("scenario", conformance.scenarios_for(DRIVER), ids=str)
def test_every_scenario_holds_with_the_adapter_and_breaks_without(scenario: conformance.Scenario) -> None:
    held, control = conformance.check("agents_conformance:DRIVER", scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    assert held.exit_code == 0
    assert control.exit_code == 1
