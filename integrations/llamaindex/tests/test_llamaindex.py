"""``replay_safe_agent`` on real LlamaIndex agents and LlamaIndex's own test LLM (no mocks of either side).

The crash cases (a SIGKILL mid-turn, resumed from a saved ``Context``) are the conformance kit's
(test_llamaindex_conformance.py); these are the cases a crash is not needed for: a run asked again on the same
thread, a new turn reusing a call id, parallel calls, sync and async tools, tools that raise, replaysafe's own
refusals, missing ids, a tool waiting for a human, a ``ReActAgent`` and an ``AgentWorkflow``.

No ``from __future__ import annotations`` here: LlamaIndex hands a tool its ``Context`` only when the
parameter's annotation is the class itself, not a string.
"""

import asyncio
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.agent.workflow import (
    AgentOutput,
    AgentWorkflow,
    FunctionAgent,
    ReActAgent,
)
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.tools import BaseTool, FunctionTool, ToolSelection
from llama_index.core.workflow import Context, HumanResponseEvent, InputRequiredEvent, JsonPickleSerializer

from replaysafe import (
    CallKey,
    Ledger,
    MemoryLedger,
    ReplayMismatchError,
    SqliteLedger,
    Status,
    UnprotectedCallWarning,
    current_call,
    replay_safe,
)
from replaysafe.testing import Script, ScriptedCall, kill_point, run_in_child
from replaysafe_llamaindex import MISSING_IDS_FIX, message_id, replay_safe_agent
from replaysafe_llamaindex.testing import scripted_llm

THREAD = "order-42"
#: LlamaIndex's serializer for a Context whose state holds the agent's memory (its JSON one leaves the memory out).
SERIALIZER = JsonPickleSerializer()


def words(text: str) -> list[str]:
    """A memory tokenizer that pickles (the default tiktoken encoder fetches its vocabulary again when unpickled)."""
    return text.split()


def memory() -> ChatMemoryBuffer:
    return ChatMemoryBuffer.from_defaults(tokenizer_fn=words)


class Effects:
    """What the tools did, in order: the side effects the tests count."""

    def __init__(self) -> None:
        self.done: list[str] = []

    def count(self, entry: str) -> int:
        return self.done.count(entry)


def tools_of(effects: Effects) -> list[BaseTool | Callable[..., Any]]:
    """A sync tool and an async one; each notes the call it ran under (``current_call()``) with its effect."""

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        effects.done.append(f"refund {order_id}")
        return f"re_{order_id} {current_call().tool_call_id}"

    async def send_email(to: str) -> str:
        """Email a customer."""
        await asyncio.sleep(0)
        effects.done.append(f"email {to}")
        return f"sent {to} {current_call().tool_call_id}"

    return [FunctionTool.from_defaults(fn=refund_order), FunctionTool.from_defaults(async_fn=send_email)]


def refund(order_id: str) -> ScriptedCall:
    return ScriptedCall("refund_order", {"order_id": order_id})


def email(to: str) -> ScriptedCall:
    return ScriptedCall("send_email", {"to": to})


async def run_agent(agent: Any, ctx: Context | None = None, prompt: str = "Refund order 42") -> Any:
    """The agent's ``AgentOutput``: its answer, and in ``tool_calls`` each call's ``ToolCallResult``."""
    handler = agent.run(user_msg=prompt, ctx=ctx or Context(agent))
    return await handler


def function_agent(script: Script, effects: Effects, *, boot: int = 0) -> FunctionAgent:
    return FunctionAgent(name="support", tools=tools_of(effects), llm=scripted_llm(script, boot=boot))


async def test_a_run_asked_again_on_the_thread_replays_every_finished_call(ledger: SqliteLedger) -> None:
    """The model plans the same calls under the same ids (as after a crash before the Context was saved): the
    refund and the email, a sync and an async tool, run once; each ran inside its own call (``current_call``)."""
    effects = Effects()
    script = Script(((refund("A1"), email("ana@example.com")), "Done."), name="again")
    outputs = []
    for _ in range(2):
        agent = replay_safe_agent(function_agent(script, effects), ledger=ledger, thread_id=THREAD)
        result = await run_agent(agent)
        outputs.append(sorted(call.tool_output.content for call in result.tool_calls))
        assert str(result) == "Done."
    assert sorted(effects.done) == ["email ana@example.com", "refund A1"]  # the calls of one turn run side by side
    assert outputs[0] == outputs[1]  # the second run's outputs are the records of the first
    _, call_ids = script.ids("openai-chat", 0)
    assert outputs[0] == [f"re_A1 {call_ids[0]}", f"sent ana@example.com {call_ids[1]}"]


