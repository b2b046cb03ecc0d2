"""The conformance kit (``replaysafe.testing.conformance``) on 10xGraph: each scenario holds with the adapter and
breaks without it, with real SIGKILLs and resumes in child processes (the driver: ``tenxgraph_conformance_driver.py``).
CI runs each scenario's key case; every case at every kill point, from ``integrations/tenxgraph``::

    PYTHONPATH=tests .venv312/bin/python -m replaysafe.testing.conformance tenxgraph_conformance_driver:DRIVER
"""

from __future__ import annotations

import pytest

from replaysafe.testing import conformance

from tenxgraph_conformance_driver import DRIVER


@pytest.mark.parametrize("scenario", conformance.scenarios_for(DRIVER), ids=str)
def test_each_scenario_holds_with_the_adapter_and_breaks_without_it(scenario: conformance.Scenario) -> None:
    held, control = conformance.check("tenxgraph_conformance_driver:DRIVER", scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    assert held.exit_code == (1 if scenario.runs_unprotected else 0)
    assert not scenario.broken_by(held)
    assert scenario.broken_by(control)
