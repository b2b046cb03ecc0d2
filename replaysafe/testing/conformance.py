"""The adapter conformance kit: the crash cases every adapter must hold, run with real SIGKILLs.

An adapter (ours, or a third party's in its own repository) gives the kit a small ``Driver``: build an
agent from the given tools and a scripted model (``replaysafe.testing.Script``), with the adapter or
without it, keeping its state under the given folder, and run it to its end (or resume it from what a
killed run left). Each ``Scenario`` is then crash-tested by ``replaysafe crashtest`` (child processes,
SIGKILLs, resumes, counts), with the adapter and without it, the control. ``check`` asserts the
documented outcome and that the control shows the duplicate the case is about: a case whose control
does not is reported as having no teeth, and fails, so no case can pass for want of a crash.

```python
import pytest
from replaysafe.testing import conformance


@pytest.mark.parametrize("scenario", conformance.SCENARIOS, ids=str)
def test_conformance(scenario):
    conformance.check("my_adapter_tests.driver:DRIVER", scenario)
```

CI runs each scenario's one key case (``Scenario.case``); ``check(..., every_case=True)`` runs every
call at every kill point (``python -m replaysafe.testing.conformance DRIVER`` runs them all).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from .._constants import LEDGER_URL_ENV
from .._crash_points import BEFORE
from .._decorator import replay_safe
from .._identity import args_digest
from ..ledgers import Ledger, open_ledger
from . import _case, _forkserver
from ._clock import SteppedClock
from ._crashtest import _RUN_WITHOUT_IDS, UNPROTECTED, CrashReport, CrashTestError, crashtest
from ._effects import side_effect
from ._script import Script, ScriptedCall

#: What the kit hands the agent in its child processes (JSON): the driver, the scenario, the variant.
RUN_ENV = "REPLAYSAFE_CONFORMANCE"
#: The thread (session, conversation) id every scenario's agent runs under.
THREAD_ID = "conformance-thread"
#: This module's name, as the child processes import it (not ``__main__`` when run with ``-m``).
_MODULE = "replaysafe.testing.conformance"


@dataclasses.dataclass(frozen=True)
class ApprovalAnswer:
    """What the kit's human answers a call that asks for an approval (``AgentRun.approval``)."""

    #: ``True``: approved; ``False``: rejected.
    approve: bool = True
    #: An edit: the complete arguments (by parameter name, JSON values) the human approves instead of the
    #: model's. ``None``: the model's arguments, as asked.
    args: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class AgentRun:
    """One run of a scenario's agent, as the driver builds it."""

    #: What the model answers, turn by turn (its ids by ``boot``).
    script: Script
    #: The scenario's tools, plain functions with their side effects marked (a steps tool has its steps
    #: protected already, as an application would): the driver protects them with its adapter, or not.
    tools: Mapping[str, Callable[..., Any]]
    #: Where the agent keeps what must survive a crash (its checkpointer, session, message history).
    folder: Path
    #: The ledger the adapter uses (the case's own).
    ledger: Ledger
    #: ``False`` for the control: the same agent, its tools left plain.
    protect: bool
    #: Options for the adapter's ``@replay_safe`` (``key="args"``, ``in_doubt=...``).
    options: Mapping[str, Any]
    #: How many runs came before this one in this folder (0: the first): a restart after a crash is 1.
    boot: int
    thread_id: str = THREAD_ID
    #: Who answers the agent's approval requests in this run (the kit's human approves in the first run
    #: only); ``None``: nobody answers, and a run that asks for an approval ends waiting for one.
    approver: str | None = None
    #: What the human answers a tool that waits for one (``Driver.ask``, the ``"pauses"`` scenarios), in
    #: every run: ``"yes"`` or ``"no"``.
    answer: str = "yes"
    #: What ``approver`` answers each approval request: approve (as asked, or with an edit) or reject.
    approval: ApprovalAnswer = ApprovalAnswer()
    #: How long an approval lets its call run, in seconds (the adapter's own setting, e.g.
    #: ``approval_expires_in``); ``None``: the adapter's default.
    approval_expires_in: float | None = None


