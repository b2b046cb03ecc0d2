"""The conformance kit on LlamaIndex (tests/llamaindex_conformance.py): every scenario that applies holds with
``replay_safe_agent`` and breaks without it, with real SIGKILLs and resumes from a saved ``Context``."""

from __future__ import annotations

import pytest

from replaysafe.testing import conformance

from llamaindex_conformance import DRIVER


@pytest.mark.parametrize("scenario", conformance.scenarios_for(DRIVER), ids=str)
def test_every_scenario_holds_with_the_adapter_and_breaks_without(scenario: conformance.Scenario) -> None:
    held, control = conformance.check("llamaindex_conformance:DRIVER", scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    assert held.exit_code == (1 if scenario.runs_unprotected else 0)
    assert not scenario.broken_by(held)
    assert scenario.broken_by(control)


@pytest.mark.parametrize("name", ["sibling_pending", "in_doubt_raise"])
def test_scenarios_hold_on_a_postgresql_ledger(name: str, postgres_ledger_url: str) -> None:
    """The same kit, its ledger on PostgreSQL (each case a table of its own in this test's schema): a kill with a
    sibling call pending, and a call in doubt refused under ``raise``."""
    scenario = next(scenario for scenario in conformance.SCENARIOS if scenario.name == name)
    held, control = conformance.check("llamaindex_conformance:DRIVER", scenario, ledger=postgres_ledger_url)
    assert (held.exit_code, control.exit_code) == (0, 1)


def test_only_the_replan_scenario_is_left_out() -> None:
    """Re-planning is tested in test_llamaindex.py (``key="args"`` on a re-asked model, a re-parsed ReActAgent)."""
    assert set(DRIVER.not_applicable) == {"replan_args"}