async def test_without_the_adapter_the_same_runs_repeat_every_call() -> None:
    """The control of the test above: LlamaIndex itself runs a planned call again whenever it is asked to."""
    effects = Effects()
    script = Script(((refund("A1"), email("ana@example.com")), "Done."), name="again")
    for _ in range(2):
        await run_agent(function_agent(script, effects))
    assert effects.count("refund A1") == effects.count("email ana@example.com") == 2


async def test_parallel_calls_of_one_turn_are_tracked_one_by_one(ledger: SqliteLedger) -> None:
    """Three calls in one turn, two of one tool: three records, each under its own tool id, each replayed."""
    effects = Effects()
    script = Script(((refund("A1"), refund("B2"), email("ana@example.com")), "Done."), name="parallel")
    for _ in range(2):
        agent = replay_safe_agent(function_agent(script, effects), ledger=ledger, thread_id=THREAD)
        await run_agent(agent)
    assert sorted(effects.done) == ["email ana@example.com", "refund A1", "refund B2"]
    message, call_ids = script.ids("openai-chat", 0)
    for call_id in call_ids:  # keyed by the completion id (the provider's, from the response's raw) and the tool id
        assert ledger.get(CallKey(THREAD, message, call_id)) is not None


async def test_a_new_turn_reusing_a_call_id_runs() -> None:
    """A model that numbers its calls ``call_1`` every turn and gives no response id (LlamaIndex's own test LLM):
    the second turn asks for the very same refund, as the same message, and still runs (the answer's place in
    the conversation is part of its digest); asked again, the run replays both."""
    effects = Effects()

    def answer(messages: Sequence[ChatMessage], **_: Any) -> ChatMessage:
        turn = sum(1 for message in messages if message.role == MessageRole.ASSISTANT)
        if turn < 2:
            call = ToolCallBlock(tool_call_id="call_1", tool_name="refund_order", tool_kwargs={"order_id": "A1"})
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])
        return ChatMessage(role=MessageRole.ASSISTANT, content="Refunded twice.")

    ledger = MemoryLedger()
    for _ in range(2):
        agent = FunctionAgent(tools=tools_of(effects), llm=MockFunctionCallingLLM(response_generator=answer))
        await run_agent(replay_safe_agent(agent, ledger=ledger, thread_id=THREAD))
    assert effects.done == ["refund A1", "refund A1"]


def test_the_message_id_is_the_providers_or_a_digest_of_the_answer() -> None:
    call = ToolSelection(tool_id="call_1", tool_name="refund_order", tool_kwargs={"order_id": "A1"})
    response = ChatMessage(role=MessageRole.ASSISTANT, content="")
    with_raw = AgentOutput(response=response, tool_calls=[call], raw={"id": "chatcmpl-9x"}, current_agent_name="a")
    assert message_id(with_raw) == "chatcmpl-9x"
    without = AgentOutput(response=response, tool_calls=[call], raw=None, current_agent_name="a")
    assert message_id(without).startswith("llamaindex-")
    assert message_id(without) == message_id(without.model_copy())
    assert message_id(without, 1) != message_id(without, 2)  # the same answer at another point of the conversation
    other = AgentOutput(
        response=response, tool_calls=[call.model_copy(update={"tool_id": "call_2"})], raw=None, current_agent_name="a"
    )
    assert message_id(other) != message_id(without)