class Driver(Protocol):
    """What an adapter gives the kit. A driver may also have ``not_applicable``: a mapping of scenario name
    to the reason the framework cannot have that case (``scenarios_for`` leaves those out, and says why);
    and ``offers``: the capabilities it drives beyond tool calls (``CAPABILITIES``), for the scenarios that
    need them.

    ``"pauses"``: the driver has ``ask(run, question) -> str``, the framework's way for a tool to wait for
    its human: called inside a tool, it pauses the run the framework's way (LangGraph's ``interrupt``, an
    ADK confirmation, a Strands interrupt...) and the framework runs the tool again on its resume, where
    ``ask`` returns the human's answer (``AgentRun.answer``, given in every run), which the framework keeps.
    The adapter keeps the paused call's completed steps.

    ``"approvals"``: the agent asks its human (``AgentRun.approver``) before it calls a tool of the
    scenario's ``options`` with ``needs_approval``, the framework's own way, and keeps the answer
    (``AgentRun.approval``: approve, approve with an edit, or reject) where the framework keeps it, handing
    it back on resume as the framework does; the adapter records the answer as an approval bound to the call
    it was given for (``replaysafe.approvals``), for ``AgentRun.approval_expires_in`` seconds. A call
    rejected gets the framework's rejection answer and the run goes on. A run whose approval is asked for
    and not answered (``approver`` is ``None``, or the adapter refuses the answer it has: another call's,
    expired, for other arguments, or spent) ends, waiting for a new decision.

    ``"tool_errors"``: a tool's exception reaches the model as the framework's error answer, and the run
    goes on.
    """

    def run(self, run: AgentRun, /) -> None:
        """Build the agent (with the adapter when ``run.protect``), run it until the script ends, resuming
        whatever a killed run left in ``run.folder``; raise what the agent raises."""


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A crash case every adapter must hold."""

    name: str
    script: Script
    #: What the case asserts, in a sentence (the failure message says it).
    promise: str
    #: The case CI runs: ``"N@point"`` (call N, by the order they are made, killed at that point).
    case: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: The in-doubt policy of the tools (``replaysafe crashtest --policy``).
    policy: str | None = None
    #: The control: the same agent without the adapter (``None``), or with these options instead.
    control: Mapping[str, Any] | None = None
    #: The case the control runs: without the adapter, the kill right after a side effect first ran
    #: (``"<module>:<function>@after-return"``); with other options, ``case``.
    control_case: str | None = None
    #: Whether the kit needs the driver to run tools side by side in one turn (a scenario with parallel calls).
    parallel: bool = False
    #: The driver capabilities the scenario needs (``Driver.offers``): a driver without them is not asked.
    needs: frozenset[str] = frozenset()
    #: What the human answers a tool that waits for one (``AgentRun.answer``).
    answer: str = "yes"
    #: What the human answers an approval request (``AgentRun.approval``), and for how long it holds.
    approval: ApprovalAnswer = ApprovalAnswer()
    approval_expires_in: float | None = None
    #: Seconds between the crash and the resume: the resume runs on a clock started that much later
    #: (``SteppedClock``), as a restart after an outage does.
    resume_after: float = 0.0
    #: Side effects (``module:function``) that must not run in a case's resume, whatever the first run did
    #: before it was killed (a rejected call, an expired approval): the check fails if one did.
    never_on_resume: frozenset[str] = frozenset()
    #: The kill points ``never_on_resume`` holds after (``None``: every point).
    never_on_resume_after: frozenset[str] | None = None
    #: Side effects that must not run at all, in any run (a rejected call's).
    never_runs: frozenset[str] = frozenset()
    #: Decisions (``approved``, ``rejected``) the adapter must never write, in any run: a rejection recorded as an
    #: approval fails, even where the framework's own gate keeps the tool from running.
    never_decided: frozenset[str] = frozenset()
    #: Decisions the adapter must write in the run that is not killed: the framework's answer, recorded.
    baseline_decided: frozenset[str] = frozenset()
    #: Whether a case's resume may end waiting for its human with work of the run that was not killed left
    #: undone (an approval refused on resume). Otherwise every side effect that run made is made across the
    #: killed run and its resume: a resume that gives up early fails the check.
    resume_may_wait: bool = False
    #: Side effects that run only with these arguments (by parameter name), an edit's: the run that is not
    #: killed must run each with them and no other (every case's other arguments are reported by the crash test).
    only_with: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    #: How often the run that is not killed must run each of these side effects (a pause answered yes runs what
    #: comes after it, once; answered no, never): an adapter that keeps a pause as the call's outcome fails.
    baseline_runs: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: The conversation id the driver hands the framework (``AgentRun.thread_id``); ``""``: none.
    thread_id: str = THREAD_ID
    #: A tool the adapter cannot protect in this scenario (its ids are missing): the documented outcome is that
    #: it runs unprotected and says so, which the crash test reports as UNPROTECTED, naming it as run without
    #: ids. The check expects exactly that of the adapter, instead of a case that holds.
    runs_unprotected: str | None = None
    #: The control, when it is the adapter with the human or the clock changed (``AgentRun`` fields:
    #: ``approval``, ``approval_expires_in``) rather than the agent without the adapter: it must break the
    #: case's promise, in its ``case``.
    control_run: Mapping[str, Any] | None = None

    def __str__(self) -> str:
        return self.name

    def broken_by(self, report: CrashReport) -> bool:
        """Whether ``report`` breaks this scenario's promise: a case the crash test found broken, or one whose
        resume ran a side effect of ``never_on_resume`` (what a control must do, and the adapter must not). For a
        tool that ``runs_unprotected``: a case that does not name it as run without ids."""
        if self.runs_unprotected is not None:
            return bool(_not_said_unprotected(self, report))
        return report.exit_code == 1 or bool(_never_ran(self, report)) or bool(_decided(self, report))

    def cases_broken(self, report: CrashReport) -> int:
        """How many cases of ``report`` break this scenario's promise, each judged alone (``broken_by``)."""
        return sum(self.broken_by(dataclasses.replace(report, cases=[case])) for case in report.cases)


