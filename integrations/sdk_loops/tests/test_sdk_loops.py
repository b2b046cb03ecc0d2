"""run_tool_calls against real OpenAI and Anthropic SDK objects, and SIGKILLed processes."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import Message, MessageParam
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from openai.types.responses import Response, ResponseInputItemParam
from pydantic import TypeAdapter

from replaysafe import CallKey, InvalidCallIdError, SqliteLedger, Status
from replaysafe.testing._forkserver import run_python
from replaysafe_sdk_loops import anthropic as anthropic_loop
from replaysafe_sdk_loops import openai as openai_loop

from loops_scenario import (
    LEASE,
    THREAD,
    Sdk,
    Variant,
    build_tools,
    chat_completion,
    effects,
    message,
    model_output,
    response,
)

CHILD = Path(__file__).with_name("loops_child.py")
REFUND = "refund A1"
EMAIL = "email bob@example.com"
SENT = json.dumps({"sent_to": "bob@example.com"})
SDKS: list[Sdk] = ["chat", "responses", "anthropic"]
#: What each SDK's helper returns for one turn: the SDK's own result shape.
RESULTS: dict[Sdk, list[dict[str, Any]]] = {
    "chat": [
        {"role": "tool", "tool_call_id": "call_1", "content": "refunded A1"},
        {"role": "tool", "tool_call_id": "call_2", "content": SENT},
    ],
    "responses": [
        {"type": "function_call_output", "call_id": "call_1", "output": "refunded A1"},
        {"type": "function_call_output", "call_id": "call_2", "output": SENT},
    ],
    "anthropic": [
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "refunded A1"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": SENT},
            ],
        }
    ],
}
#: The message id and the call ids of turn 1.
IDS: dict[Sdk, tuple[str, str, str]] = {
    "chat": ("chatcmpl-1", "call_1", "call_2"),
    "responses": ("resp_1", "call_1", "call_2"),
    "anthropic": ("msg_1", "toolu_1", "toolu_2"),
}


def run_child(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_python([str(CHILD), *map(str, args)], timeout=300)


def run_tool_calls(sdk: Sdk, turn: int, tools: dict[str, Any], ledger: SqliteLedger) -> list[Any]:
    output = model_output(sdk, turn)
    if isinstance(output, Message):
        return list(anthropic_loop.run_tool_calls(output, tools, thread_id=THREAD, ledger=ledger, lease=LEASE))
    return list(openai_loop.run_tool_calls(output, tools, thread_id=THREAD, ledger=ledger, lease=LEASE))


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("variant", ["helper", "decorated"])
@pytest.mark.parametrize("sdk", SDKS)
def test_sigkill_in_second_call_then_reprocessing_runs_the_first_call_once(
    sdk: Sdk, variant: Variant, flavour: str, tmp_path: Path, ledger_path: Path, effects_path: Path
) -> None:
    """A process killed inside send_email; a new process re-processes the persisted response."""
    persisted = tmp_path / "response.json"
    persisted.write_text(model_output(sdk, 1).model_dump_json())

    crashed = run_child(sdk, "crash", persisted, ledger_path, effects_path, variant, flavour)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert effects(effects_path) == [REFUND, EMAIL]

    resumed = run_child(sdk, "run", persisted, ledger_path, effects_path, variant, flavour)
    assert resumed.returncode == 0, resumed.stderr
    assert effects(effects_path) == [REFUND, EMAIL, EMAIL]  # the email ran to completion once more
    assert json.loads(resumed.stdout) == RESULTS[sdk]

    message_id, first, second = IDS[sdk]
    with SqliteLedger(ledger_path) as ledger:
        records = {record.key: record for record in ledger.records()}
    assert set(records) == {CallKey(THREAD, message_id, first), CallKey(THREAD, message_id, second)}
    assert all(record.status is Status.COMPLETED for record in records.values())
    assert records[CallKey(THREAD, message_id, second)].attempt == 2
    prefix = "decorated_" if variant == "decorated" else ""
    assert records[CallKey(THREAD, message_id, first)].tool_name == f"{prefix}refund_order"


@pytest.mark.parametrize("sdk", SDKS)
def test_reprocessing_a_response_returns_the_recorded_results_without_running(
    sdk: Sdk, ledger: SqliteLedger, effects_path: Path
) -> None:
    """The same response processed twice runs each tool once and gives the same results twice."""
    tools = build_tools(effects_path)
    assert run_tool_calls(sdk, 1, tools, ledger) == RESULTS[sdk]
    assert run_tool_calls(sdk, 1, tools, ledger) == RESULTS[sdk]
    assert effects(effects_path) == [REFUND, EMAIL]


@pytest.mark.parametrize("sdk", SDKS)
def test_a_new_response_with_the_same_call_ids_runs_the_tools(
    sdk: Sdk, ledger: SqliteLedger, effects_path: Path
) -> None:
    """A new turn (new response id) reusing the call ids is a new call: its tools run."""
    tools = build_tools(effects_path)
    run_tool_calls(sdk, 1, tools, ledger)
    run_tool_calls(sdk, 2, tools, ledger)
    assert effects(effects_path) == [REFUND, EMAIL, REFUND, EMAIL]
    assert len({record.key.message_id for record in ledger.records()}) == 2


@pytest.mark.parametrize("sdk", SDKS)
async def test_arun_tool_calls_awaits_async_tools_and_replays_them(
    sdk: Sdk, ledger: SqliteLedger, effects_path: Path
) -> None:
    """The async helper runs an async and a sync tool, then replays both."""
    tools = build_tools(effects_path, asynchronous=True)
    output = model_output(sdk, 1)
    for _ in range(2):
        if isinstance(output, Message):
            results: list[Any] = await anthropic_loop.arun_tool_calls(output, tools, thread_id=THREAD, ledger=ledger)
        else:
            results = await openai_loop.arun_tool_calls(output, tools, thread_id=THREAD, ledger=ledger)
        assert results == RESULTS[sdk]
    assert effects(effects_path) == [REFUND, EMAIL]


def test_the_results_validate_as_the_sdks_request_params(ledger: SqliteLedger, effects_path: Path) -> None:
    """Each helper's results are valid input messages of its SDK's next request."""
    tools = build_tools(effects_path)
    TypeAdapter(list[ChatCompletionMessageParam]).validate_python(run_tool_calls("chat", 1, tools, ledger))
    TypeAdapter(list[ResponseInputItemParam]).validate_python(run_tool_calls("responses", 1, tools, ledger))
    TypeAdapter(list[MessageParam]).validate_python(run_tool_calls("anthropic", 1, tools, ledger))


def test_an_unknown_tool_raises_naming_the_call_before_anything_runs(ledger: SqliteLedger, effects_path: Path) -> None:
    """A call to a tool missing from tools= names the call and the known tools."""
    tools = build_tools(effects_path)
    del tools["refund_order"]
    with pytest.raises(LookupError, match=r"'refund_order'.*msg_1.*toolu_1.*tools: send_email"):
        run_tool_calls("anthropic", 1, tools, ledger)
    assert effects(effects_path) == []


def test_an_async_tool_in_the_sync_helper_says_to_use_the_async_one(ledger: SqliteLedger, effects_path: Path) -> None:
    """run_tool_calls refuses an async tool and names arun_tool_calls."""
    with pytest.raises(TypeError, match="arun_tool_calls"):
        run_tool_calls("chat", 1, build_tools(effects_path, asynchronous=True), ledger)
    assert effects(effects_path) == []


def output_with_call_ids(sdk: Sdk, first: str, second: str) -> ChatCompletion | Response | Message:
    """Turn 1's model output, its two calls under the ids given."""
    if sdk == "chat":
        data = chat_completion(1)
        calls = data["choices"][0]["message"]["tool_calls"]
        calls[0]["id"], calls[1]["id"] = first, second
        return ChatCompletion.model_validate(data)
    if sdk == "responses":
        data = response(1)
        data["output"][0]["call_id"], data["output"][1]["call_id"] = first, second
        return Response.model_validate(data)
    data = message(1)
    data["content"][1]["id"], data["content"][2]["id"] = first, second
    return Message.model_validate(data)