async def test_a_tool_that_raises_is_not_recorded_and_the_model_reads_the_error(sql_ledger: Ledger) -> None:
    """LlamaIndex answers the exception with an error ``ToolOutput`` for the model; the adapter records no
    outcome, so a run asked again runs the tool again (docs/adapters.md, section 7), decorated or not."""
    attempts: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        attempts.append("plain")
        raise RuntimeError("the bank is down")

    @replay_safe(ledger=sql_ledger)
    def charge(order_id: str) -> str:
        """Charge an order."""
        attempts.append("decorated")
        raise RuntimeError("the card was declined")

    script = Script(((refund("A1"), ScriptedCall("charge", {"order_id": "A1"})), "Sorry."), name="raises")
    for _ in range(2):
        tools: list[BaseTool | Callable[..., Any]] = [
            FunctionTool.from_defaults(fn=refund_order),
            FunctionTool.from_defaults(fn=charge),
        ]
        agent = replay_safe_agent(
            FunctionAgent(tools=tools, llm=scripted_llm(script)), ledger=sql_ledger, thread_id=THREAD
        )
        result = await run_agent(agent)
        assert sorted((call.tool_output.is_error, call.tool_output.content) for call in result.tool_calls) == [
            (True, "the bank is down"),
            (True, "the card was declined"),
        ]
    assert sorted(attempts) == ["decorated", "decorated", "plain", "plain"]
    message, call_ids = script.ids("openai-chat", 0)
    assert all(sql_ledger.get(CallKey(THREAD, message, call_id)) is None for call_id in call_ids)


async def test_replaysafes_refusal_ends_the_run_instead_of_reaching_the_model(ledger: SqliteLedger) -> None:
    """The same call (same ids) asked with other arguments: ``ReplayMismatchError`` ends the run; shown to the model
    as a tool error it would only be asked for again under a new id. Decorated tools included."""
    effects = Effects()
    first = Script(((refund("A1"),), "Done."), name="mismatch")
    edited = Script(((refund("B2"),), "Done."), name="mismatch")  # the same name: the same ids
    await run_agent(replay_safe_agent(function_agent(first, effects), ledger=ledger, thread_id=THREAD))
    with pytest.raises(ReplayMismatchError, match="refund_order"):
        await run_agent(replay_safe_agent(function_agent(edited, effects), ledger=ledger, thread_id=THREAD))
    assert effects.done == ["refund A1"]

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str) -> str:
        """Refund an order, protected by its own decorator."""
        effects.done.append(f"decorated {order_id}")
        return order_id

    def decorated(script: Script) -> FunctionAgent:
        agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=refund_order)], llm=scripted_llm(script))
        return replay_safe_agent(agent, ledger=ledger, thread_id=THREAD)

    await run_agent(decorated(Script(((refund("A1"),), "Done."), name="decorated")))
    with pytest.raises(ReplayMismatchError, match="refund_order"):
        await run_agent(decorated(Script(((refund("B2"),), "Done."), name="decorated")))
    assert effects.done == ["refund A1", "decorated A1"]


async def test_a_missing_tool_id_is_named_once_per_tool(sql_ledger: Ledger) -> None:
    """A model that gives its calls no ids (LlamaIndex then passes ``tool_id=""``): each call runs unprotected,
    and one warning per tool, not per call, says which id is missing and what to do."""
    effects = Effects()

    def answer(messages: Sequence[ChatMessage], **_: Any) -> ChatMessage:
        if any(message.role == MessageRole.ASSISTANT for message in messages):
            return ChatMessage(role=MessageRole.ASSISTANT, content="Done.")
        calls = [
            ToolCallBlock(tool_call_id=None, tool_name="refund_order", tool_kwargs={"order_id": order})
            for order in ("A1", "B2", "C3")
        ]
        calls.append(ToolCallBlock(tool_call_id=None, tool_name="send_email", tool_kwargs={"to": "ana@example.com"}))
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=list(calls))

    agent = FunctionAgent(tools=tools_of(effects), llm=MockFunctionCallingLLM(response_generator=answer))
    wrapped = replay_safe_agent(agent, ledger=sql_ledger, thread_id=THREAD)

    async def two_runs() -> None:
        await run_agent(wrapped)
        await run_agent(wrapped, prompt="And again")

    with pytest.warns(UnprotectedCallWarning) as warned:
        await two_runs()
    messages = sorted(str(warning.message) for warning in warned if warning.category is UnprotectedCallWarning)
    assert len(messages) == 2, messages
    assert messages[0].startswith("refund_order ran WITHOUT replay protection: the call's tool_call_id is empty")
    assert messages[1].startswith("send_email ran WITHOUT replay protection: the call's tool_call_id is empty")
    assert all(MISSING_IDS_FIX in message for message in messages)
    assert len(effects.done) == 8  # nothing protected: every call ran
    assert list(sql_ledger.records()) == []