# --- the scenarios' tools: marked side effects, importable by the child processes -----------------


@side_effect
def refund_effect(order_id: str) -> str:
    return f"re_{order_id}"


@side_effect
def email_effect(to: str) -> str:
    return f"sent_{to}"


@side_effect
def charge_effect(order_id: str) -> str:
    return f"ch_{order_id}"


@side_effect
def notify_effect(order_id: str) -> str:
    return f"nt_{order_id}"


@side_effect
def cancel_effect(order_id: str) -> str:
    return f"cx_{order_id}"


class ProviderError(Exception):
    """The provider acted, then answered with an error."""


def cancel_order(order_id: str) -> str:
    """Cancel an order: the provider cancels it, then times out answering."""
    cancel_effect(order_id)
    raise ProviderError("the provider timed out after cancelling")


def refund_order(order_id: str) -> str:
    """Refund an order (the provider's side effect)."""
    return refund_effect(order_id)


def send_email(to: str) -> str:
    """Email a customer."""
    return email_effect(to)


def _steps_tool(protect: bool) -> Callable[..., Any]:
    charge, notify = charge_effect, notify_effect
    if protect:
        charge = replay_safe(name="charge")(charge_effect)
        notify = replay_safe(name="notify")(notify_effect)

    def charge_and_notify(order_id: str) -> str:
        """Charge an order, then tell the customer: two steps."""
        return f"{charge(order_id)} {notify(order_id)}"

    return charge_and_notify


def _review_tool(protect: bool, ask: Callable[[str], str] | None) -> Callable[..., Any]:
    refund = replay_safe(name="refund")(refund_effect) if protect else refund_effect

    def refund_after_review(order_id: str) -> str:
        """Refund an order (a step), then ask a human whether to tell the customer: notify only if yes."""
        receipt = refund(order_id)
        if ask is None:
            raise RuntimeError("this tool needs a driver that offers pauses (Driver.ask)")
        if ask("tell the customer?") != "yes":
            return f"{receipt}, customer not told"
        return f"{receipt} {notify_effect(order_id)}"

    return refund_after_review


def tools_for(protect: bool, ask: Callable[[str], str] | None = None) -> dict[str, Callable[..., Any]]:
    """Every scenario's tools, by name (``ask``: the driver's way for a tool to wait for its human)."""
    return {
        "refund_order": refund_order,
        "send_email": send_email,
        "charge_and_notify": _steps_tool(protect),
        "cancel_order": cancel_order,
        "refund_after_review": _review_tool(protect, ask),
    }


def _calls(*calls: tuple[str, dict[str, Any]]) -> tuple[ScriptedCall, ...]:
    return tuple(ScriptedCall(tool, args) for tool, args in calls)


