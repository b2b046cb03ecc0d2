"""``replay_safe_crew`` on real crews: keys, parallel calls, tools that raise, refusals, async tools, missing ids,
and a crew killed while it waits for a human (``Task(human_input=True)``), resumed in a new process.

Every crew runs on ``replaysafe_crewai.testing.ScriptedLLM`` (CrewAI's ``BaseLLM``, native tool calls with Chat
Completions ids); the crash test runs in real child processes (``replaysafe.testing.run_in_child``).
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from crewai import Agent, Crew, CrewOutput, Task
from crewai.core.providers.human_input import SyncHumanInputProvider, reset_provider, set_provider
from crewai.hooks.dispatch import HookAborted
from crewai.tools import BaseTool, tool
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_message_function_tool_call import Function

from replaysafe import (
    CallInDoubtError,
    CallKey,
    Ledger,
    ReplaySafeWarning,
    SqliteLedger,
    UnprotectedCallWarning,
    current_call,
    replay_safe,
)
from replaysafe.testing import Script, ScriptedCall, kill_point, run_in_child
from replaysafe_crewai import MISSING_IDS_FIX, replay_safe_crew, replay_safe_tools
from replaysafe_crewai.testing import ScriptedLLM, model_turn

THREAD = "order-A1"


def calls(*pairs: tuple[str, dict[str, Any]]) -> tuple[ScriptedCall, ...]:
    return tuple(ScriptedCall(name, args) for name, args in pairs)


def crew_of(
    script: Script,
    tools: Sequence[BaseTool],
    ledger: Ledger | None,
    *,
    llm: Any = None,
    human_input: bool = False,
    **options: Any,
) -> Crew:
    """One agent, one task, on the scripted LLM; wrapped by ``replay_safe_crew`` unless ``ledger`` is None."""
    agent = Agent(
        role="support",
        goal="Handle the order",
        backstory="A support agent.",
        llm=llm or ScriptedLLM(script=script),
        tools=list(tools),
        max_retry_limit=0,
    )
    task = Task(description="Handle order A1", expected_output="A sentence.", agent=agent, human_input=human_input)
    crew = Crew(agents=[agent], tasks=[task])
    return crew if ledger is None else replay_safe_crew(crew, ledger=ledger, **options)


def answer(output: object) -> str:
    """A kickoff's answer (a crew that does not stream returns a ``CrewOutput``)."""
    assert isinstance(output, CrewOutput)
    return output.raw


class Effects:
    """What the tools did, and under which key, in the order they did it."""

    def __init__(self) -> None:
        self.done: list[tuple[str, CallKey]] = []
        self.lock = threading.Lock()

    def add(self, what: str) -> str:
        with self.lock:
            self.done.append((what, current_call().key))
        return f"done {what}"

    @property
    def names(self) -> list[str]:
        return [what for what, _ in self.done]


def test_parallel_calls_of_one_turn_are_keyed_and_replayed_one_by_one(ledger: SqliteLedger) -> None:
    """CrewAI runs a turn's calls side by side (the barrier proves it): each gets the provider's call id, all
    share the turn's message id, and a crew run again on the thread replays each of them."""
    effects, barrier = Effects(), threading.Barrier(3, timeout=60)

    @tool("refund_order")
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        barrier.wait()
        return effects.add(f"refund {order_id}")

    @tool("send_email")
    def send_email(to: str) -> str:
        """Email a customer."""
        barrier.wait()
        return effects.add(f"email {to}")

    turn = calls(
        ("refund_order", {"order_id": "A1"}), ("refund_order", {"order_id": "B2"}), ("send_email", {"to": "ana"})
    )
    script = Script((turn, "Done."), name="parallel")
    first = crew_of(script, [refund_order, send_email], ledger, thread_id=THREAD).kickoff()
    assert answer(first) == "Done."
    assert sorted(effects.names) == ["email ana", "refund A1", "refund B2"]
    _, call_ids = script.ids("openai-chat", 0)
    by_name = dict(effects.done)
    assert [by_name[name].tool_call_id for name in ("refund A1", "refund B2", "email ana")] == call_ids
    assert {key.message_id for _, key in effects.done} == {by_name["refund A1"].message_id}
    assert {key.thread_id for _, key in effects.done} == {THREAD}

    barrier.reset()
    again = crew_of(script, [refund_order, send_email], ledger, thread_id=THREAD).kickoff()
    assert answer(again) == "Done."
    assert len(effects.done) == 3  # every call replayed its record; none ran again


