"""The conformance kit on hand-written SDK loops (tests/sdk_loops_conformance.py): every scenario holds with
``run_tool_calls`` and breaks without it, with real SIGKILLs and resumes in child processes.

Chat Completions (sync) and Anthropic Messages (async) run every scenario that applies to a loop saving the
response before its tools; Responses runs ``steps``. The re-plan (``replan_args``) runs on each style's loop
that saves only finished turns; the approval scenarios that need a re-plan (``approval_args_changed``,
``approval_reused``) run on the Chat Completions one.
"""

from __future__ import annotations

import pytest

from replaysafe.testing import conformance

import sdk_loops_conformance as drivers

pytestmark = pytest.mark.slow

CASES = [
    *(("CHAT", scenario) for scenario in conformance.scenarios_for(drivers.CHAT)),
    # The scenarios of a capability (approvals, tool errors) prove the loop's own code, the same for every SDK
    # style: on the Chat Completions loop (above), as CI's budget allows; every style offers them
    # (python -m replaysafe.testing.conformance sdk_loops_conformance:ANTHROPIC runs them all).
    *(("ANTHROPIC", scenario) for scenario in conformance.scenarios_for(drivers.ANTHROPIC) if not scenario.needs),
    *(("RESPONSES", scenario) for scenario in conformance.scenarios_for(drivers.RESPONSES) if scenario.name == "steps"),
    *(
        (name, scenario)
        for name in ("CHAT_REPLAN", "ANTHROPIC_REPLAN", "RESPONSES_REPLAN")
        for scenario in conformance.scenarios_for(getattr(drivers, name))
        if scenario.name == "replan_args"
    ),
    # The approval scenarios whose model re-plans after a restart: only a loop that saves finished turns has them
    # (the command runs them on ANTHROPIC_REPLAN and RESPONSES_REPLAN too).
    *(
        ("CHAT_REPLAN", scenario)
        for scenario in conformance.scenarios_for(drivers.CHAT_REPLAN)
        if scenario.name in drivers.CHAT.not_applicable and scenario.name != "replan_args"
    ),
]


@pytest.mark.parametrize(("driver", "scenario"), CASES, ids=[f"{d.lower()}-{s}" for d, s in CASES])
def test_every_scenario_holds_with_the_helpers_and_breaks_without(driver: str, scenario: conformance.Scenario) -> None:
    held, control = conformance.check(f"sdk_loops_conformance:{driver}", scenario)
    assert [case.case for case in held.cases] == [scenario.case]
    # A tool that runs unprotected (missing ids) is reported so, naming it: the crash test's exit code is 1.
    assert held.exit_code == (1 if scenario.runs_unprotected else 0)
    assert not scenario.broken_by(held)
    assert scenario.broken_by(control)