_REFUND = ("refund_order", {"order_id": "A1"})
_EMAIL = ("send_email", {"to": "ana@example.com"})

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "sibling_pending",
        Script((_calls(_REFUND, _EMAIL), "done"), name="sibling_pending"),
        "killed after the first of two calls of one turn was recorded: it replays, its sibling runs once",
        case="1@after-record",
        control_case=f"{_MODULE}:refund_effect@after-return",
    ),
    Scenario(
        "two_turns",
        Script((_calls(_REFUND), _calls(_EMAIL), "done"), name="two_turns"),
        "killed after the second turn's call was recorded: nothing of either turn runs again",
        case="2@after-record",
        control_case=f"{_MODULE}:email_effect@after-return",
    ),
    Scenario(
        "parallel",
        Script((_calls(_REFUND, ("refund_order", {"order_id": "B2"}), _EMAIL), "done"), name="parallel"),
        "three calls in one turn, killed after the second was recorded: each ran once",
        case="2@after-record",
        control_case=f"{_MODULE}:refund_effect@after-return",
        parallel=True,
    ),
    Scenario(
        "in_doubt_rerun",
        Script((_calls(_REFUND), "done"), name="in_doubt_rerun"),
        "killed inside a tool, after its side effect: the call is in doubt and runs again under rerun",
        case="1@inside",
        control_case=f"{_MODULE}:refund_effect@after-return",
        policy="rerun",
    ),
    Scenario(
        "in_doubt_raise",
        Script((_calls(_REFUND), "done"), name="in_doubt_raise"),
        "killed inside a tool under raise: the resume raises CallInDoubtError and the tool does not run again",
        case="1@inside",
        control_case=f"{_MODULE}:refund_effect@after-return",
        policy="raise",
    ),
    Scenario(
        "steps",
        Script((_calls(("charge_and_notify", {"order_id": "A1"})), "done"), name="steps"),
        "killed after a tool's first step was recorded: the step replays, the tool's second step runs once",
        case="2@after-record",
        control_case=f"{_MODULE}:charge_effect@after-return",
    ),
    Scenario(
        "replan_args",
        Script((_calls(_REFUND), "done"), name="replan_args", new_ids_after_restart=True),
        'the model re-plans the call under new ids after a restart: under key="args" it replays',
        case="1@after-record",
        options={"key": "args"},
        control={"key": "call"},
    ),
    Scenario(
        "approved_crash_inside",
        Script((_calls(_REFUND), "done"), name="approved_crash_inside"),
        "approved by its human, then killed inside the tool after its side effect: the resume asks for a new "
        "decision instead of running it a second time on the same approval",
        case="1@inside",
        options={"needs_approval": True},
        # Nobody answers in the resume: a second run there is one on the spent approval (the crash test alone
        # would call it "in doubt, settled by policy").
        never_on_resume=frozenset({f"{_MODULE}:refund_effect"}),
        never_on_resume_after=frozenset({"inside", "after-return"}),
        control_case=f"{_MODULE}:refund_effect@after-return",
        needs=frozenset({"approvals"}),
    ),
    Scenario(
        "approval_args_changed",
        Script(
            (_calls(_REFUND), "done"),
            name="approval_args_changed",
            after_restart=(_calls(("refund_order", {"order_id": "Z9"})), "done"),
        ),
        "approved, killed once the decision was written; on resume the model asks for the same call with other "
        "arguments: refused (ApprovalMismatchError), nothing runs, and the call waits for a new decision",
        case="1@decided",
        options={"needs_approval": True},
        control_case=f"{_MODULE}:refund_effect@after-return",
        needs=frozenset({"approvals"}),
        resume_may_wait=True,
    ),
    Scenario(
        "approval_edited",
        Script((_calls(_REFUND), "done"), name="approval_edited"),
        "approved with an edit (order A2 for the model's A1), killed once the decision was written: the resume "
        "runs the edit, once, and never the model's arguments",
        case="1@decided",
        options={"needs_approval": True},
        approval=ApprovalAnswer(args={"order_id": "A2"}),
        only_with={f"{_MODULE}:refund_effect": {"order_id": "A2"}},
        control_case=f"{_MODULE}:refund_effect@after-return",
        needs=frozenset({"approvals"}),
    ),
    Scenario(
        "approval_expired",
        Script((_calls(_REFUND), "done"), name="approval_expired"),
        "approved for 60 s, killed once the decision was written, resumed 120 s later: the approval has expired "
        "(ApprovalExpiredError), the tool does not run, and the call waits for a new decision",
        case="1@decided",
        options={"needs_approval": True},
        approval_expires_in=60.0,
        resume_after=120.0,
        never_on_resume=frozenset({f"{_MODULE}:refund_effect"}),
        # Killed before the decision was written, the answer is recorded on resume, and an approval holds from
        # when it is recorded: it may run then.
        never_on_resume_after=frozenset({"decided", "inside", "after-return", "after-record"}),
        control_run={"approval_expires_in": 3600.0},
        needs=frozenset({"approvals"}),
        resume_may_wait=True,
    ),
    Scenario(
        "approval_rejected",
        Script((_calls(_REFUND), "done"), name="approval_rejected"),
        "rejected by its human, killed once the decision was written: on resume the model gets the rejection "
        "and the tool never runs",
        case="1@decided",
        options={"needs_approval": True},
        approval=ApprovalAnswer(approve=False),
        never_on_resume=frozenset({f"{_MODULE}:refund_effect"}),
        never_runs=frozenset({f"{_MODULE}:refund_effect"}),
        never_decided=frozenset({"approved"}),
        baseline_decided=frozenset({"rejected"}),
        control_run={"approval": ApprovalAnswer(approve=True)},
        needs=frozenset({"approvals"}),
    ),
    Scenario(
        "approval_reused",
        Script((_calls(_REFUND), "done"), name="approval_reused", new_ids_after_restart=True),
        "approved and run, killed once its result was written; on resume the model asks again with the same "
        "arguments under new ids and the framework hands back the answer it kept: a second call, which asks for "
        "its own approval and does not run on the first one's",
        case="1@after-record",
        options={"needs_approval": True},
        control_case=f"{_MODULE}:refund_effect@after-return",
        needs=frozenset({"approvals"}),
        resume_may_wait=True,  # killed before the first call ran, the second waits for its own decision
        # ... and runs nothing: nobody answers it in the resume (the first call's answer is not its own).
        never_on_resume=frozenset({f"{_MODULE}:refund_effect"}),
        never_on_resume_after=frozenset({"before", "decided"}),
    ),
    Scenario(
        "missing_ids",
        Script((_calls(_REFUND), "done"), name="missing_ids"),
        "the framework gives the adapter no conversation id: the tool runs unprotected, said with an "
        "UnprotectedCallWarning and an `unprotected` event, and a crash test names it (nothing is replayed "
        "under an id made up for it)",
        case=f"{_MODULE}:refund_effect@after-return",
        control_case=f"{_MODULE}:refund_effect@after-return",
        thread_id="",
        runs_unprotected="refund_order",
    ),
    Scenario(
        "tool_error_recorded",
        Script((_calls(("cancel_order", {"order_id": "A1"})), "done"), name="tool_error_recorded"),
        "a tool whose provider acted, then failed, killed once its failure was recorded (record_errors): the "
        "resume hands the model the recorded failure and does not run the tool again",
        case="1@after-record",
        options={"record_errors": True},
        control_case=f"{_MODULE}:cancel_effect@after-return",
        needs=frozenset({"tool_errors"}),
    ),
    Scenario(
        "pause_approved",
        Script((_calls(("refund_after_review", {"order_id": "A1"})), "done"), name="pause_approved"),
        "a step, then a pause for a human, killed once the step was recorded: on resume the step replays, the "
        "human's yes lets the side effect after the pause run, once",
        case="2@after-record",
        control_case=f"{_MODULE}:refund_effect@after-return",
        needs=frozenset({"pauses"}),
        baseline_runs={f"{_MODULE}:refund_effect": 1, f"{_MODULE}:notify_effect": 1},
    ),
    Scenario(
        "pause_rejected",
        Script((_calls(("refund_after_review", {"order_id": "A1"})), "done"), name="pause_rejected"),
        "a step, then a pause for a human who says no, killed once the step was recorded: on resume the step "
        "replays, and the side effect after the pause never runs",
        case="2@after-record",
        control_case=f"{_MODULE}:refund_effect@after-return",
        needs=frozenset({"pauses"}),
        answer="no",
        baseline_runs={f"{_MODULE}:refund_effect": 1, f"{_MODULE}:notify_effect": 0},
    ),
)

