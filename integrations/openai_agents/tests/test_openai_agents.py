"""The Agents SDK adapter against real SDK runs, RunState resumes and SIGKILLed processes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx2
import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    RunResult,
    TResponseInputItem,
    function_tool,
)
from agents.testing import ModelStep, ScriptedModel, function_call
from openai import AsyncOpenAI
from openai.types.responses import EasyInputMessageParam

from replaysafe import (
    CallInDoubtError,
    CallKey,
    MissingCallIdError,
    ReplayMismatchError,
    SqliteLedger,
    Status,
    UnprotectedCallWarning,
    approvals,
    replay_safe,
)
from replaysafe.testing._forkserver import run_python
from replaysafe_openai_agents import context_field, group_id, replay_safe_agent

from agents_scenario import RUN_CONFIG, THREAD, Variant, _append, build_agent, calls_step, done_step, effects

CHILD = Path(__file__).with_name("agents_child.py")
REFUND = "refund A1"
EMAIL = "email bob@example.com"
RESUMED = {"output": "done", "outputs": {"call_1": "refunded A1", "call_2": "sent to bob@example.com"}}
KEYS = {CallKey(THREAD, "fc_1_1", "call_1"), CallKey(THREAD, "fc_1_2", "call_2")}


def run_child(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_python([str(CHILD), *map(str, args)], timeout=300)


def next_turn(result: RunResult, text: str) -> list[TResponseInputItem]:
    """The input of a new turn: the run's items and a new user message."""
    return [*result.to_input_list(), EasyInputMessageParam(role="user", content=text)]


def start(state: Path, ledger_path: Path, effects_path: Path, variant: Variant) -> None:
    started = run_child("start", state, ledger_path, effects_path, variant)
    assert started.returncode == 0, started.stderr
    assert effects(effects_path) == []  # both calls wait for approval


@pytest.mark.parametrize(("variant", "runs"), [("wrapped", 1), ("decorated", 1), ("unprotected", 2)])
def test_resuming_the_same_run_state_twice_runs_each_approved_tool_once(
    variant: Variant, runs: int, tmp_path: Path, ledger_path: Path, effects_path: Path
) -> None:
    """A RunState serialized at an approval interruption is resumed in two new processes."""
    state = tmp_path / "state.json"
    start(state, ledger_path, effects_path, variant)
    for _ in range(2):
        resumed = run_child("resume", state, ledger_path, effects_path, variant)
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout) == RESUMED
    assert effects(effects_path) == [REFUND, EMAIL] * runs

    with SqliteLedger(ledger_path) as ledger:
        records = {record.key: record for record in ledger.records()}
    assert set(records) == (set() if variant == "unprotected" else KEYS)


@pytest.mark.parametrize("variant", ["wrapped", "decorated"])
def test_sigkill_in_second_tool_then_resume_from_run_state_runs_the_first_tool_once(
    variant: Variant, tmp_path: Path, ledger_path: Path, effects_path: Path
) -> None:
    """A process resuming the RunState is killed inside send_email; a new process resumes it again.

    The refund replays. The email ran on its approval and may have taken effect: the resume asks for a new
    decision instead of running it (README: Approvals); approved again with replaysafe, it runs once more.
    """
    state = tmp_path / "state.json"
    start(state, ledger_path, effects_path, variant)

    crashed = run_child("resume-and-crash", state, ledger_path, effects_path, variant)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert effects(effects_path) == [REFUND, EMAIL]

    asked = run_child("resume", state, ledger_path, effects_path, variant)
    assert asked.returncode == 1
    assert "ApprovalRequiredError" in asked.stderr
    assert "may have happened" in asked.stderr
    assert effects(effects_path) == [REFUND, EMAIL]  # neither ran again

    email = CallKey(THREAD, "fc_1_2", "call_2")
    with SqliteLedger(ledger_path) as ledger:
        approvals.approve(email, by="ana@example.com", ledger=ledger)
    resumed = run_child("resume", state, ledger_path, effects_path, variant)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == RESUMED
    assert effects(effects_path) == [REFUND, EMAIL, EMAIL]  # the email ran to completion once more

    with SqliteLedger(ledger_path) as ledger:
        records = {record.key: record for record in ledger.records()}
    assert set(records) == KEYS
    assert all(record.status is Status.COMPLETED for record in records.values())
    prefix = "decorated_" if variant == "decorated" else ""
    assert records[CallKey(THREAD, "fc_1_1", "call_1")].tool_name == f"{prefix}refund_order"