async def test_a_side_effect_before_a_wait_for_a_human_runs_once_across_the_wait_and_a_saved_context(
    tmp_path: Path,
) -> None:
    """A tool charges (a ``@replay_safe`` step), then waits for a human (``ctx.wait_for_event``); the run's
    ``Context`` is saved at the question (``to_dict``), restored in a new agent (``from_dict``) and answered.
    LlamaIndex runs the waiting step again from its top once the answer comes: with the adapter the call was kept
    paused, so the charge (a step of the call) replays; without it, the customer is charged twice."""
    assert await charges_across_a_wait(tmp_path / "held.db", protect=True) == ["A1"]
    assert await charges_across_a_wait(tmp_path / "control.db", protect=False) == ["A1", "A1"]


async def charges_across_a_wait(path: Path, *, protect: bool) -> list[str]:
    """The charges of one refund that waits for a person, saved at the question, restored and answered."""
    charges: list[str] = []
    ledger = SqliteLedger(path)

    def charge_card(order_id: str) -> str:
        charges.append(order_id)
        return f"ch_{order_id}"

    charge = replay_safe(name="charge", ledger=ledger)(charge_card) if protect else charge_card

    async def refund_after_approval(ctx: Context, order_id: str) -> str:
        """Charge the fee, then ask a person to approve the refund."""
        fee = charge(order_id)
        answer = await ctx.wait_for_event(
            HumanResponseEvent,
            waiter_event=InputRequiredEvent(prefix=f"Refund {order_id}?"),  # type: ignore[call-arg]
        )
        return f"{fee} {answer.response}"

    script = Script(((ScriptedCall("refund_after_approval", {"order_id": "A1"}),), "Done."), name="approval")

    def build() -> FunctionAgent:
        agent = FunctionAgent(
            tools=[FunctionTool.from_defaults(async_fn=refund_after_approval)], llm=scripted_llm(script)
        )
        return replay_safe_agent(agent, ledger=ledger, thread_id=THREAD) if protect else agent

    agent = build()
    ctx = Context(agent)
    handler = agent.run(user_msg="Refund A1", ctx=ctx, memory=memory())
    async for event in handler.stream_events():
        if isinstance(event, InputRequiredEvent):
            saved = json.dumps(ctx.to_dict(serializer=SERIALIZER))
            break
    await handler.cancel_run()
    resumed = build()
    restored = Context.from_dict(resumed, json.loads(saved), serializer=SERIALIZER)
    handler = resumed.run(ctx=restored)
    assert handler.ctx is not None
    answer = HumanResponseEvent(response="approved")  # type: ignore[call-arg]
    handler.ctx.send_event(answer)  # the person's answer, to the restored run
    result: Any = await asyncio.wait_for(handler, 30)
    assert [call.tool_output.content for call in result.tool_calls] == ["ch_A1 approved"]
    ledger.close()
    return charges


#: Where the first process of the crash test below dies: the question is out and the Context saved with it.
WAITING = "waiting-for-a-human"


def wait_child(ledger_path: str, effects_path: str, context_path: str, protect: bool) -> list[str]:
    """One process of a refund that charges a fee (a ``@replay_safe`` step), then waits for a person.

    With no saved Context it starts the run and, at the question, saves the Context to ``context_path`` (as a
    user saves it for an answer that may come in a day) and is SIGKILLed there (``kill_point``). With one, it
    restores it in a new agent (``Context.from_dict``), sends the person's approval and returns the call's output.
    Each charge is a line appended to ``effects_path``: the count survives the processes.
    """
    saved = Path(context_path)
    data = json.loads(saved.read_text()) if saved.exists() else None
    with SqliteLedger(ledger_path) as ledger:
        return asyncio.run(wait_run(ledger, Path(effects_path), saved, data, protect))


