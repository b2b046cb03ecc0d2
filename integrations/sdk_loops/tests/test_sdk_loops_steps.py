"""Steps and chosen keys through ``run_tool_calls`` for tools decorated with ``@replay_safe``, across real
SIGKILLs and new processes.

The conformance kit (test_sdk_loops_conformance.py) proves the ``steps`` and ``replan_args`` scenarios on
every SDK style with tools its loops decorate themselves (so that a tool's error is answered to the model
outside the protection, docs/adapters.md §7); the helper's own protection of plain tools is proven across a
SIGKILL in test_sdk_loops.py. Here a tool protects itself (``@replay_safe``, the helper supplying the ids)
with steps and a chosen key, one SDK style each, sync and async (the ids come from the SDK the same way for
both variants).

Each scenario runs one step of a hand-written agent loop in a child process
(``replaysafe.testing.run_in_child``): it loads the conversation persisted as a JSON file, asks the
model for a response when none is pending (built by hand with the SDK's own pydantic model, no
network), runs the response's tool calls with a SQLite ledger file and saves the conversation.
Another child resumes from the file. The tool ``refund_order`` makes two steps, ``charge`` then
``notify``, each appending a line to an effects file that the test process counts. Each scenario
has a control that repeats the side effect.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import pytest
from anthropic.types import Message

from replaysafe import CallKey, SqliteLedger, Status, replay_safe
from replaysafe.testing import kill_point, run_in_child
from replaysafe_sdk_loops import anthropic as anthropic_loop
from replaysafe_sdk_loops import openai as openai_loop

from loops_scenario import Sdk, load

THREAD = "steps-thread"
#: How ``refund_order`` is protected: by the helper, by ``@replay_safe`` on the tool (the helper
#: supplying the ids), or by the helper with its two steps left undecorated (the control).
Variant = Literal["helper", "decorated", "plain-steps"]


def ids(sdk: Sdk, turn: int) -> tuple[str, str]:
    """The message id and the tool call id the model answers with at ``turn``: new ones each time it is asked."""
    message_id = {"chat": f"chatcmpl-{turn}", "responses": f"resp_{turn}", "anthropic": f"msg_{turn}"}[sdk]
    return message_id, f"toolu_{turn}" if sdk == "anthropic" else f"call_{turn}"


def ask_model(sdk: Sdk, turn: int) -> str:
    """The model's response asking for ``refund_order(order_id="A1")``, as the JSON its API sends."""
    message_id, call_id = ids(sdk, turn)
    arguments = {"order_id": "A1"}
    body: dict[str, Any]
    if sdk == "chat":
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": "refund_order", "arguments": json.dumps(arguments)},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        choice = {"index": 0, "finish_reason": "tool_calls", "message": message}
        body = {"id": message_id, "object": "chat.completion", "created": 1, "model": "m", "choices": [choice]}
    elif sdk == "responses":
        item = {
            "type": "function_call",
            "id": f"fc_{turn}",
            "call_id": call_id,
            "name": "refund_order",
            "arguments": json.dumps(arguments),
        }
        body = {
            "id": message_id,
            "object": "response",
            "created_at": 1,
            "model": "m",
            "output": [item],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
    else:
        body = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": "claude",
            "content": [{"type": "tool_use", "id": call_id, "name": "refund_order", "input": arguments}],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    return load(sdk, json.dumps(body)).model_dump_json()  # validated by the SDK's own model


def append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")


def refund_tool(effects: str, variant: Variant, flavour: str, key: Literal["call", "args"]) -> Callable[..., Any]:
    """``refund_order``: a ``charge`` step, then a ``notify`` step; sync, or async with async steps."""

    def charge(order_id: str) -> str:
        append(effects, f"charge {order_id} {os.getpid()}")
        return f"ch_{os.getpid()}"  # a receipt only this process makes: a replay returns the first one

    def notify(order_id: str) -> str:
        append(effects, f"notify {order_id}")
        return "notified"

    async def charge_async(order_id: str) -> str:
        return charge(order_id)

    async def notify_async(order_id: str) -> str:
        return notify(order_id)

    steps: tuple[Callable[[str], Any], ...] = (charge, notify) if flavour == "sync" else (charge_async, notify_async)
    if variant != "plain-steps":
        steps = tuple(replay_safe(name=step.__name__.removesuffix("_async"))(step) for step in steps)
    charge_step, notify_step = steps

    def refund_order(order_id: str) -> str:
        receipt = charge_step(order_id)
        kill_point("between-steps")
        return f"{receipt} {notify_step(order_id)}"

    async def refund_order_async(order_id: str) -> str:
        receipt = await charge_step(order_id)
        kill_point("between-steps")
        return f"{receipt} {await notify_step(order_id)}"

    tool: Callable[..., Any] = refund_order if flavour == "sync" else refund_order_async
    if variant == "decorated":
        tool = replay_safe(name="refund_order", key=key)(tool)
    return tool


def outputs(sdk: Sdk, results: list[Any]) -> dict[str, str]:
    """The results the helper returned in the SDK's shape, as ``{tool call id: text}``."""
    if sdk == "chat":
        return {result["tool_call_id"]: result["content"] for result in results}
    if sdk == "responses":
        return {result["call_id"]: result["output"] for result in results}
    return {block["tool_use_id"]: block["content"] for result in results for block in result["content"]}


def agent_step(
    sdk: Sdk,
    history: str,
    ledger_path: str,
    effects: str,
    turn: int,
    *,
    variant: Variant = "helper",
    flavour: str = "sync",
    key: Literal["call", "args"] = "call",
    save_response: bool = True,
) -> dict[str, str]:
    """Process the pending response, or ask the model (it answers with ``turn``'s ids); run its calls; save.

    With ``save_response`` the response is saved before its tools run, as the README asks; without
    it the conversation is saved once the turn is done, so a crash before then loses the response.
    """
    path = Path(history)
    conversation: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    if not conversation or conversation[-1]["results"] is not None:
        conversation.append({"response": ask_model(sdk, turn), "results": None})
        if save_response:
            path.write_text(json.dumps(conversation))
    response = load(sdk, conversation[-1]["response"])
    tools = {"refund_order": refund_tool(effects, variant, flavour, key)}
    options = {} if variant == "decorated" else {"key": key}  # the helper's @replay_safe options
    helpers: ModuleType = anthropic_loop if isinstance(response, Message) else openai_loop
    with SqliteLedger(ledger_path) as ledger:
        if flavour == "async":
            coroutine = helpers.arun_tool_calls(response, tools, thread_id=THREAD, ledger=ledger, **options)
            results: list[Any] = asyncio.run(coroutine)
        else:
            results = helpers.run_tool_calls(response, tools, thread_id=THREAD, ledger=ledger, **options)
    kill_point("after-tools")
    conversation[-1]["results"] = results
    path.write_text(json.dumps(conversation))
    return outputs(sdk, results)


def effect_lines(path: Path) -> list[str]:
    """The side effects so far, without the pid of the process that made each charge."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [" ".join(line.split()[:2]) for line in lines]


def charge_pids(path: Path) -> list[str]:
    return [line.split()[2] for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("charge")]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    return {
        "history": str(tmp_path / "conversation.json"),
        "ledger_path": str(tmp_path / "ledger.db"),
        "effects": str(tmp_path / "effects.log"),
    }


#: The helper-protected variants (and their control, undecorated steps) are the kit's ``steps`` scenario.
STEP_CASES = [("responses", "decorated", "sync"), ("chat", "decorated", "async")]


@pytest.mark.parametrize(("sdk", "variant", "flavour"), STEP_CASES)
def test_a_tool_killed_between_two_steps_resumes_from_the_saved_response_with_the_first_step_replayed(
    sdk: Sdk, variant: Variant, flavour: str, files: dict[str, str]
) -> None:
    """SIGKILL after the charge step; a new process processes the saved response: charge replays, notify runs once.

    With undecorated steps (the control) the tool's call reruns whole and charges twice.
    """
    options: dict[str, Any] = {"variant": variant, "flavour": flavour}
    crashed = run_in_child(agent_step, sdk, *files.values(), 1, kill_at="between-steps", **options)
    assert crashed.killed
    effects = Path(files["effects"])
    assert effect_lines(effects) == ["charge A1"]

    resumed = run_in_child(agent_step, sdk, *files.values(), 2, **options)  # the model is not asked again
    charges = 2 if variant == "plain-steps" else 1
    assert effect_lines(effects) == ["charge A1"] * charges + ["notify A1"]
    pids = charge_pids(effects)
    message_id, call_id = ids(sdk, 1)
    # A replayed charge returns the receipt the killed process made; a rerun one makes a new one.
    assert resumed.value == {call_id: f"ch_{pids[-1]} notified"}
    assert len(json.loads(Path(files["history"]).read_text())) == 1

    with SqliteLedger(files["ledger_path"]) as ledger:
        parent = ledger.get(CallKey(THREAD, message_id, call_id))
        steps = {record.tool_name: record for record in ledger.records() if record.key != parent.key} if parent else {}
    assert parent is not None
    assert (parent.status, parent.attempt) == (Status.COMPLETED, 2)
    if variant != "plain-steps":
        assert {name: (r.status, r.attempt) for name, r in steps.items()} == {
            "charge": (Status.COMPLETED, 1),
            "notify": (Status.COMPLETED, 1),
        }


@pytest.mark.parametrize(
    ("variant", "key", "runs"),
    [("decorated", "args", 1), ("decorated", "call", 2)],
    ids=["decorated-args", "decorated-default-key"],
)
@pytest.mark.parametrize("sdk", ["anthropic"])  # helper-args, on every style: the kit's replan_args
def test_key_args_replays_a_call_the_model_planned_again_under_new_ids(
    sdk: Sdk, variant: Variant, key: Literal["call", "args"], runs: int, files: dict[str, str]
) -> None:
    """The process dies after the tool ran, before the conversation was saved; the model is asked again.

    It answers with a new message id and a new tool call id. Under ``key="args"`` the re-planned
    refund (same thread, same arguments) replays what the first one returned; under the default
    key it is a new call and charges again.
    """
    options: dict[str, Any] = {"variant": variant, "key": key, "save_response": False}
    crashed = run_in_child(agent_step, sdk, *files.values(), 1, kill_at="after-tools", **options)
    assert crashed.killed
    assert not Path(files["history"]).exists()  # the crash saved nothing
    effects = Path(files["effects"])
    assert effect_lines(effects) == ["charge A1", "notify A1"]

    again = run_in_child(agent_step, sdk, *files.values(), 2, **options)
    _, new_call_id = ids(sdk, 2)
    assert new_call_id != ids(sdk, 1)[1]
    assert effect_lines(effects) == ["charge A1", "notify A1"] * runs
    pids = charge_pids(effects)
    assert again.value == {new_call_id: f"ch_{pids[-1]} notified"}
    with SqliteLedger(files["ledger_path"]) as ledger:
        records = list(ledger.records())
    assert len(records) == 3 * runs  # refund_order and its two steps, once per call the ledger tells apart
    assert all(record.status is Status.COMPLETED and record.attempt == 1 for record in records)
