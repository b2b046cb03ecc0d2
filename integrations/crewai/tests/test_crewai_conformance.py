"""The conformance kit on CrewAI (tests/crewai_conformance.py): every scenario holds with ``replay_safe_crew``
and breaks without it, with real SIGKILLs and resumes (a ``@persist`` Flow) in child processes, on SQLite ledgers,
and one scenario on PostgreSQL."""

from __future__ import annotations

import os

import pytest

from replaysafe.testing import conformance

from crewai_conformance import DRIVER


@pytest.mark.parametrize("scenario", conformance.scenarios_for(DRIVER), ids=str)
def test_every_scenario_holds_with_the_adapter_and_breaks_without(scenario: conformance.Scenario) -> None:
    held, control = conformance.check("crewai_conformance:DRIVER", scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    assert held.exit_code == (1 if scenario.runs_unprotected else 0)
    assert not scenario.broken_by(held)
    assert scenario.broken_by(control)


#: The local test server (trust auth); REPLAYSAFE_TEST_POSTGRES_URL points elsewhere.
POSTGRES_URL = os.environ.get("REPLAYSAFE_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")


def test_the_parallel_scenario_holds_on_postgresql() -> None:
    """The same kit case on a PostgreSQL ledger (the kit gives each case a table of its own there): the three
    calls CrewAI runs side by side claim and record on the server."""
    scenario = next(s for s in conformance.scenarios_for(DRIVER) if s.name == "parallel")
    held, control = conformance.check("crewai_conformance:DRIVER", scenario, ledger=POSTGRES_URL)
    assert [case.case for case in held.cases] == [scenario.case]
    assert held.exit_code == 0
    assert control.exit_code == 1