def save_context(path: Path, ctx: Context) -> None:
    """The context written whole (a process killed mid-write leaves none)."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(ctx.to_dict(serializer=SERIALIZER)))
    os.replace(temporary, path)


async def wait_run(ledger: Ledger, effects: Path, saved: Path, data: dict[str, Any] | None, protect: bool) -> list[str]:
    def charge_card(order_id: str) -> str:
        with effects.open("a") as file:
            file.write(f"{order_id}\n")
        return f"ch_{order_id}"

    charge = replay_safe(name="charge", ledger=ledger)(charge_card)  # a step: protected inside a protected call

    async def refund_after_approval(ctx: Context, order_id: str) -> str:
        """Charge the fee, then ask a person to approve the refund."""
        fee = charge(order_id)
        answer = await ctx.wait_for_event(
            HumanResponseEvent,
            waiter_event=InputRequiredEvent(prefix=f"Refund {order_id}?"),  # type: ignore[call-arg]
        )
        return f"{fee} {answer.response}"

    script = Script(((ScriptedCall("refund_after_approval", {"order_id": "A1"}),), "Done."), name="wait-crash")
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(async_fn=refund_after_approval)], llm=scripted_llm(script))
    if protect:
        agent = replay_safe_agent(agent, ledger=ledger, thread_id=THREAD)
    if data is None:
        ctx = Context(agent)
        handler = agent.run(user_msg="Refund A1", ctx=ctx, memory=memory())
        async for event in handler.stream_events():
            if isinstance(event, InputRequiredEvent):
                save_context(saved, ctx)
                kill_point(WAITING)  # SIGKILL: the process dies while the person has not answered
        raise AssertionError("the run ended without waiting for a person")
    handler = agent.run(ctx=Context.from_dict(agent, data, serializer=SERIALIZER))
    assert handler.ctx is not None
    handler.ctx.send_event(HumanResponseEvent(response="approved"))  # type: ignore[call-arg]
    result: Any = await asyncio.wait_for(handler, 30)
    return [str(call.tool_output.content) for call in result.tool_calls]


@pytest.mark.parametrize("protect", [True, False], ids=["adapter", "control"])
def test_a_charge_before_a_wait_for_a_human_runs_once_across_a_kill_in_the_wait(tmp_path: Path, protect: bool) -> None:
    """The test above across processes: the first one charges, asks the person, saves its ``Context`` and is
    SIGKILLed while it waits; a new process restores the Context and answers. LlamaIndex runs the waiting step
    again from its top: with the adapter the call was kept paused in the ledger file, so the charge replays; the
    control, the same agent without the adapter, charges twice."""
    ledger_path, effects, saved = tmp_path / "ledger.db", tmp_path / "effects.txt", tmp_path / "context.json"
    args = (str(ledger_path), str(effects), str(saved), protect)
    killed = run_in_child(wait_child, *args, kill_at=WAITING, timeout=60)
    assert killed.killed
    assert saved.exists()
    assert ("charge ran WITHOUT replay protection" in killed.stderr) is not protect  # the control's step, said
    assert effects.read_text().split() == ["A1"]
    with SqliteLedger(ledger_path) as ledger:  # what the killed process left: the call paused, its charge recorded
        left = {record.tool_name: record.status for record in ledger.records()}
    assert left == ({"refund_after_approval": Status.PAUSED, "charge": Status.COMPLETED} if protect else {})

    resumed = run_in_child(wait_child, *args, timeout=60)
    assert resumed.value == ["ch_A1 approved"]
    assert effects.read_text().split() == (["A1"] if protect else ["A1", "A1"])


async def test_a_replanned_call_replays_under_key_args(ledger: SqliteLedger) -> None:
    """A model asked again plans the refund under new ids (``new_ids_after_restart``): ``key="args"`` replays it on
    the thread; the default key, the control, runs it again."""
    script = Script(((refund("A1"),), "Done."), name="replan", new_ids_after_restart=True)
    choices: tuple[tuple[dict[str, Any], int], ...] = (({"key": "args"}, 1), ({}, 2))
    for options, refunds in choices:
        effects = Effects()
        for boot in range(2):
            agent = function_agent(script, effects, boot=boot)
            await run_agent(replay_safe_agent(agent, ledger=ledger, thread_id=f"{THREAD}-{options}", **options))
        assert effects.count("refund A1") == refunds, options


def react_llm() -> MockFunctionCallingLLM:
    """A text model answering in ReAct's format: a refund, then the answer once it has seen the observation."""

    def answer(messages: Sequence[ChatMessage], **_: Any) -> ChatMessage:
        if any((message.content or "").startswith("Observation:") for message in messages):
            return ChatMessage(role=MessageRole.ASSISTANT, content="Thought: I can answer.\nAnswer: Refunded.")
        action = 'Thought: I must refund.\nAction: refund_order\nAction Input: {"order_id": "A1"}'
        return ChatMessage(role=MessageRole.ASSISTANT, content=action)

    return MockFunctionCallingLLM(response_generator=answer, is_chat_model=True)


