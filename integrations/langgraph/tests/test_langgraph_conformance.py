"""The conformance kit (``replaysafe.testing.conformance``) on LangGraph's agents: each scenario holds with the
adapter and breaks without it, with real SIGKILLs and resumes in child processes (the drivers:
``langgraph_conformance_driver.py``). CI runs each scenario's key case; every case at every kill point::

    export PYTHONPATH=integrations/langgraph/tests
    python -m replaysafe.testing.conformance langgraph_conformance_driver:DRIVER

The ``create_agent`` agent (the README's) runs every scenario but the two of ``DRIVER.not_applicable`` (a model
re-planning after a restart, which LangGraph's review cannot have: see there why). The ``StateGraph`` with a
``ToolNode`` runs those where it differs from it: a ``ToolNode`` runs all the calls of a model turn as one task,
saved when the last one ends (``sibling_pending``), steps inside a tool (``steps``), and the approvals, which it
takes through a review node of its own (``interrupt()``, the answer recorded with ``replaysafe.approvals``)
rather than ``ReplaySafeHumanInTheLoopMiddleware``; the others exercise the same interceptor, checkpointer and
resume (``python -m ... langgraph_conformance_driver:TOOLNODE_DRIVER`` runs them all).
"""

from __future__ import annotations

import pytest

from replaysafe.testing import conformance

from langgraph_conformance_driver import DRIVER, TOOLNODE_DRIVER, LangGraphDriver

#: The scenarios the ``ToolNode`` graph runs in CI (see above).
TOOLNODE_SCENARIOS = {
    "sibling_pending",
    "steps",
    "approved_crash_inside",
    "approval_edited",
    "approval_expired",
    "approval_rejected",
}


@pytest.mark.parametrize("scenario", conformance.scenarios_for(DRIVER), ids=str)
def test_create_agent_holds_each_scenario_and_breaks_without_the_adapter(scenario: conformance.Scenario) -> None:
    held, control = conformance.check("langgraph_conformance_driver:DRIVER", scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    assert held.exit_code == (1 if scenario.runs_unprotected else 0)  # missing ids: reported UNPROTECTED
    assert not scenario.broken_by(held)
    assert scenario.broken_by(control)


@pytest.mark.parametrize(
    "scenario", [s for s in conformance.scenarios_for(TOOLNODE_DRIVER) if s.name in TOOLNODE_SCENARIOS], ids=str
)
def test_a_tool_node_holds_each_scenario_and_breaks_without_the_adapter(scenario: conformance.Scenario) -> None:
    held, control = conformance.check("langgraph_conformance_driver:TOOLNODE_DRIVER", scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    assert held.exit_code == (1 if scenario.runs_unprotected else 0)  # missing ids: reported UNPROTECTED
    assert not scenario.broken_by(held)
    assert scenario.broken_by(control)


@pytest.mark.parametrize("driver", [DRIVER, TOOLNODE_DRIVER], ids=["create_agent", "toolnode"])
def test_the_approval_scenarios_left_out_are_those_a_resume_cannot_have(driver: LangGraphDriver) -> None:
    """Both drivers offer approvals and leave out only the scenarios whose model re-plans after a restart."""
    names = {s.name for s in conformance.SCENARIOS if "approvals" in s.needs}
    ran = {s.name for s in conformance.scenarios_for(driver)} & names
    assert ran == names - {"approval_args_changed", "approval_reused"}
    assert set(driver.not_applicable) == {"approval_args_changed", "approval_reused"}
