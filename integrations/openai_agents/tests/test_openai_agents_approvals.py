"""The Agents SDK's approvals (``needs_approval``, ``RunState.approve`` / ``reject``) as bound replaysafe approvals.

Real agents on the SDK's own ``ScriptedModel``, a SQLite ledger file (PostgreSQL for one case), the SDK's own
persistence (``RunState.to_json`` / ``RunState.from_json``) and, where a crash is involved, processes run with
``replaysafe.testing.run_in_child`` and SIGKILLed at a ``kill_point`` after the side effect. Each case has an
unprotected control: the same agent without the adapter.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from agents import Agent, FunctionTool, Runner, RunState, function_tool
from agents.items import ToolCallOutputItem
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

import replaysafe
from replaysafe import (
    ApprovalExpiredError,
    ApprovalRequiredError,
    CallKey,
    Ledger,
    ReplayMismatchError,
    SqliteLedger,
    Status,
    approvals,
)
from replaysafe.testing import SteppedClock, kill_point, run_in_child
from replaysafe_openai_agents import context_field, replay_safe_agent

from agents_scenario import RUN_CONFIG, THREAD

ASKED = CallKey(THREAD, "fc_1", "call_1")
CONTEXT = {"thread_id": THREAD, "user": "ana@example.com"}


def append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")


def lines(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines() if Path(path).exists() else []


def refund_step(order_id: str = "A1", call_id: str = "call_1", item_id: str = "fc_1") -> ModelStep:
    call = function_call("refund_order", {"order_id": order_id}, call_id=call_id, item_id=item_id)
    return ModelStep(output=[call], response_id=f"resp_{item_id}")


DONE = ModelStep(output=[assistant_message("Refunded.", item_id="msg_done")], response_id="resp_done")


def build(effects: str, ledger: Ledger, protect: bool, steps: list[ModelStep], **options: Any) -> Agent[Any]:
    """``refund_order``, held back for a person by the SDK (``needs_approval=True``), on a scripted model."""

    def refund_order(order_id: str) -> str:
        append(effects, f"refund {order_id}")
        kill_point("refunded")  # after the side effect
        return f"refunded {order_id}"

    tool = function_tool(refund_order, needs_approval=True)
    assert isinstance(tool, FunctionTool)
    agent: Agent[Any] = Agent(name="support", model=ScriptedModel(steps), tools=[tool])
    if not protect:
        return agent
    return replay_safe_agent(
        agent, ledger, thread_id=context_field("thread_id"), approver=context_field("user"), **options
    )


def outputs(items: list[Any]) -> dict[str, Any]:
    return {
        str(cast(dict[str, Any], item.raw_item)["call_id"]): item.output
        for item in items
        if isinstance(item, ToolCallOutputItem)
    }


async def ask(ledger: Ledger, state: str, effects: str, protect: bool, step: ModelStep | None = None) -> int:
    """A run until the refund waits for approval; the RunState stored (the app's store: a file)."""
    agent = build(effects, ledger, protect, [step or refund_step()])
    result = await Runner.run(agent, "Refund order A1", context=CONTEXT, run_config=RUN_CONFIG)
    await asyncio.to_thread(Path(state).write_text, json.dumps(result.to_state().to_json()), encoding="utf-8")
    return len(result.interruptions)


async def answer(
    ledger: Ledger, state: str, effects: str, protect: bool, decision: str = "approve", **options: Any
) -> dict[str, Any]:
    """Load the stored RunState, answer each interruption as the SDK documents, run on."""
    agent = build(effects, ledger, protect, [DONE], **options)
    stored = await asyncio.to_thread(Path(state).read_text, encoding="utf-8")
    run_state = await RunState.from_json(agent, json.loads(stored))
    for interruption in run_state.get_interruptions():
        if decision == "approve":
            run_state.approve(interruption)
        else:
            run_state.reject(interruption, rejection_message="Refunds need a manager.")
    result = await Runner.run(agent, run_state, run_config=RUN_CONFIG)
    return {"output": result.final_output, "outputs": outputs(result.new_items)}


async def ask_in_child(ledger_path: str, state: str, effects: str, protect: bool) -> int:
    with SqliteLedger(ledger_path) as ledger:
        return await ask(ledger, state, effects, protect)


async def answer_in_child(ledger_path: str, state: str, effects: str, protect: bool) -> dict[str, Any]:
    """``answer`` in a new process; a call that asks for a new decision is reported, not raised."""
    with SqliteLedger(ledger_path) as ledger:
        try:
            return await answer(ledger, state, effects, protect)
        except ApprovalRequiredError as asked:
            return {"asked": list(asked.key or ()), "may_have_run": asked.may_have_run}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    return {
        "ledger_path": str(tmp_path / "ledger.db"),
        "state": str(tmp_path / "state.json"),
        "effects": str(tmp_path / "effects.log"),
    }


@pytest.fixture
def events(replaysafe_events: list[replaysafe.Event]) -> list[replaysafe.Event]:
    return replaysafe_events


def _postgres() -> Iterator[Ledger]:
    schema = f"rs_oai_{uuid.uuid4().hex[:10]}"
    with replaysafe.PostgresLedger("postgresql://root@127.0.0.1:5432/test", schema=schema) as opened:
        try:
            yield opened
        finally:
            with opened.engine.begin() as connection:
                connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgres"])
def any_ledger(request: pytest.FixtureRequest, ledger: SqliteLedger) -> Iterator[Ledger]:
    if request.param == "sqlite":
        yield ledger
    else:
        yield from _postgres()


def crash_inside_the_approved_tool(files: dict[str, str], protect: bool) -> None:
    """Asked, approved in a new process, which is SIGKILLed inside the tool after the side effect."""
    asked = run_in_child(ask_in_child, files["ledger_path"], files["state"], files["effects"], protect, timeout=300)
    assert asked.value == 1
    assert lines(files["effects"]) == []
    crashed = run_in_child(answer_in_child, *files.values(), protect, kill_at="refunded", timeout=300)
    assert crashed.killed
    assert lines(files["effects"]) == ["refund A1"]


@pytest.mark.parametrize("protect", [True, False], ids=["adapter", "control"])
def test_a_tool_killed_after_it_ran_on_an_approval_asks_for_a_new_decision_on_resume(
    protect: bool, files: dict[str, str]
) -> None:
    """(a) The stored RunState resumed in a new process, approved again as the SDK documents: the call is in doubt
    and its approval spent, so it does not run; the resume ends asking for a new decision (may have run)."""
    crash_inside_the_approved_tool(files, protect)
    resumed = run_in_child(answer_in_child, *files.values(), protect, timeout=300)
    if not protect:  # the control: the refund runs a second time
        assert resumed.value["outputs"] == {"call_1": "refunded A1"}
        assert lines(files["effects"]) == ["refund A1", "refund A1"]
        return
    assert resumed.value == {"asked": list(ASKED), "may_have_run": True}
    assert lines(files["effects"]) == ["refund A1"]
    # The SDK's approval, read again from the stored state: still asks.
    again = run_in_child(answer_in_child, *files.values(), protect, timeout=300)
    assert again.value == {"asked": list(ASKED), "may_have_run": True}
    assert lines(files["effects"]) == ["refund A1"]

    # The approver looked it up at the provider and decides again, with replaysafe: the call runs once more.
    with SqliteLedger(files["ledger_path"]) as ledger:
        approvals.approve(ASKED, by="ana@example.com", ledger=ledger)
    done = run_in_child(answer_in_child, *files.values(), protect, timeout=300)
    assert done.value == {"output": "Refunded.", "outputs": {"call_1": "refunded A1"}}
    replayed = run_in_child(answer_in_child, *files.values(), protect, timeout=300)
    assert replayed.value == done.value
    assert lines(files["effects"]) == ["refund A1", "refund A1"]


def altered(state: Any) -> Any:
    """The stored RunState with the refund's arguments changed everywhere, and the SDK's own record of the call's
    fingerprint (an unkeyed hash of it, in the same document) dropped, as a store that rewrites the call would."""
    if isinstance(state, dict):
        changed = {key: altered(value) for key, value in state.items() if key != "tool_invocations"}
        if "tool_invocations" in state:
            changed["tool_invocations"] = {}
        return changed
    if isinstance(state, list):
        return [altered(value) for value in state]
    return state.replace('"order_id":"A1"', '"order_id":"Z9"') if isinstance(state, str) else state


@pytest.mark.parametrize("protect", [True, False], ids=["adapter", "control"])
async def test_arguments_changed_after_the_human_was_asked_are_refused(
    protect: bool, ledger: SqliteLedger, files: dict[str, str]
) -> None:
    """(b) The stored RunState's call is changed (a re-planned or altered call under the same ids) before it is
    approved: the SDK's approval is per call id, the ledger's is bound to the arguments the human was shown."""
    assert await ask(ledger, files["state"], files["effects"], protect) == 1
    stored = await asyncio.to_thread(Path(files["state"]).read_text, encoding="utf-8")
    await asyncio.to_thread(Path(files["state"]).write_text, json.dumps(altered(json.loads(stored))), encoding="utf-8")
    if not protect:  # the control: the SDK runs what the human was not shown
        await answer(ledger, files["state"], files["effects"], protect)
        assert lines(files["effects"]) == ["refund Z9"]
        return
    with pytest.raises(ReplayMismatchError):
        await answer(ledger, files["state"], files["effects"], protect)
    assert lines(files["effects"]) == []
    record = ledger.get(ASKED)
    assert record is not None
    assert record.status is Status.PAUSED  # still waits for a decision on what was asked

    # The call as asked, approved: it runs, once.
    await asyncio.to_thread(Path(files["state"]).write_text, stored, encoding="utf-8")
    done = await answer(ledger, files["state"], files["effects"], protect)
    assert done == {"output": "Refunded.", "outputs": {"call_1": "refunded A1"}}
    assert lines(files["effects"]) == ["refund A1"]


async def test_the_sdk_answer_is_recorded_by_its_approver_and_runs_once(
    ledger: SqliteLedger, files: dict[str, str], events: list[replaysafe.Event]
) -> None:
    """(c, as far as the SDK goes: it has no edit) The request is recorded when the human is asked, the SDK's
    approval by the approver (``approver=``) when the run resumes with it, and the claim spends it."""
    await ask(ledger, files["state"], files["effects"], True)
    record = ledger.get(ASKED)
    assert record is not None
    assert record.status is Status.PAUSED  # asked: in the ledger before anyone answered
    done = await answer(ledger, files["state"], files["effects"], True)
    assert done == {"output": "Refunded.", "outputs": {"call_1": "refunded A1"}}
    again = await answer(ledger, files["state"], files["effects"], True)  # the stored state resumed again
    assert again == done
    assert lines(files["effects"]) == ["refund A1"]
    kinds = [
        (event.kind, event.approver) for event in events if event.key == ASKED and event.kind.name.startswith("APPR")
    ]
    assert kinds == [
        (replaysafe.EventKind.APPROVAL_REQUESTED, None),
        (replaysafe.EventKind.APPROVED, "ana@example.com"),
    ]


@pytest.mark.parametrize("protect", [True, False], ids=["adapter", "control"])
def test_an_expired_approval_is_refused(protect: bool, files: dict[str, str]) -> None:
    """(d) After the crash, the approver's new decision expires before the run is resumed: refused, nothing runs."""
    crash_inside_the_approved_tool(files, protect)
    with SteppedClock() as clock, SqliteLedger(files["ledger_path"]) as ledger:
        if not protect:  # the control: the resume runs the refund again, on no decision at all
            asyncio.run(answer(ledger, files["state"], files["effects"], protect))
            assert lines(files["effects"]) == ["refund A1", "refund A1"]
            return
        with pytest.raises(ApprovalRequiredError):
            asyncio.run(answer(ledger, files["state"], files["effects"], protect))
        approvals.approve(ASKED, by="ana@example.com", expires_in=60, ledger=ledger)
        clock.advance(61)
        with pytest.raises(ApprovalExpiredError):
            asyncio.run(answer(ledger, files["state"], files["effects"], protect))
        assert lines(files["effects"]) == ["refund A1"]
        record = ledger.get(ASKED)
        assert record is not None
        assert record.status is Status.PAUSED


@pytest.mark.parametrize("protect", [True, False], ids=["adapter", "control"])
async def test_a_rejected_call_never_runs_even_on_a_stale_approval(
    protect: bool, any_ledger: Ledger, files: dict[str, str], events: list[replaysafe.Event]
) -> None:
    """(e) The human rejects (``RunState.reject``): the model is told, and the rejection is recorded. The same stored
    RunState approved afterwards (a second approver on a stale copy) does not run it: the model is told it was
    not approved, as the SDK tells it."""
    await ask(any_ledger, files["state"], files["effects"], protect)
    rejected = await answer(any_ledger, files["state"], files["effects"], protect, decision="reject")
    assert rejected["outputs"] == {"call_1": "Refunds need a manager."}
    stale = await answer(any_ledger, files["state"], files["effects"], protect)
    if not protect:  # the control: the stale approval runs it
        assert lines(files["effects"]) == ["refund A1"]
        return
    assert stale == {"output": "Refunded.", "outputs": {"call_1": "Refunds need a manager."}}
    assert lines(files["effects"]) == []
    decided = [(event.kind, event.approver) for event in events if event.kind is replaysafe.EventKind.REJECTED]
    assert decided == [(replaysafe.EventKind.REJECTED, "ana@example.com")]


async def approved_then_killed(ledger_path: str, state: str, effects: str) -> None:
    """In a child process: the stored state approved, SIGKILLed once the approval is written (nothing run)."""

    def kill_when_approved(event: replaysafe.Event) -> None:
        if event.kind is replaysafe.EventKind.APPROVED:
            kill_point("decided")

    replaysafe.on_event(kill_when_approved)
    with SqliteLedger(ledger_path) as ledger:
        await answer(ledger, state, effects, True)


async def test_a_rejection_after_a_crash_revokes_the_approval_recorded_before_it(
    ledger: SqliteLedger, files: dict[str, str]
) -> None:
    """Approved, killed once the approval was written (not yet spent); the human then rejects the call, and the
    model is told so. The stored state approved again (a stale copy) runs nothing: the rejection replaced the
    approval in the call's record."""
    await ask(ledger, files["state"], files["effects"], True)
    killed = await asyncio.to_thread(
        run_in_child, approved_then_killed, *files.values(), kill_at="decided", timeout=300
    )
    assert killed.killed
    rejected = await answer(ledger, files["state"], files["effects"], True, decision="reject")
    assert rejected["outputs"] == {"call_1": "Refunds need a manager."}
    stale = await answer(ledger, files["state"], files["effects"], True)
    assert stale["outputs"] == {"call_1": "Refunds need a manager."}
    assert lines(files["effects"]) == []


async def test_a_rejection_is_recorded_once_though_every_later_model_call_sees_it(
    ledger: SqliteLedger, files: dict[str, str], events: list[replaysafe.Event]
) -> None:
    """A1 rejected; the model then asks for B2, approved in a later run; the model is called again with A1's
    rejection in its input each time: the rejection is written once."""
    await ask(ledger, files["state"], files["effects"], True)
    steps = [refund_step("B2", "call_2", "fc_2"), DONE]
    agent = build(files["effects"], ledger, True, steps)
    stored = await asyncio.to_thread(Path(files["state"]).read_text, encoding="utf-8")
    state = await RunState.from_json(agent, json.loads(stored))
    for interruption in state.get_interruptions():
        state.reject(interruption, rejection_message="Refunds need a manager.")
    asked_again = await Runner.run(agent, state, run_config=RUN_CONFIG)  # the model asks for B2: held back
    state = asked_again.to_state()
    for interruption in state.get_interruptions():
        state.approve(interruption)
    done = await Runner.run(agent, state, run_config=RUN_CONFIG)
    assert done.final_output == "Refunded."
    assert lines(files["effects"]) == ["refund B2"]
    assert [event.kind for event in events].count(replaysafe.EventKind.REJECTED) == 1


async def test_a_second_call_with_the_same_arguments_under_other_ids_asks_again(
    ledger: SqliteLedger, files: dict[str, str]
) -> None:
    """(f) Approved and run under call_1; the model asks for the same refund under new ids: a call of its own, which
    waits for its own decision (the SDK asks again) and does not run on the first one's approval."""
    await ask(ledger, files["state"], files["effects"], True)
    await answer(ledger, files["state"], files["effects"], True)
    assert lines(files["effects"]) == ["refund A1"]

    second = CallKey(THREAD, "fc_2", "call_2")
    asked = await ask(ledger, files["state"], files["effects"], True, refund_step(call_id="call_2", item_id="fc_2"))
    assert asked == 1  # the SDK asks again
    record = ledger.get(second)
    assert record is not None
    assert record.status is Status.PAUSED  # waits for its own decision
    first = ledger.get(ASKED)
    assert first is not None
    assert first.status is Status.COMPLETED  # its approval was spent by its own run
    assert lines(files["effects"]) == ["refund A1"]