def run_output(output: ChatCompletion | Response | Message, tools: dict[str, Any], ledger: SqliteLedger) -> list[Any]:
    if isinstance(output, Message):
        return list(anthropic_loop.run_tool_calls(output, tools, thread_id=THREAD, ledger=ledger, lease=LEASE))
    return list(openai_loop.run_tool_calls(output, tools, thread_id=THREAD, ledger=ledger, lease=LEASE))


@pytest.mark.parametrize("sdk", SDKS)
def test_call_ids_holding_a_gt_or_a_hash_are_ordinary_ids(sdk: Sdk, ledger: SqliteLedger, effects_path: Path) -> None:
    """A '>' or a '#' in a call id is an ordinary character: each call runs once and replays its own record."""
    tools = build_tools(effects_path)
    output = output_with_call_ids(sdk, "call_1>refund", "call#2")
    first = run_output(output, tools, ledger)
    assert run_output(output, tools, ledger) == first
    assert effects(effects_path) == [REFUND, EMAIL]
    assert sorted(record.key.tool_call_id for record in ledger.records()) == ["call#2", "call_1>refund"]


@pytest.mark.parametrize("sdk", SDKS)
def test_a_call_id_of_a_steps_form_is_refused_before_anything_runs(
    sdk: Sdk, ledger: SqliteLedger, effects_path: Path
) -> None:
    """A call id shaped like a step's key (``<id>><tool>#<n>``) could be handed a step's result: refused."""
    output = output_with_call_ids(sdk, "call_1>refund_order#1", "call_2")
    with pytest.raises(InvalidCallIdError, match=r"tool_call_id 'call_1>refund_order#1' has the reserved form"):
        run_output(output, build_tools(effects_path), ledger)
    assert effects(effects_path) == []
    assert list(ledger.records()) == []