class SameCallIds(ScriptedLLM):
    """A model that numbers its calls ``call_1`` on every turn, as many test models and gateways do."""

    def call(self, messages: Any, tools: Any = None, *args: Any, **kwargs: Any) -> Any:
        answer = self.script.turn(model_turn(messages))
        if isinstance(answer, str):
            return answer
        return [
            ChatCompletionMessageFunctionToolCall(
                id=f"call_{index}", type="function", function=Function(name=call.tool, arguments='{"order_id": "A1"}')
            )
            for index, call in enumerate(answer, start=1)
        ]


def test_a_new_turn_with_the_same_call_id_and_arguments_runs(ledger: SqliteLedger) -> None:
    """The message id (a digest of the turn's assistant message and its place) separates the turns."""
    effects = Effects()

    @tool("refund_order")
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        return effects.add(order_id)

    refund = calls(("refund_order", {"order_id": "A1"}))
    script = Script((refund, refund, "Done."), name="same-ids")
    crew_of(script, [refund_order], ledger, llm=SameCallIds(script=script), thread_id=THREAD).kickoff()
    assert effects.names == ["A1", "A1"]
    first, second = (key for _, key in effects.done)
    assert first.tool_call_id == second.tool_call_id == "call_1"
    assert first.message_id != second.message_id

    crew_of(script, [refund_order], ledger, llm=SameCallIds(script=script), thread_id=THREAD).kickoff()
    assert len(effects.done) == 2  # run again on the thread: both replay


