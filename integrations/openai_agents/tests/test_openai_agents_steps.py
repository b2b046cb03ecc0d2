"""Steps and chosen keys through the Agents SDK, across approvals, real SIGKILLs and new processes.

Each run happens in a child process (``replaysafe.testing.run_in_child``) on a SQLite ledger file.
The SDK's own persistence is its ``RunState``: a run stopped for approval is serialized, and a new
process approves and resumes it. Side effects are lines appended to a file, counted by the test
process. Each scenario has an unprotected control.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest
from agents import Agent, FunctionTool, Runner, RunState, function_tool
from agents.items import ToolCallOutputItem
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from replaysafe import ApprovalRequiredError, CallKey, SqliteLedger, approvals, replay_safe
from replaysafe.testing import kill_point, run_in_child
from replaysafe_openai_agents import context_field, replay_safe_agent

from agents_scenario import RUN_CONFIG, THREAD


def append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")


def lines(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines() if Path(path).exists() else []


def build(
    effects: str, ledger: SqliteLedger, variant: str, steps: list[ModelStep], *, key: str = "call", approval: bool
) -> Agent[Any]:
    """``refund_order``: a ``charge`` step, then a ``notify`` step; ``approval``: it waits for a person first."""

    def charge(order_id: str) -> str:
        append(effects, f"charge {order_id}")
        return f"ch_{order_id}"

    def notify(order_id: str) -> str:
        append(effects, f"notify {order_id}")
        return "notified"

    if variant != "unprotected":
        charge, notify = replay_safe(charge), replay_safe(notify)

    def refund_order(order_id: str) -> str:
        receipt = charge(order_id)
        kill_point("between-steps")
        return f"{receipt} {notify(order_id)}"

    function: Any = refund_order
    if variant == "decorated":
        function = replay_safe(key=key)(refund_order)  # type: ignore[call-overload]
    tool = function_tool(function, name_override="refund_order", needs_approval=approval)
    assert isinstance(tool, FunctionTool)
    agent: Agent[Any] = Agent(name="support", model=ScriptedModel(steps), tools=[tool])
    if variant == "unprotected":
        return agent
    return replay_safe_agent(agent, ledger, thread_id=context_field("thread_id"))


def refund_step(call_id: str, item_id: str) -> ModelStep:
    call = function_call("refund_order", {"order_id": "A1"}, call_id=call_id, item_id=item_id)
    return ModelStep(output=[call], response_id=f"resp_{item_id}")


DONE = ModelStep(output=[assistant_message("done", item_id="msg_done")], response_id="resp_done")


def outputs(items: list[Any]) -> dict[str, Any]:
    return {
        str(cast(dict[str, Any], item.raw_item)["call_id"]): item.output
        for item in items
        if isinstance(item, ToolCallOutputItem)
    }


async def start(state: str, ledger_path: str, effects: str, variant: str) -> int:
    """Run until the refund waits for approval; store the RunState."""
    with SqliteLedger(ledger_path) as ledger:
        agent = build(effects, ledger, variant, [refund_step("call_1", "fc_1")], approval=True)
        result = await Runner.run(agent, "Refund order A1", context={"thread_id": THREAD}, run_config=RUN_CONFIG)
    await asyncio.to_thread(Path(state).write_text, json.dumps(result.to_state().to_json()), encoding="utf-8")
    return len(result.interruptions)


async def approve(state: str, ledger_path: str, effects: str, variant: str) -> dict[str, Any]:
    """Load the stored RunState in this process, approve the refund, run to the end; or report that the
    refund asks for a new decision (it ran on an approval and may have taken effect)."""
    with SqliteLedger(ledger_path) as ledger:
        agent = build(effects, ledger, variant, [DONE], approval=True)
        stored = await asyncio.to_thread(Path(state).read_text, encoding="utf-8")
        run_state = await RunState.from_json(agent, json.loads(stored))
        for interruption in run_state.get_interruptions():
            run_state.approve(interruption)
        try:
            result = await Runner.run(agent, run_state, run_config=RUN_CONFIG)
        except ApprovalRequiredError as asked:
            return {"asked": list(asked.key or ()), "may_have_run": asked.may_have_run}
    return {"output": result.final_output, "outputs": outputs(result.new_items)}


async def ask(ledger_path: str, effects: str, key: str, call_id: str, item_id: str) -> dict[str, Any]:
    """A new run in the thread: the model asks for the refund under the given ids."""
    with SqliteLedger(ledger_path) as ledger:
        agent = build(effects, ledger, "decorated", [refund_step(call_id, item_id), DONE], key=key, approval=False)
        result = await Runner.run(agent, "Refund order A1", context={"thread_id": THREAD}, run_config=RUN_CONFIG)
    return {"output": result.final_output, "outputs": outputs(result.new_items)}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    return {
        "state": str(tmp_path / "state.json"),
        "ledger_path": str(tmp_path / "ledger.db"),
        "effects": str(tmp_path / "effects.log"),
    }


@pytest.mark.parametrize(("variant", "charges"), [("wrapped", 1), ("decorated", 1), ("unprotected", 2)])
def test_an_approved_tool_killed_between_two_steps_resumes_with_the_first_step_replayed(
    variant: str, charges: int, files: dict[str, str]
) -> None:
    """Approval pause, then a process approving it is SIGKILLed after the charge step; a new one approves again.

    The refund ran on its approval and may have taken effect: the resume asks for a new decision (README:
    Approvals). Decided again with replaysafe, the stored RunState is resumed: the charge step replays, notify
    runs once.
    """
    assert run_in_child(start, *files.values(), variant).value == 1
    assert lines(files["effects"]) == []
    crashed = run_in_child(approve, *files.values(), variant, kill_at="between-steps")
    assert crashed.killed
    assert lines(files["effects"]) == ["charge A1"]
    if variant != "unprotected":
        asked = run_in_child(approve, *files.values(), variant)
        assert asked.value == {"asked": [THREAD, "fc_1", "call_1"], "may_have_run": True}
        with SqliteLedger(files["ledger_path"]) as ledger:
            approvals.approve(CallKey(THREAD, "fc_1", "call_1"), by="ana@example.com", ledger=ledger)
    resumed = run_in_child(approve, *files.values(), variant)
    assert resumed.value == {"output": "done", "outputs": {"call_1": "ch_A1 notified"}}
    assert lines(files["effects"]) == ["charge A1"] * charges + ["notify A1"]


@pytest.mark.parametrize(("key", "charges"), [("args", 1), ("call", 2)])
def test_key_args_replays_a_call_the_model_planned_again_under_new_ids(
    key: str, charges: int, files: dict[str, str]
) -> None:
    """A run killed after the charge step saved nothing; the next run's model asks again under new ids.

    Under ``key="args"`` the re-planned refund in the same thread replays its charge; under the
    default key it is a new call and charges again.
    """
    ledger_path, effects = files["ledger_path"], files["effects"]
    crashed = run_in_child(ask, ledger_path, effects, key, "call_1", "fc_1", kill_at="between-steps")
    assert crashed.killed
    again = run_in_child(ask, ledger_path, effects, key, "call_9", "fc_9")
    assert again.value == {"output": "done", "outputs": {"call_9": "ch_A1 notified"}}
    assert lines(effects) == ["charge A1"] * charges + ["notify A1"]
