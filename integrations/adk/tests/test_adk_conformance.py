"""The conformance kit on Google ADK (tests/adk_conformance.py): every scenario that applies holds with
``ReplaySafePlugin`` and breaks without it (or, for an approval's expiry or rejection, with the human or the clock
changed), with real SIGKILLs and resumes of the saved invocation in child processes, on SQLite ledgers; the sibling
case once more on PostgreSQL."""

from __future__ import annotations

import pytest

from replaysafe.testing import conformance

from adk_conformance import DRIVER


@pytest.mark.parametrize("scenario", conformance.scenarios_for(DRIVER), ids=str)
def test_every_scenario_holds_with_the_plugin_and_breaks_without(scenario: conformance.Scenario) -> None:
    held, control = conformance.check("adk_conformance:DRIVER", scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    assert held.exit_code == 0
    assert not scenario.broken_by(held)
    assert scenario.broken_by(control)


def test_the_sibling_case_holds_on_a_postgresql_ledger(postgres_ledger_url: str) -> None:
    """Killed after the first of two calls of one turn was recorded in PostgreSQL: it replays, its sibling runs
    once; without the plugin the refund runs twice."""
    (scenario,) = [s for s in conformance.scenarios_for(DRIVER) if s.name == "sibling_pending"]
    held, control = conformance.check("adk_conformance:DRIVER", scenario, ledger=postgres_ledger_url)
    assert [case.case for case in held.cases] == [scenario.case]
    assert held.exit_code == 0
    assert not scenario.broken_by(held)
    assert scenario.broken_by(control)