def test_sigkill_without_the_adapter_runs_the_first_tool_twice(
    tmp_path: Path, ledger_path: Path, effects_path: Path
) -> None:
    """The control: the same crash and RunState resume without replaysafe repeats the refund."""
    state = tmp_path / "state.json"
    start(state, ledger_path, effects_path, "unprotected")
    assert run_child("resume-and-crash", state, ledger_path, effects_path, "unprotected").returncode == -signal.SIGKILL
    assert run_child("resume", state, ledger_path, effects_path, "unprotected").returncode == 0
    assert effects(effects_path) == [REFUND, EMAIL, REFUND, EMAIL]


async def test_a_new_turn_with_the_same_call_ids_runs_the_tools(ledger: SqliteLedger, effects_path: Path) -> None:
    """A new model response reusing call_1 and call_2 (new item ids) is a new call: its tools run."""
    agent = build_agent(ledger, effects_path, [calls_step(1), done_step(1), calls_step(2), done_step(2)])
    context = {"thread_id": THREAD}
    turn_1 = await Runner.run(agent, "Refund order A1 and tell bob", context=context, run_config=RUN_CONFIG)
    turn_2 = await Runner.run(agent, next_turn(turn_1, "Do it again"), context=context, run_config=RUN_CONFIG)
    assert turn_2.final_output == "done"
    assert effects(effects_path) == [REFUND, EMAIL, REFUND, EMAIL]
    keys = {(record.key.message_id, record.key.tool_call_id) for record in ledger.records()}
    assert keys == {("fc_1_1", "call_1"), ("fc_1_2", "call_2"), ("fc_2_1", "call_1"), ("fc_2_2", "call_2")}


@dataclasses.dataclass
class Conversation:
    thread_id: str


async def test_the_thread_id_comes_from_a_dataclass_context_or_the_run_config_group_id(
    ledger: SqliteLedger, effects_path: Path
) -> None:
    """context_field reads a dataclass context; group_id reads RunConfig.group_id."""
    agent = build_agent(ledger, effects_path, [calls_step(1), done_step(1)], "unprotected")
    from_context = replay_safe_agent(agent, ledger, thread_id=context_field("thread_id"))
    await Runner.run(from_context, "go", context=Conversation("thread-from-context"), run_config=RUN_CONFIG)

    agent = build_agent(ledger, effects_path, [calls_step(2), done_step(2)], "unprotected")
    from_group = replay_safe_agent(agent, ledger, thread_id=group_id)
    config = dataclasses.replace(RUN_CONFIG, group_id="thread-from-group")
    await Runner.run(from_group, "go", run_config=config)

    threads = {record.key.message_id: record.key.thread_id for record in ledger.records()}
    assert threads == {
        "fc_1_1": "thread-from-context",
        "fc_1_2": "thread-from-context",
        "fc_2_1": "thread-from-group",
        "fc_2_2": "thread-from-group",
    }


async def test_an_item_id_equal_to_the_call_id_is_not_used_as_message_id(
    ledger: SqliteLedger, effects_path: Path
) -> None:
    """A model that reuses the call id as item id gives no message id: the call is not keyed on call_1 alone."""

    def refund_order(order_id: str) -> str:
        effects_path.write_text(f"refund {order_id}\n")
        return "refunded"

    step = ModelStep(output=[function_call("refund_order", {"order_id": "A1"}, call_id="call_1")], response_id="r1")
    tool = function_tool(refund_order, failure_error_function=None)  # let the error out of the run
    agent: Agent[Any] = Agent(name="strict", model=ScriptedModel([step, done_step(1)]), tools=[tool])
    strict = replay_safe_agent(agent, ledger, thread_id=THREAD, on_missing_ids="raise")
    with pytest.raises(MissingCallIdError) as raised:  # replaysafe's own error, not the SDK's UserError
        await Runner.run(strict, "go", run_config=RUN_CONFIG)
    message = str(raised.value)
    assert "message_id=''" in message
    # The cause and the remedy, not the generic advice to use an adapter (the adapter is in use).
    assert "the call's message_id is empty" in message
    assert "output item holding the call has no id" in message
    assert 'key="args"' in message
    assert "use an adapter" not in message
    assert effects(effects_path) == []
    assert list(ledger.records()) == []