#: The capabilities a scenario may need of a driver (``Driver.offers``).
CAPABILITIES = frozenset({"approvals", "pauses", "tool_errors"})
#: Who approves in the kit's scenarios (``AgentRun.approver`` in the first run).
APPROVER = "conformance-human"


def scenarios_for(driver: object) -> list[Scenario]:
    """The scenarios that apply to ``driver``: all but its ``not_applicable`` ones and those needing a
    capability it does not offer (``Driver.offers``)."""
    left_out: Mapping[str, str] = getattr(driver, "not_applicable", {})
    unknown = set(left_out) - {s.name for s in SCENARIOS}
    if unknown:
        raise ValueError(f"not_applicable names no scenario: {sorted(unknown)}")
    offers: frozenset[str] = frozenset(getattr(driver, "offers", ()))
    if offers - CAPABILITIES:
        raise ValueError(f"offers names no capability: {sorted(offers - CAPABILITIES)} (known: {sorted(CAPABILITIES)})")
    return [s for s in SCENARIOS if s.name not in left_out and s.needs <= offers]


# --- the child's side: the entry point crashtest runs --------------------------------------------


def entry() -> None:
    """The entry point the kit hands ``crashtest``: run the scenario's agent through the driver."""
    spec = json.loads(os.environ[RUN_ENV])
    module_name, _, attribute = spec["driver"].partition(":")
    driver: Driver = getattr(importlib.import_module(module_name), attribute)
    scenario = next(s for s in SCENARIOS if s.name == spec["scenario"])
    folder = Path(os.environ[_case.DIR_ENV])
    boots = folder / ".replaysafe-conformance-boots"
    boot = int(boots.read_text()) if boots.exists() else 0
    boots.write_text(str(boot + 1))  # before anything runs: a run killed at once still counts as a boot
    changes = _run_changes(spec.get("run", {}))
    later = (
        SteppedClock(datetime.now(timezone.utc) + timedelta(seconds=scenario.resume_after))
        if boot and scenario.resume_after
        else contextlib.nullcontext()
    )
    with open_ledger(os.environ[LEDGER_URL_ENV]) as ledger, later:
        asking: dict[str, AgentRun] = {}
        ask = getattr(driver, "ask", None)

        def asked(question: str) -> str:
            answer: str = ask(asking["run"], question)  # type: ignore[misc]
            return answer

        run = AgentRun(
            scenario.script.for_boot(boot),
            tools_for(spec["protect"], asked if ask is not None else None),
            folder,
            ledger,
            spec["protect"],
            spec["options"],
            boot,
            approver=APPROVER if boot == 0 else None,
            answer=scenario.answer,
            thread_id=scenario.thread_id,
            approval=changes.get("approval", scenario.approval),
            approval_expires_in=changes.get("approval_expires_in", scenario.approval_expires_in),
        )
        asking["run"] = run
        driver.run(run)