async def test_a_react_agent_keys_its_calls_by_their_arguments(ledger: SqliteLedger) -> None:
    """``ReActAgent`` mints a new ``tool_id`` (a uuid4) each time it parses the model's answer: the adapter keys its
    undecorated tools by their arguments, so the same answer parsed again replays; without the adapter it runs."""
    for protect, refunds in ((True, 1), (False, 2)):
        effects = Effects()
        tool_ids = []
        for _ in range(2):
            agent = ReActAgent(tools=tools_of(effects), llm=react_llm())
            result = await run_agent(replay_safe_agent(agent, ledger=ledger, thread_id=THREAD) if protect else agent)
            assert str(result) == "Refunded."
            tool_ids.append(result.tool_calls[0].tool_id)
        assert tool_ids[0] != tool_ids[1]
        assert effects.count("refund A1") == refunds, protect


async def test_an_agent_workflow_is_wrapped_as_a_whole(ledger: SqliteLedger) -> None:
    """``AgentWorkflow`` runs its agents' tools in its own ``call_tool`` step: wrapping the workflow protects them."""
    effects = Effects()
    script = Script(((refund("A1"),), (email("ana@example.com"),), "Done."), name="workflow")
    for _ in range(2):
        workflow = AgentWorkflow(agents=[function_agent(script, effects)])
        result = await run_agent(replay_safe_agent(workflow, ledger=ledger, thread_id=THREAD))
        assert str(result) == "Done."
    assert effects.done == ["refund A1", "email ana@example.com"]


async def test_the_thread_id_lives_in_the_context_when_none_is_given(ledger: SqliteLedger) -> None:
    """Without ``thread_id=``, each ``Context`` is a thread of its own, its id kept in the context's state: a run
    continued in the same context (or one restored from its ``to_dict``) is the same thread, a new context another."""
    effects = Effects()
    script = Script(((refund("A1"),), "Done."), name="context-thread")
    agent = replay_safe_agent(function_agent(script, effects), ledger=ledger)
    ctx = Context(agent)
    await agent.run(user_msg="Refund order 42", ctx=ctx, memory=memory())
    kept = await ctx.store.get("replaysafe")
    restored = Context.from_dict(
        agent, json.loads(json.dumps(ctx.to_dict(serializer=SERIALIZER))), serializer=SERIALIZER
    )
    assert (await restored.store.get("replaysafe"))["thread_id"] == kept["thread_id"]
    await run_agent(agent, Context(agent))  # another conversation: its refund is its own
    assert effects.done == ["refund A1", "refund A1"]


def test_only_llamaindex_agents_are_taken() -> None:
    with pytest.raises(TypeError, match="FunctionAgent, ReActAgent or AgentWorkflow"):
        replay_safe_agent(object())  # type: ignore[type-var]


def test_the_copy_keeps_the_agent_and_leaves_the_original_alone() -> None:
    effects = Effects()
    agent = function_agent(Script(("Hi.",), name="copy"), effects)
    wrapped = replay_safe_agent(agent, ledger=MemoryLedger())
    assert isinstance(wrapped, FunctionAgent)
    assert type(agent) is FunctionAgent
    assert (wrapped.name, wrapped.tools, wrapped.llm) == (agent.name, agent.tools, agent.llm)
    again = replay_safe_agent(wrapped, ledger=MemoryLedger())  # wrapping a wrapped agent wraps the agent anew
    assert type(again) is type(wrapped) is type(replay_safe_agent(agent))
    assert type(again).__mro__[2] is FunctionAgent
    assert asyncio.run(run_agent(wrapped)).response.content == "Hi."