async def test_a_call_without_an_item_id_warns_with_its_cause_once(ledger: SqliteLedger, effects_path: Path) -> None:
    """Under the default on_missing_ids="warn" the tool runs unprotected, and the warning names the model's output
    as the cause and key="args" as the remedy."""

    def refund_order(order_id: str) -> str:
        effects_path.write_text(f"refund {order_id}\n")
        return "refunded"

    step = ModelStep(output=[function_call("refund_order", {"order_id": "A1"}, call_id="call_1")], response_id="r1")
    agent: Agent[Any] = Agent(
        name="plain", model=ScriptedModel([step, done_step(1)]), tools=[function_tool(refund_order)]
    )
    with pytest.warns(UnprotectedCallWarning) as warned:
        await Runner.run(replay_safe_agent(agent, ledger, thread_id=THREAD), "go", run_config=RUN_CONFIG)
    assert len(warned) == 1
    message = str(warned[0].message)
    assert "output item holding the call has no id" in message
    assert 'key="args"' in message
    assert "use an adapter" not in message
    assert effects(effects_path) == ["refund A1"]


async def test_a_tool_whose_calls_lack_ids_is_warned_about_once_not_per_call(
    ledger: SqliteLedger, effects_path: Path
) -> None:
    """The warning is said once per tool: a second call of the same tool, also without an item id, says nothing."""

    def refund_order(order_id: str) -> str:
        with effects_path.open("a") as file:
            file.write(f"refund {order_id}\n")
        return "refunded"

    steps = [
        ModelStep(output=[function_call("refund_order", {"order_id": order}, call_id=f"call_{n}")], response_id=f"r{n}")
        for n, order in enumerate(("A1", "B2"), start=1)
    ]
    agent: Agent[Any] = Agent(
        name="plain", model=ScriptedModel([*steps, done_step(2)]), tools=[function_tool(refund_order)]
    )
    with pytest.warns(UnprotectedCallWarning) as warned:
        await Runner.run(replay_safe_agent(agent, ledger, thread_id=THREAD), "go", run_config=RUN_CONFIG)
    assert len(warned) == 1
    assert effects(effects_path) == ["refund A1", "refund B2"]


def chat_completion(number: int, message: dict[str, Any]) -> dict[str, Any]:
    """A Chat Completions response body, as the API sends it."""
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    choice = {"index": 0, "finish_reason": finish, "message": {"role": "assistant", **message}}
    return {"id": f"chatcmpl-{number}", "object": "chat.completion", "created": 1, "model": "m", "choices": [choice]}


async def test_on_chat_completions_the_message_id_is_the_completion_id(
    ledger: SqliteLedger, effects_path: Path
) -> None:
    """The SDK's Chat Completions model (served offline) keys calls by provider_data['response_id']."""
    tool_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "refund_order", "arguments": '{"order_id":"A1"}'},
    }
    bodies = [
        chat_completion(1, {"content": None, "tool_calls": [tool_call]}),
        chat_completion(2, {"content": "done"}),
        chat_completion(3, {"content": None, "tool_calls": [tool_call]}),
        chat_completion(4, {"content": "done"}),
    ]

    def serve(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json=bodies.pop(0))

    refund = build_agent(ledger, effects_path, [], "unprotected").tools[0]
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(serve)) as http:
        client = AsyncOpenAI(api_key="unused", base_url="http://chat.invalid/v1", http_client=http)
        agent: Agent[Any] = Agent(name="chat", model=OpenAIChatCompletionsModel("m", client), tools=[refund])
        protected = replay_safe_agent(agent, ledger, thread_id=THREAD)
        config = RunConfig(tracing_disabled=True)
        turn_1 = await Runner.run(protected, "Refund order A1", run_config=config)
        await Runner.run(protected, next_turn(turn_1, "again"), run_config=config)

    assert effects(effects_path) == [REFUND, REFUND]
    assert {record.key for record in ledger.records()} == {
        CallKey(THREAD, "chatcmpl-1", "call_1"),
        CallKey(THREAD, "chatcmpl-3", "call_1"),
    }