def _run_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """A control's ``AgentRun`` changes, as the child reads them back from JSON."""
    out = dict(changes)
    if isinstance(out.get("approval"), Mapping):
        out["approval"] = ApprovalAnswer(**out["approval"])
    return out


# --- the test's side -----------------------------------------------------------------------------


def _crashtest(
    driver: str,
    scenario: Scenario,
    protect: bool,
    options: Mapping[str, Any],
    case: str | None,
    ledger: str | None,
    run: Mapping[str, Any] | None = None,
    jobs: int = 1,
) -> CrashReport:
    changes = {
        name: dataclasses.asdict(value) if isinstance(value, ApprovalAnswer) else value
        for name, value in (run or {}).items()
    }
    spec = {"driver": driver, "scenario": scenario.name, "protect": protect, "options": dict(options), "run": changes}
    return crashtest(
        f"{_MODULE}:entry",
        ledger=ledger,
        policy=scenario.policy,  # type: ignore[arg-type]
        case=case,
        keep=False,
        jobs=jobs,
        timeout=120,
        # A start after the resume must run nothing: an answer a human gave, recorded twice, shows only then. (Asked of
        # the scenarios with a human in them: each start is one more child process per case.)
        restarts=2 if scenario.needs & {"approvals", "pauses"} else 1,
        env={RUN_ENV: json.dumps(spec), _forkserver.GROUP_ENV: driver},  # each driver's framework imported once
    )


class ConformanceError(AssertionError):
    """An adapter does not hold a scenario, or the scenario's control shows no duplicate."""