def test_a_tool_that_raises_is_not_recorded_and_runs_again(ledger: SqliteLedger) -> None:
    """CrewAI shows the model the tool's error ("Error executing tool: ..."); the ledger records nothing, so a
    crew run again on the thread runs the tool again (docs/adapters.md section 7)."""
    attempts: list[str] = []

    @tool("refund_order")
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        attempts.append(order_id)
        if len(attempts) == 1:
            raise ValueError("the bank is down")
        return f"refunded {order_id}"

    seen: list[str] = []

    class Watching(ScriptedLLM):
        def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
            seen.extend(str(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "tool")
            return super().call(messages, *args, **kwargs)

    script = Script((calls(("refund_order", {"order_id": "A1"})), "Done."), name="raises")
    crew_of(script, [refund_order], ledger, llm=Watching(script=script), thread_id=THREAD).kickoff()
    assert attempts == ["A1"]
    assert any("the bank is down" in content for content in seen)  # the model was told, as CrewAI does
    crew_of(script, [refund_order], ledger, llm=Watching(script=script), thread_id=THREAD).kickoff()
    assert attempts == ["A1", "A1"]  # not recorded: run again
    crew_of(script, [refund_order], ledger, llm=Watching(script=script), thread_id=THREAD).kickoff()
    assert attempts == ["A1", "A1"]  # the success was recorded: replayed


class Interrupted(BaseException):
    """The process stopping mid-tool (as a KeyboardInterrupt would): the call is left in doubt."""


def test_a_refusal_ends_the_run_and_never_reaches_the_model(ledger: SqliteLedger) -> None:
    """A call in doubt under ``in_doubt="raise"``: ``kickoff`` raises ``CallInDoubtError`` (also CrewAI's
    ``HookAborted``, so neither the parallel batch nor the agent's retry swallows it), the tool does not run
    again, and the model is never asked about it."""
    effects = Effects()
    interrupt = [True]

    @tool("refund_order")
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        result = effects.add(order_id)
        if interrupt and order_id == "7731":
            interrupt.clear()
            raise Interrupted
        return result

    script = Script((calls(("refund_order", {"order_id": "7731"})), "Done."), name="refusal")
    with pytest.raises(Interrupted):
        crew_of(script, [refund_order], ledger, thread_id=THREAD).kickoff()

    asked: list[int] = []

    class Counting(ScriptedLLM):
        def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
            asked.append(model_turn(messages))
            return super().call(messages, *args, **kwargs)

    with pytest.raises(CallInDoubtError) as raised:
        crew_of(
            script, [refund_order], ledger, llm=Counting(script=script), thread_id=THREAD, in_doubt="raise"
        ).kickoff()
    assert isinstance(raised.value, HookAborted)
    assert "refund_order" in str(raised.value)
    assert "7731" not in str(raised.value)  # ids and the next step, never the arguments
    assert effects.names == ["7731"]
    assert asked == [0]  # the model planned the call; it never saw the refusal

    # In a parallel batch too: the sibling's result does not turn the refusal into a message.
    parallel = Script((calls(("refund_order", {"order_id": "7731"}), ("refund_order", {"order_id": "B2"})), "Done."))
    interrupt.append(True)
    with pytest.raises(Interrupted):
        crew_of(parallel, [refund_order], ledger, thread_id="order-B2").kickoff()
    with pytest.raises(CallInDoubtError):
        crew_of(parallel, [refund_order], ledger, thread_id="order-B2", in_doubt="raise").kickoff()


async def test_async_and_sync_tools_under_kickoff_and_kickoff_async(ledger: SqliteLedger) -> None:
    """An ``async def`` tool (CrewAI runs its coroutine in ``Tool.run``), a sync one, and a ``@replay_safe``
    function made a tool (it keeps its own options; the adapter gives it its ids), under ``kickoff`` (in a
    thread) and ``kickoff_async``: each records once and replays on the next run."""
    effects = Effects()

    @tool("refund_order")
    async def refund_order(order_id: str) -> str:
        """Refund an order."""
        return effects.add(f"refund {order_id}")

    @tool("send_email")
    def send_email(to: str) -> str:
        """Email a customer."""
        return effects.add(f"email {to}")

    @replay_safe(ledger=ledger, name="notify")
    def notify(order_id: str) -> str:
        """Notify the warehouse."""
        return effects.add(f"notify {order_id}")

    tools: list[BaseTool] = [refund_order, send_email, tool("notify")(notify)]
    script = Script(
        (
            calls(("refund_order", {"order_id": "A1"})),
            calls(("send_email", {"to": "ana"})),
            calls(("notify", {"order_id": "A1"})),
            "Done.",
        ),
        name="async",
    )
    for run in range(2):
        result = await asyncio.to_thread(crew_of(script, tools, ledger, thread_id=THREAD).kickoff)
        assert answer(result) == "Done."
        result = await crew_of(script, tools, ledger, thread_id="order-A1-async").kickoff_async()
        assert answer(result) == "Done.", run
    assert sorted(effects.names) == sorted(["refund A1", "email ana", "notify A1"] * 2)
    assert {key.thread_id for _, key in effects.done} == {THREAD, "order-A1-async"}


def test_a_missing_thread_id_warns_once_per_tool_naming_it_and_the_fix(ledger: SqliteLedger) -> None:

    @tool("refund_order")
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    script = Script(
        (calls(("refund_order", {"order_id": "A1"})), calls(("refund_order", {"order_id": "B2"})), "Done."),
        name="no-thread",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        crew_of(script, [refund_order], ledger).kickoff()
    said = [str(w.message) for w in caught if issubclass(w.category, UnprotectedCallWarning)]
    assert len(said) == 1, said  # two calls, one warning
    assert "refund_order ran WITHOUT replay protection" in said[0]
    assert "thread_id is empty" in said[0]
    assert MISSING_IDS_FIX in said[0]
    assert "A1" not in said[0]


def test_calls_without_provider_ids_are_keyed_by_digest_with_one_warning_per_tool(ledger: SqliteLedger) -> None:
    """A provider that gives no call ids (CrewAI numbers them ``call_<id(obj)>``, new in every run): keyed by
    the message digest and the arguments' digest, told once per tool, and still replayed."""
    effects = Effects()

    @tool("charge_card")
    def charge_card(order_id: str) -> str:
        """Charge a card."""
        return effects.add(order_id)

    turn = calls(
        ("charge_card", {"order_id": "A1"}), ("charge_card", {"order_id": "A1"}), ("charge_card", {"order_id": "B2"})
    )
    script = Script((turn, "Done."), name="no-ids")

    def kickoff() -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            crew_of(
                script, [charge_card], ledger, llm=ScriptedLLM(script=script, ids=False), thread_id=THREAD
            ).kickoff()
        return [str(w.message) for w in caught if issubclass(w.category, ReplaySafeWarning)]

    said = kickoff()
    assert len(said) == 1, said
    assert said[0].startswith("charge_card: the model's tool calls carry no id")
    assert sorted(effects.names) == ["A1", "A1", "B2"]  # the same call twice in one message: two calls
    call_ids = sorted(key.tool_call_id for _, key in effects.done)
    assert all(call_id.startswith("args-") for call_id in call_ids)
    assert len(set(call_ids)) == 3
    assert kickoff() == []  # once per tool and process
    assert len(effects.done) == 3  # new objects, new call_<id(obj)>: the digests replay them


# --- a crew killed while it waits for a human, resumed in a new process ---------------------------------

HUMAN_SCRIPT = Script((calls(("refund_order", {"order_id": "A1"})), "Refunded A1."), name="human-input")


class Reviewer(SyncHumanInputProvider):
    """CrewAI's own console provider, answered by the test: the reviewer approves (an empty answer)."""

    def _prompt_input(self, crew: Any) -> str:  # type: ignore[override]
        kill_point("waiting-for-a-human")  # the first process dies here, while the human has not answered
        return ""


def review_child(ledger_path: str, effects_path: str, protect: bool) -> str:
    """A crew whose task asks a human to review its answer; the refund comes before the pause."""
    effects = Path(effects_path)

    @tool("refund_order")
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        with effects.open("a") as file:
            file.write(f"{order_id}\n")
        return f"refunded {order_id}"

    token = set_provider(Reviewer())
    try:
        with SqliteLedger(ledger_path) as ledger:
            crew = crew_of(
                HUMAN_SCRIPT, [refund_order], ledger if protect else None, human_input=True, thread_id=THREAD
            )
            return answer(crew.kickoff())
    finally:
        reset_provider(token)


@pytest.mark.parametrize("protect", [True, False], ids=["adapter", "control"])
def test_a_refund_before_a_human_review_runs_once_across_a_crash_in_the_pause(tmp_path: Path, protect: bool) -> None:
    """``Task(human_input=True)``: the agent refunds, answers, then waits for the reviewer. The process dies
    there; CrewAI keeps nothing of a task in progress, so the new one runs the task again, and the model plans
    the refund again under the same ids: the adapter replays it (the control refunds twice)."""
    ledger_path, effects_path = str(tmp_path / "ledger.db"), tmp_path / "effects.txt"
    killed = run_in_child(review_child, ledger_path, str(effects_path), protect, kill_at="waiting-for-a-human")
    assert killed.killed
    assert effects_path.read_text().split() == ["A1"]
    resumed = run_in_child(review_child, ledger_path, str(effects_path), protect)
    assert resumed.value == "Refunded A1."
    assert effects_path.read_text().split() == (["A1"] if protect else ["A1", "A1"])


def test_replay_safe_tools_wraps_once_and_keeps_the_tool(ledger: SqliteLedger) -> None:
    @tool("refund_order")
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        return order_id

    wrapped = replay_safe_tools([refund_order], ledger)
    assert replay_safe_tools(wrapped, ledger)[0] is wrapped[0]  # wrapping a crew twice does not wrap twice
    assert wrapped[0].name == refund_order.name
    assert wrapped[0].description == refund_order.description
    assert wrapped[0].args_schema is refund_order.args_schema
    assert refund_order.func is not wrapped[0].func  # type: ignore[attr-defined]