def test_a_wrapped_tool_keeps_the_sdk_metadata() -> None:
    """The copy keeps the tool's name, schema, approval policy and wrapped Python function."""

    def lookup(order_id: str) -> str:
        return order_id

    tool = function_tool(lookup, needs_approval=True)
    agent: Agent[Any] = Agent(name="a", tools=[tool])
    (wrapped,) = replay_safe_agent(agent, None, thread_id=THREAD).tools
    assert wrapped is not tool
    assert (wrapped.name, wrapped.params_json_schema, wrapped.needs_approval) == (  # type: ignore[union-attr]
        tool.name,
        tool.params_json_schema,
        True,
    )
    assert wrapped.__wrapped__ is lookup  # type: ignore[union-attr]


def refund_step(turn: int, order_id: str) -> ModelStep:
    """The model asks for one refund; the same ids on every run of ``turn``."""
    call = function_call("refund_order", {"order_id": order_id}, call_id="call_1", item_id=f"fc_{turn}_1")
    return ModelStep(output=[call], response_id=f"resp_{turn}_calls")


@pytest.mark.parametrize("decorated", [False, True], ids=["wrapped", "decorated"])
async def test_replaysafe_errors_end_the_run_instead_of_reaching_the_model(
    decorated: bool, ledger: SqliteLedger, effects_path: Path
) -> None:
    """Under the SDK's default failure handler, a call in doubt (in_doubt="raise") or a mismatch ends the run.

    The tool's own failure (here: passing its deadline) is still a message for the model, and it
    names neither this host nor this process.
    """
    hang = asyncio.Event()

    async def refund_order(order_id: str) -> str:
        _append(effects_path, f"refund {order_id}")
        if order_id == "A1":
            await hang.wait()
        return f"refunded {order_id}"

    function = replay_safe(timeout=0.05, in_doubt="raise")(refund_order) if decorated else refund_order
    tool = function_tool(function, name_override="refund_order")
    seen: list[str] = []

    def agent(*steps: ModelStep) -> Agent[Any]:
        plain: Agent[Any] = Agent(name="support", model=ScriptedModel(list(steps)), tools=[tool])
        return replay_safe_agent(plain, ledger, thread_id=THREAD, timeout=0.05)

    first = await Runner.run(agent(refund_step(1, "A1"), done_step(1)), "refund A1", run_config=RUN_CONFIG)
    outputs = [item.output for item in first.new_items if item.type == "tool_call_output_item"]
    seen += map(str, outputs)
    assert len(outputs) == 1
    assert "error occurred" in str(outputs[0])
    record = ledger.get(CallKey(THREAD, "fc_1_1", "call_1"))
    assert record is not None
    assert record.status is Status.IN_DOUBT
    assert all(record.owner not in text and socket.gethostname() not in text for text in seen)

    with pytest.raises(CallInDoubtError):  # replaysafe's own error ends the run, not the SDK's UserError
        await Runner.run(
            replay_safe_agent(
                Agent(name="support", model=ScriptedModel([refund_step(1, "A1")]), tools=[tool]),
                ledger,
                thread_id=THREAD,
                in_doubt="raise",
            ),
            "refund A1",
            run_config=RUN_CONFIG,
        )

    with pytest.raises(ReplayMismatchError):
        await Runner.run(agent(refund_step(1, "B2")), "refund B2 instead", run_config=RUN_CONFIG)
    assert effects(effects_path) == [REFUND]