def check(
    driver: str, scenario: Scenario, *, every_case: bool = False, ledger: str | None = None, jobs: int = 1
) -> tuple[CrashReport, CrashReport]:
    """Crash-test ``scenario`` on the agent ``driver`` (``"module:attribute"``, importable by a child process)
    builds, with the adapter and without it; raise ``ConformanceError`` unless the adapter holds and the
    control shows the duplicate. Returns both reports. ``ledger``: a server's URL (each case gets a table
    or key prefix of its own there); by default a SQLite file in each case's directory. ``jobs``: cases run side
    by side (each in its own directory and ledger namespace)."""
    try:
        held = _crashtest(
            driver, scenario, True, scenario.options, None if every_case else scenario.case, ledger, jobs=jobs
        )
    except CrashTestError as exc:
        if scenario.runs_unprotected is None or "no case" not in str(exc):
            raise
        raise ConformanceError(
            f"{scenario.name}: {scenario.promise}; with the adapter, {scenario.runs_unprotected} was protected under "
            f"ids of its own, though the framework gave none: {exc}"
        ) from None
    ran = (
        _never_ran(scenario, held)
        + _decided(scenario, held)
        + _baseline_ran(scenario, held)
        + _other_arguments(scenario, held)
        + _not_said_unprotected(scenario, held)
        + _left_undone(scenario, held)
    )
    if (held.exit_code != 0 and scenario.runs_unprotected is None) or ran:
        raise ConformanceError(f"{scenario.name}: {scenario.promise}; with the adapter:\n{held.table()}{ran}")
    with_adapter = scenario.control is not None or scenario.control_run is not None
    control_options = scenario.control if scenario.control is not None else scenario.options
    control_case = scenario.case if with_adapter else scenario.control_case
    control = _crashtest(
        driver,
        scenario,
        with_adapter,
        control_options,
        None if every_case else control_case,
        ledger,
        scenario.control_run,
        jobs,
    )
    if not scenario.broken_by(control):
        which = (
            f"options {dict(control_options)}"
            if scenario.control is not None
            else f"the adapter, with {_described(scenario.control_run)}"
            if scenario.control_run is not None
            else "without the adapter"
        )
        raise ConformanceError(
            f"{scenario.name}: no teeth: the control ({which}) did not run anything twice, so the case proves "
            f"nothing about the adapter:\n{control.table()}"
        )
    for report in (held, control):  # what the control broke is the check's point: its folders are not kept
        for case in report.cases:
            if case.folder is not None:
                shutil.rmtree(case.folder, ignore_errors=True)
                with contextlib.suppress(OSError):
                    Path(case.folder).parent.rmdir()  # the run's own folder, once empty
    return held, control


def _never_ran(scenario: Scenario, report: CrashReport) -> str:
    """What ran of the scenario's ``never_on_resume`` effects in each case of ``report``, and of its ``never_runs``
    effects in any run ("" when nothing did)."""
    lines = _forbidden(
        report, scenario.never_runs, lambda run: run.effects, lambda name, count: f"`{name}` ran {count} time(s)"
    )
    # The kill points name the scenario's own calls: an adapter's record of its own (the marker of an answer it
    # recorded, say) killed at "inside" has not run the tool, whose run on resume may then be its first.
    tools = {
        call.tool
        for turn in (*scenario.script.turns, *(scenario.script.after_restart or ()))
        if not isinstance(turn, str)
        for call in turn
    }
    lines += [
        f"\n  case {case.case}: `{name}` ran {case.resumed_effects[name]} time(s) on resume, which this case forbids"
        for case in report.cases
        for name in sorted(scenario.never_on_resume)
        if case.resumed_effects.get(name)
        and (
            scenario.never_on_resume_after is None
            or (case.point in scenario.never_on_resume_after and (case.call is None or case.tool in tools))
        )
    ]
    return "".join(lines)


def _not_said_unprotected(scenario: Scenario, report: CrashReport) -> str:
    """For a scenario whose tool runs unprotected: each case that does not report it so ("" when all do)."""
    tool = scenario.runs_unprotected
    if tool is None:
        return ""
    said = f"`{tool}{_RUN_WITHOUT_IDS}`"
    lines = [
        f"\n  case {case.case}: {case.verdict}, without naming {tool} as run without ids: the adapter made an id up, "
        "or ran it unprotected without saying so"
        for case in report.cases
        if case.verdict != UNPROTECTED or not any(said in detail for detail in case.details)
    ]
    return "".join(lines) if lines or report.cases else f"\n  no case ran: {tool} was never run"


