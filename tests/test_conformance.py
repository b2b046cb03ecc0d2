"""The conformance kit on its reference driver (tests/conformance_driver.py): every scenario holds with
``@replay_safe`` and breaks without it, with real SIGKILLs and resumes in child processes."""

from __future__ import annotations

import dataclasses

import pytest

from replaysafe.testing import conformance

DRIVER = "tests.conformance_driver:DRIVER"

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("scenario", conformance.SCENARIOS, ids=str)
def test_every_scenario_holds_with_the_adapter_and_breaks_without(scenario: conformance.Scenario) -> None:
    held, control = conformance.check(DRIVER, scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    # A tool that runs unprotected (missing ids) is reported so, naming it: the crash test's exit code is 1.
    assert held.exit_code == (1 if scenario.runs_unprotected else 0)
    assert not scenario.broken_by(held)
    assert scenario.broken_by(control)


def test_a_scenario_whose_control_does_not_break_has_no_teeth() -> None:
    """A control that cannot duplicate (here: the re-plan scenario's control keeps key="args") fails the check."""
    toothless = conformance.Scenario(
        "replan_args",
        conformance.SCENARIOS[-1].script,
        "a control that cannot show the duplicate",
        case="1@after-record",
        options={"key": "args"},
        control={"key": "args"},
    )
    with pytest.raises(conformance.ConformanceError, match="no teeth"):
        conformance.check(DRIVER, toothless)


def test_an_adapter_that_does_not_protect_fails() -> None:
    """The kit's first check fails an adapter that leaves the tools plain: its ``case`` does not even exist."""
    with pytest.raises(Exception, match="no case '1@after-record'"):
        conformance.check("tests.conformance_driver:UNPROTECTED", conformance.SCENARIOS[0])


def scenario(name: str, **changes: object) -> conformance.Scenario:
    found = next(s for s in conformance.SCENARIOS if s.name == name)
    return dataclasses.replace(found, **changes)  # type: ignore[arg-type]


def test_a_resume_that_does_nothing_fails() -> None:
    """An adapter whose resume does nothing duplicates nothing, and still fails: the resume left undone the work
    the run that was not killed did."""
    with pytest.raises(conformance.ConformanceError, match="left work undone"):
        conformance.check("tests.conformance_driver:IDLE_RESUME", scenario("two_turns", case="1@after-record"))


def test_a_run_killed_before_its_approval_was_asked_may_wait_on_resume() -> None:
    """Killed at the claim of the request, before its human answered: the framework kept no answer, the kit's
    human answers in the first run only, and the resume waits for a decision. Not work left undone; and the
    approval, once given, still never runs the call twice."""
    waits = scenario("approved_crash_inside", case="1@before")
    held, _ = conformance.check("tests.conformance_driver:ASKS_FIRST", waits)
    [case] = held.cases
    assert (case.point, case.effects.get("refund_effect", 0)) == ("before", 0)
    assert held.exit_code == 0 and not waits.broken_by(held)


def test_a_pause_whose_answer_never_reaches_the_tool_fails() -> None:
    """Nothing runs twice when the tool never hears its human's yes, and the check fails all the same: the run
    that was not killed must run what the yes lets run, once."""
    with pytest.raises(conformance.ConformanceError, match="notify_effect` 0 time"):
        conformance.check("tests.conformance_driver:DEAF", scenario("pause_approved"))


def test_a_rejection_recorded_as_an_approval_fails_where_the_framework_gates_first() -> None:
    with pytest.raises(conformance.ConformanceError, match="`approved` decision"):
        conformance.check("tests.conformance_driver:REJECTION_AS_APPROVAL", scenario("approval_rejected"))
