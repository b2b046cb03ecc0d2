"""Steps, pauses and chosen keys through Pydantic AI, across real SIGKILLs and new processes.

Each run happens in a child process (``replaysafe.testing.run_in_child``) on a SQLite ledger file;
the message history is persisted to a file as an app would, and a new child resumes from it with
Pydantic AI's own API (``message_history=``, ``deferred_tool_results=``). Side effects are lines
appended to a file, counted by the test process. Each scenario has an unprotected control.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults

from replaysafe import SqliteLedger, Status, replay_safe
from replaysafe.testing import kill_point, run_in_child
from replaysafe_pydantic_ai import ReplaySafe

CONVERSATION = "conversation-1"


def append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")


def lines(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines() if Path(path).exists() else []


def model(call_id: str, response_prefix: str) -> FunctionModel:
    """One refund call for a prompt (ids from the arguments), text once the tool answered."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        number = sum(isinstance(message, ModelResponse) for message in messages) + 1
        last = messages[-1]
        if isinstance(last, ModelRequest) and any(isinstance(part, ToolReturnPart) for part in last.parts):
            return ModelResponse(parts=[TextPart("done")], provider_response_id=f"{response_prefix}{number}")
        call = ToolCallPart("refund_order", {"order_id": "A1"}, tool_call_id=call_id)
        return ModelResponse(parts=[call], provider_response_id=f"{response_prefix}{number}")

    return FunctionModel(respond)


def build(effects: str, ledger: SqliteLedger, variant: str, *, pause: bool, key: str, call_id: str) -> Agent[None, Any]:
    """``refund_order``: a ``charge`` step, then (optionally) an approval pause, then a ``notify`` step."""

    def charge(order_id: str) -> str:
        append(effects, f"charge {order_id}")
        return f"ch_{order_id}"

    def notify(order_id: str) -> str:
        append(effects, f"notify {order_id}")
        return "notified"

    if variant != "unprotected":
        charge, notify = replay_safe(charge), replay_safe(notify)

    def refund_order(ctx: RunContext[None], order_id: str) -> str:
        receipt = charge(order_id)
        kill_point("between-steps")
        if pause and not ctx.tool_call_approved:
            raise ApprovalRequired()
        return f"{receipt} {notify(order_id)}"

    function: Any = refund_order
    if variant == "decorated":
        function = replay_safe(key=key, exclude_args=("ctx",))(refund_order)  # type: ignore[call-overload]
    capabilities = [] if variant == "unprotected" else [ReplaySafe(ledger)]
    return Agent(
        model(call_id, f"resp_{call_id}_"),
        tools=[Tool(function, name="refund_order")],
        capabilities=capabilities,
        output_type=[str, DeferredToolRequests],
    )


def returns(messages: list[ModelMessage]) -> dict[str, Any]:
    return {
        part.tool_call_id: part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }


async def run_agent(
    history: str,
    ledger_path: str,
    effects: str,
    mode: str,
    variant: str,
    *,
    pause: bool = False,
    key: str = "call",
    call_id: str = "call_1",
    save_history: bool = True,
) -> dict[str, Any]:
    """``mode``: ``"ask"`` (a new prompt, the history saved once the model asked for the tool),
    ``"continue"`` (run the saved history again) or ``"approve"`` (resume the saved run, approved)."""
    with SqliteLedger(ledger_path) as ledger:
        agent = build(effects, ledger, variant, pause=pause, key=key, call_id=call_id)
        if mode == "ask":
            async with agent.iter("Refund order A1", conversation_id=CONVERSATION) as run:
                async for node in run:
                    if Agent.is_call_tools_node(node) and save_history:
                        data = ModelMessagesTypeAdapter.dump_json(run.all_messages())
                        await asyncio.to_thread(Path(history).write_bytes, data)
            assert run.result is not None
            result = run.result
        else:
            messages = ModelMessagesTypeAdapter.validate_json(await asyncio.to_thread(Path(history).read_bytes))
            approved = DeferredToolResults(approvals={call_id: True}) if mode == "approve" else None
            result = await agent.run(None, message_history=messages, deferred_tool_results=approved)
        if isinstance(result.output, DeferredToolRequests):
            data = ModelMessagesTypeAdapter.dump_json(result.all_messages())
            await asyncio.to_thread(Path(history).write_bytes, data)
            return {"paused": [call.tool_call_id for call in result.output.approvals]}
        return {"output": result.output, "returns": returns(result.new_messages())}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    return {
        "history": str(tmp_path / "history.json"),
        "ledger_path": str(tmp_path / "ledger.db"),
        "effects": str(tmp_path / "effects.log"),
    }


VARIANTS = [("capability", 1), ("decorated", 1), ("unprotected", 2)]


def test_a_decorated_tool_killed_between_two_steps_resumes_with_the_first_step_replayed(files: dict[str, str]) -> None:
    """SIGKILL after the charge step of a ``@replay_safe`` tool; the saved history run again in a new process
    charges once. (An undecorated tool, and the control without the capability: the conformance kit's
    ``steps`` scenario, tests/test_pydantic_ai_conformance.py.)"""
    crashed = run_in_child(run_agent, *files.values(), "ask", "decorated", kill_at="between-steps")
    assert crashed.killed
    assert lines(files["effects"]) == ["charge A1"]
    resumed = run_in_child(run_agent, *files.values(), "continue", "decorated")
    assert resumed.value == {"output": "done", "returns": {"call_1": "ch_A1 notified"}}
    assert lines(files["effects"]) == ["charge A1", "notify A1"]


@pytest.mark.parametrize(("variant", "charges"), VARIANTS)
def test_a_step_then_approval_required_then_approval_charges_once(
    variant: str, charges: int, files: dict[str, str]
) -> None:
    """charge, then ApprovalRequired; approved in a new process, the tool runs again and its charge replays."""
    paused = run_in_child(run_agent, *files.values(), "ask", variant, pause=True)
    assert paused.value == {"paused": ["call_1"]}
    assert lines(files["effects"]) == ["charge A1"]
    if variant != "unprotected":
        with SqliteLedger(files["ledger_path"]) as ledger:
            statuses = {record.tool_name: record.status for record in ledger.records()}
        assert statuses["charge"] is Status.COMPLETED
        assert Status.PAUSED in statuses.values()
    approved = run_in_child(run_agent, *files.values(), "approve", variant, pause=True)
    assert approved.value == {"output": "done", "returns": {"call_1": "ch_A1 notified"}}
    assert lines(files["effects"]) == ["charge A1"] * charges + ["notify A1"]


@pytest.mark.parametrize(("key", "charges"), [("args", 1), ("call", 2)])
def test_key_args_replays_a_call_the_model_planned_again_under_new_ids(
    key: str, charges: int, files: dict[str, str]
) -> None:
    """Killed before any history was saved: the prompt runs again, the model answers with new ids.

    Under ``key="args"`` the re-planned refund in the same conversation replays its charge;
    under the default key it is a new call and charges again.
    """
    crashed = run_in_child(
        run_agent, *files.values(), "ask", "decorated", key=key, save_history=False, kill_at="between-steps"
    )
    assert crashed.killed
    again = run_in_child(run_agent, *files.values(), "ask", "decorated", key=key, call_id="call_9")
    assert again.value == {"output": "done", "returns": {"call_9": "ch_A1 notified"}}
    assert lines(files["effects"]) == ["charge A1"] * charges + ["notify A1"]