def _forbidden(
    report: CrashReport,
    names: frozenset[str],
    counts: Callable[[Any], Mapping[str, int]],
    said: Callable[[str, int], str],
) -> list[str]:
    """A line for each of ``names`` that the run that was not killed, or a case's runs, counted (``counts`` of
    the report's baseline, or of a case)."""
    lines = [
        f"\n  in the run that was not killed, {said(name, counts(report.baseline)[name])}, which this case forbids"
        for name in sorted(names)
        if counts(report.baseline).get(name)
    ]
    lines += [
        f"\n  case {case.case}: {said(name, counts(case)[name])}, which this case forbids"
        for case in report.cases
        for name in sorted(names)
        if counts(case).get(name)
    ]
    return lines


def _decided(scenario: Scenario, report: CrashReport) -> str:
    """Each ``never_decided`` decision written in any run, and each ``baseline_decided`` one the run that was not
    killed did not write ("" when there is none)."""
    lines = _forbidden(
        report,
        scenario.never_decided,
        lambda run: run.decisions,
        lambda kind, count: f"{count} `{kind}` decision(s) written",
    )
    lines += [
        f"\n  the run that was not killed wrote no `{kind}` decision: the framework's answer was not recorded"
        for kind in sorted(scenario.baseline_decided)
        if not report.baseline.decisions.get(kind)
    ]
    return "".join(lines)


def _baseline_ran(scenario: Scenario, report: CrashReport) -> str:
    """Each ``baseline_runs`` side effect the run that was not killed ran another number of times ("" when none)."""
    return "".join(
        f"\n  the run that was not killed ran `{name}` {report.baseline.effects.get(name, 0)} time(s), where it "
        f"runs {count}"
        for name, count in sorted(scenario.baseline_runs.items())
        if report.baseline.effects.get(name, 0) != count
    )


def _left_undone(scenario: Scenario, report: CrashReport) -> str:
    """Each case whose two runs made fewer of a side effect than the run that was not killed ("" when none did,
    or the scenario's resume may wait). A run killed ``before`` a call that waits for its human may leave it
    waiting: the framework may not have kept an answer yet, and the kit's human answers in the first run only."""
    if scenario.resume_may_wait:
        return ""
    asks = "approvals" in scenario.needs
    lines = [
        f"\n  case {case.case}: `{name}` ran {case.effects.get(name, 0)} time(s) across the killed run and its "
        f"resume, where the run that was not killed ran it {count}: the resume left work undone"
        for case in report.cases
        if not (asks and case.point == BEFORE)
        for name, count in sorted(report.baseline.effects.items())
        if case.effects.get(name, 0) < count
    ]
    return "".join(lines)


def _other_arguments(scenario: Scenario, report: CrashReport) -> str:
    """Where the run that was not killed ran an ``only_with`` effect with other arguments ("" when it did not)."""
    lines = []
    for name, arguments in sorted(scenario.only_with.items()):
        wanted = args_digest(arguments, tool_name=name)
        ran = {digest for (effect, digest), count in report.baseline.effect_args.items() if effect == name and count}
        if ran != {wanted}:
            lines.append(
                f"\n  the run that was not killed ran `{name}` with {len(ran - {wanted})} other set(s) of arguments"
                f"{'' if wanted in ran else ', and never with the approved ones'}"
            )
        elif report.baseline.effect_args[name, wanted] != 1:
            lines.append(
                f"\n  the run that was not killed ran `{name}` {report.baseline.effect_args[name, wanted]} times "
                "with the approved arguments, where they approve one run"
            )
    return "".join(lines)


def _described(changes: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in changes.items())


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m replaysafe.testing.conformance DRIVER [SCENARIO ...]``: every case of every scenario."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(__doc__)
        return 2
    driver, names = args[0], set(args[1:])
    module_name, _, attribute = driver.partition(":")
    target = getattr(importlib.import_module(module_name), attribute)
    for name, why in getattr(target, "not_applicable", {}).items():
        print(f"n/a  {name}: {why}")
    offers = frozenset(getattr(target, "offers", ()))
    for scenario in SCENARIOS:
        if not scenario.needs <= offers:
            print(f"n/a  {scenario.name}: the driver does not offer {', '.join(sorted(scenario.needs - offers))}")
    failed = 0
    for scenario in scenarios_for(target):
        if names and scenario.name not in names:
            continue
        try:
            held, control = check(driver, scenario, every_case=True)
        except ConformanceError as exc:
            failed += 1
            print(f"FAIL {exc}\n")
            continue
        broke = scenario.cases_broken(control)
        print(f"ok   {scenario.name}: {len(held.cases)} case(s) held; the control broke {broke}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
