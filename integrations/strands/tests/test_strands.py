"""ReplaySafeHooks on real Strands agents and the scripted model, in process: keys, replays, parallel sync and
async calls, tools that raise, replaysafe's errors ending the run, missing ids, and an interrupt's resume.

Crashes with real SIGKILLs are the conformance kit's (test_strands_conformance.py): not repeated here.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from strands import Agent, ToolContext, tool
from strands.hooks import BeforeToolCallEvent, HookRegistry
from strands.session import FileSessionManager
from strands.tools.executors import ConcurrentToolExecutor, SequentialToolExecutor
from strands.types.content import Message, Messages
from strands.types.exceptions import EventLoopException

from replaysafe import (
    CallKey,
    Ledger,
    ReplayMismatchError,
    SqliteLedger,
    Status,
    UnprotectedCallWarning,
    replay_safe,
)
from replaysafe.testing import Script, ScriptedCall, kill_point, run_in_child
from replaysafe_strands import ReplaySafeHooks
from replaysafe_strands.testing import ScriptedModel, tracking_id

THREAD = "support-thread"


def build(
    script: Script,
    tools: Sequence[Any],
    *,
    hooks: Sequence[Any] = (),
    messages: Messages | None = None,
    session: FileSessionManager | None = None,
    executor: Any = None,
) -> Agent:
    """A real agent on the scripted model, which fixes its messages' tracking ids (it is among the hooks)."""
    model = ScriptedModel(script)
    return Agent(
        model=model,
        tools=list(tools),
        hooks=[model, *hooks],
        messages=messages,
        session_manager=session,
        callback_handler=None,
        tool_executor=executor,
    )


def pending_turn(agent: Agent) -> Messages:
    """The history up to the model's first toolUse message: what a session holds when a process was killed while
    that turn's tools ran (Strands saves a turn's results only once all its tools have run)."""
    end = next(i for i, m in enumerate(agent.messages) if any("toolUse" in b for b in m["content"]))
    return copy.deepcopy(agent.messages[: end + 1])


def results(agent: Agent) -> list[Any]:
    """The tool results of the agent's first tool-result message, in order."""
    message = next(m for m in agent.messages if any("toolResult" in b for b in m["content"]))
    return [block["toolResult"] for block in message["content"]]


def effect_tools(effects: list[str]) -> tuple[Any, Any]:
    """A sync refund and an async email, each appending its side effect to ``effects``."""

    @tool
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        effects.append(f"refund {order_id}")
        return f"refunded {order_id}"

    @tool
    async def send_email(to: str) -> str:
        """Email a customer."""
        effects.append(f"email {to}")
        return f"sent to {to}"

    return refund_order, send_email


PARALLEL = Script(
    (
        (
            ScriptedCall("refund_order", {"order_id": "A1"}),
            ScriptedCall("refund_order", {"order_id": "B2"}),
            ScriptedCall("send_email", {"to": "ana@example.com"}),
            ScriptedCall("track_refunds", {"order_ids": ["A1", "B2"]}),
        ),
        "Refunded A1 and B2, Ana is told.",
    ),
    name="parallel",
)
EFFECTS = ["email ana@example.com", "refund A1", "refund B2", "tracked A1,B2"]


@pytest.mark.parametrize("executor", [ConcurrentToolExecutor, SequentialToolExecutor], ids=lambda e: e.__name__)
def test_calls_of_one_turn_are_each_recorded_and_replayed(tmp_path: Path, ledger: Ledger, executor: type) -> None:
    """Four calls in one turn (two of one sync tool, an async tool, a streaming async generator), side by side
    under Strands' concurrent executor or one by one under its sequential one: each recorded under its own
    toolUseId and the turn's message id; resumed from the toolUse message, each returns its recorded result and
    none runs again."""
    effects: list[str] = []

    @tool
    async def track_refunds(order_ids: list[str]) -> Any:
        """Track refunds, reporting progress."""
        for order_id in order_ids:
            yield f"tracking {order_id}"
        effects.append(f"tracked {','.join(order_ids)}")
        yield f"tracked {len(order_ids)}"

    tools = [*effect_tools(effects), track_refunds]
    session = FileSessionManager(session_id="order-A1", storage_dir=str(tmp_path))
    first = build(PARALLEL, tools, hooks=[ReplaySafeHooks(ledger)], session=session, executor=executor())
    first("Refund A1 and B2, then tell Ana")
    assert sorted(effects) == EFFECTS

    message = tracking_id(PARALLEL, 0)
    _, call_ids = PARALLEL.ids("bedrock", 0)
    names = ["refund_order", "refund_order", "send_email", "track_refunds"]
    for call_id, name in zip(call_ids, names, strict=True):
        record = ledger.get(CallKey("order-A1/default", message, call_id))  # the session's id / the agent's id
        assert record is not None
        assert (record.tool_name, record.status) == (name, Status.COMPLETED)

    hooks = [ReplaySafeHooks(ledger, thread_id="order-A1/default")]
    resumed = build(PARALLEL, tools, hooks=hooks, messages=pending_turn(first), executor=executor())
    resumed()  # no prompt: Strands runs the pending toolUse again, without asking the model
    assert sorted(effects) == EFFECTS
    assert results(resumed) == results(first)


def test_a_new_turn_with_the_same_tool_use_id_runs(ledger: Ledger) -> None:
    """Tool use ids are unique only within one message: another assistant message (another tracking id) reusing
    ``call_1`` is a new call."""
    effects: list[str] = []
    refund_order, _ = effect_tools(effects)

    def turn(message_id: str) -> Messages:
        ask: Message = {"role": "user", "content": [{"text": "Refund A1"}], "tracking_id": f"user-{message_id}"}
        use = {"toolUseId": "call_1", "name": "refund_order", "input": {"order_id": "A1"}}
        answer: Message = {"role": "assistant", "content": [{"toolUse": use}], "tracking_id": message_id}  # type: ignore[typeddict-item]
        return [ask, answer]

    done = Script(("Refunded.",), name="new-turn")
    for message_id in ["a4c5e7d2-0b1f-4c3a-9e8d-1f2a3b4c5d6e", "a4c5e7d2-0b1f-4c3a-9e8d-1f2a3b4c5d6e"]:
        build(done, [refund_order], hooks=[ReplaySafeHooks(ledger, thread_id=THREAD)], messages=turn(message_id))()
    assert effects == ["refund A1"]  # the same message again: replayed
    build(done, [refund_order], hooks=[ReplaySafeHooks(ledger, thread_id=THREAD)], messages=turn("b9e0..."))()
    assert effects == ["refund A1", "refund A1"]  # another message with call_1: a new call


def test_a_tool_that_raises_is_not_recorded_and_runs_again(sql_ledger: Ledger) -> None:
    """Strands turns the error into an error result for the model; the call is not recorded, so a resume of the
    turn runs the tool again (docs/adapters.md, section 7). An error result the tool returns is not recorded
    either."""
    attempts: list[str] = []

    @tool
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        attempts.append(order_id)
        if attempts.count(order_id) == 1:
            raise RuntimeError("the bank timed out")
        return f"refunded {order_id}"

    @tool
    def lookup_order(order_id: str) -> dict[str, Any]:
        """Look an order up."""
        attempts.append(f"lookup {order_id}")
        return {"status": "error", "content": [{"text": f"no order {order_id}"}]}

    script = Script(
        ((ScriptedCall("refund_order", {"order_id": "A1"}), ScriptedCall("lookup_order", {"order_id": "A1"})), "."),
        name="raises",
    )
    hooks = [ReplaySafeHooks(sql_ledger, thread_id=THREAD)]
    first = build(script, [refund_order, lookup_order], hooks=hooks)
    first("Refund A1")
    assert [result["status"] for result in results(first)] == ["error", "error"]
    message = tracking_id(script, 0)
    _, call_ids = script.ids("bedrock", 0)
    assert all(sql_ledger.get(CallKey(THREAD, message, call_id)) is None for call_id in call_ids)

    resumed = build(script, [refund_order, lookup_order], hooks=[ReplaySafeHooks(sql_ledger, thread_id=THREAD)])
    resumed.messages = pending_turn(first)
    resumed()
    assert sorted(attempts) == ["A1", "A1", "lookup A1", "lookup A1"]
    assert [result["status"] for result in results(resumed)] == ["success", "error"]
    record = sql_ledger.get(CallKey(THREAD, message, call_ids[0]))
    assert record is not None
    assert record.status is Status.COMPLETED


def test_a_failure_recorded_under_record_errors_replays_to_the_model(ledger: Ledger) -> None:
    """With ``record_errors=True`` the failure is the call's outcome: the resume hands the model the same error
    text without running the tool again."""
    attempts: list[str] = []

    @tool
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        attempts.append(order_id)
        raise ConnectionError("card network down") if order_id == "A1" else ValueError("no such order")

    calls = (ScriptedCall("refund_order", {"order_id": "A1"}), ScriptedCall("refund_order", {"order_id": "Z9"}))
    script = Script((calls, "Could not refund."), name="recorded")
    first = build(script, [refund_order], hooks=[ReplaySafeHooks(ledger, thread_id=THREAD, record_errors=True)])
    first("Refund A1")
    hooks = [ReplaySafeHooks(ledger, thread_id=THREAD, record_errors=True)]
    resumed = build(script, [refund_order], hooks=hooks, messages=pending_turn(first))
    resumed()
    assert sorted(attempts) == ["A1", "Z9"]
    assert results(resumed) == results(first)
    texts = [result["content"] for result in results(first)]
    assert texts == [[{"text": "Error: ConnectionError - card network down"}], [{"text": "Error: no such order"}]]


def test_replaysafe_errors_end_the_run_and_never_reach_the_model(ledger: Ledger) -> None:
    """A replay whose arguments were edited raises ReplayMismatchError out of the agent call, as itself (also an
    EventLoopException, which Strands lets through unwrapped), instead of an error result the model reads."""
    effects: list[str] = []
    refund_order, _ = effect_tools(effects)
    script = Script(((ScriptedCall("refund_order", {"order_id": "A1"}),), "Refunded."), name="mismatch")
    first = build(script, [refund_order], hooks=[ReplaySafeHooks(ledger, thread_id=THREAD)])
    first("Refund A1")
    edited = pending_turn(first)
    edited[-1]["content"][0]["toolUse"]["input"] = {"order_id": "Z9"}
    resumed = build(script, [refund_order], hooks=[ReplaySafeHooks(ledger, thread_id=THREAD)], messages=edited)
    with pytest.raises(ReplayMismatchError) as raised:
        resumed()
    assert isinstance(raised.value, EventLoopException)
    assert "refund_order" in str(raised.value)
    assert "Z9" not in str(raised.value)  # the error names the call, never its arguments
    assert effects == ["refund A1"]
    assert not any("toolResult" in block for message in resumed.messages for block in message["content"])


def caught(run: Callable[[], object]) -> list[str]:
    """The UnprotectedCallWarnings ``run`` raised, each said (the core says one once per tool)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in said if issubclass(w.category, UnprotectedCallWarning)]


def test_a_missing_thread_id_is_said_once_per_tool(sql_ledger: Ledger) -> None:
    """An agent with no session manager and no thread id runs its tools unprotected, with one warning per tool
    that names the missing id and what to do."""
    effects: list[str] = []
    tools = effect_tools(effects)
    script = Script(
        (
            (ScriptedCall("refund_order", {"order_id": "A1"}),),
            (ScriptedCall("refund_order", {"order_id": "B2"}), ScriptedCall("send_email", {"to": "ana@example.com"})),
            "Done.",
        ),
        name="no-thread",
    )
    agent = build(script, tools, hooks=[ReplaySafeHooks(sql_ledger)])
    said = caught(lambda: agent("Refund A1 and B2"))
    assert sorted(effects) == ["email ana@example.com", "refund A1", "refund B2"]
    assert len(said) == 2, said  # refund_order twice, send_email once: one warning each
    assert all("thread_id is empty" in text and "session manager" in text for text in said), said
    assert list(sql_ledger.records()) == []


def test_the_thread_id_can_come_with_the_invocation(ledger: Ledger) -> None:
    """An agent without a session manager keys its calls by ``invocation_state["thread_id"]``."""
    effects: list[str] = []
    refund_order, _ = effect_tools(effects)
    script = Script(((ScriptedCall("refund_order", {"order_id": "A1"}),), "Refunded."), name="invocation")
    agent = build(script, [refund_order], hooks=[ReplaySafeHooks(ledger)])
    assert caught(lambda: agent("Refund A1", invocation_state={"thread_id": "ticket-7"})) == []
    _, (call_id,) = script.ids("bedrock", 0)
    record = ledger.get(CallKey("ticket-7", tracking_id(script, 0), call_id))
    assert record is not None
    assert record.status is Status.COMPLETED


def test_a_direct_tool_call_has_no_message_id_and_is_said_once(ledger: Ledger) -> None:
    """``agent.tool.<name>(...)`` mints a new toolUseId on every call and belongs to no assistant message."""
    effects: list[str] = []
    refund_order, _ = effect_tools(effects)
    agent = build(Script(("-",)), [refund_order], hooks=[ReplaySafeHooks(ledger, thread_id=THREAD)])

    def twice() -> None:
        agent.tool.refund_order(order_id="A1", record_direct_tool_call=False)
        agent.tool.refund_order(order_id="A1", record_direct_tool_call=False)

    said = caught(twice)
    assert effects == ["refund A1", "refund A1"]
    assert len(said) == 1, said
    assert "message_id is empty" in said[0]
    assert 'key="args"' in said[0]


@pytest.mark.parametrize("protect", [True, False], ids=["with-hooks", "control"])
def test_a_step_before_an_interrupt_runs_once_across_the_pause_and_resume(
    tmp_path: Path, ledger: Ledger, protect: bool
) -> None:
    """A tool charges (a ``@replay_safe`` step), then asks a human with ``tool_context.interrupt``. Resumed in a
    new agent from the session with the human's answer, Strands runs the tool again from its top: the call was
    kept paused, so the charge replays. Without the hooks it charges twice."""
    charges: list[str] = []

    @replay_safe
    def charge(order_id: str) -> str:
        charges.append(order_id)
        return f"ch_{order_id}"

    @tool(context=True)
    def refund_order(order_id: str, tool_context: ToolContext) -> str:
        """Charge the restocking fee, then refund once a human approves."""
        fee = charge(order_id)
        answer = tool_context.interrupt("approve-refund", reason="refund order A1?")
        return f"{fee}, refund {answer}"

    script = Script(((ScriptedCall("refund_order", {"order_id": "A1"}),), "Refunded."), name="interrupt")

    def agent() -> Agent:
        session = FileSessionManager(session_id="order-A1", storage_dir=str(tmp_path / "sessions"))
        return build(script, [refund_order], hooks=[ReplaySafeHooks(ledger)] if protect else [], session=session)

    def run() -> None:
        paused = agent()("Refund A1")
        assert paused.stop_reason == "interrupt"
        assert paused.interrupts is not None
        (interrupt,) = paused.interrupts
        response: list[Any] = [{"interruptResponse": {"interruptId": interrupt.id, "response": "approved"}}]
        done = agent()(response)  # a new agent: restored from the session, interrupt state included
        assert str(done).strip() == "Refunded."

    if protect:
        run()
        assert charges == ["A1"]
        _, (call_id,) = script.ids("bedrock", 0)
        record = ledger.get(CallKey("order-A1/default", tracking_id(script, 0), call_id))
        assert record is not None
        assert record.status is Status.COMPLETED
    else:
        assert caught(run)  # the step has no call to belong to: unprotected, said
        assert charges == ["A1", "A1"]


#: Where the first process of the crash test below dies: the interrupt raised and saved in the session.
INTERRUPTED = "waiting-for-an-approval"


def interrupt_child(ledger_path: str, sessions_dir: str, effects_path: str, protect: bool) -> str:
    """One process of the refund of the test above, its session a ``FileSessionManager`` under ``sessions_dir``.

    With no interrupt noted yet it asks for the refund: the tool charges (a ``@replay_safe`` step, a line appended
    to ``effects_path`` each time it runs) and interrupts for a human; Strands saves the interrupt in the session,
    the process notes its id (as an app shows the question) and is SIGKILLed (``kill_point``) before anyone
    answers. Otherwise it answers the interrupt on a new agent restored from the session and returns the answer.
    ``protect=False`` is the same agent without the hooks.
    """
    effects, noted = Path(effects_path), Path(sessions_dir) / "interrupt-id.txt"

    @replay_safe
    def charge(order_id: str) -> str:
        with effects.open("a") as file:
            file.write(f"{order_id}\n")
        return f"ch_{order_id}"

    @tool(context=True)
    def refund_order(order_id: str, tool_context: ToolContext) -> str:
        """Charge the restocking fee, then refund once a human approves."""
        fee = charge(order_id)
        answer = tool_context.interrupt("approve-refund", reason="refund order A1?")
        return f"{fee}, refund {answer}"

    script = Script(((ScriptedCall("refund_order", {"order_id": "A1"}),), "Refunded."), name="interrupt-crash")
    with SqliteLedger(ledger_path) as ledger:
        session = FileSessionManager(session_id="order-A1", storage_dir=sessions_dir)
        agent = build(script, [refund_order], hooks=[ReplaySafeHooks(ledger)] if protect else [], session=session)
        if not noted.exists():
            paused = agent("Refund A1")
            assert paused.stop_reason == "interrupt"
            assert paused.interrupts is not None
            (interrupt,) = paused.interrupts
            noted.write_text(interrupt.id)
            kill_point(INTERRUPTED)  # SIGKILL: the process dies while the human has not answered
            raise AssertionError("the agent was not killed at the interrupt")
        response: list[Any] = [{"interruptResponse": {"interruptId": noted.read_text(), "response": "approved"}}]
        return str(agent(response)).strip()


@pytest.mark.parametrize("protect", [True, False], ids=["with-hooks", "control"])
def test_a_step_before_an_interrupt_runs_once_across_a_kill_in_the_pause(tmp_path: Path, protect: bool) -> None:
    """The test above across processes: the first charges, interrupts for a human and is SIGKILLed once Strands
    saved the interrupt in its file session; a new process restores the agent from the session and answers.
    Strands runs the tool again from its top: with the hooks the call was kept paused in the ledger file, so the
    charge replays; the control, the same agent without the hooks, charges twice."""
    ledger_path, sessions, effects = tmp_path / "ledger.db", tmp_path / "sessions", tmp_path / "effects.txt"
    sessions.mkdir()
    args = (str(ledger_path), str(sessions), str(effects), protect)
    killed = run_in_child(interrupt_child, *args, kill_at=INTERRUPTED, timeout=60)
    assert killed.killed
    assert effects.read_text().split() == ["A1"]
    assert ("charge ran WITHOUT replay protection" in killed.stderr) is not protect  # the control's step, said
    with SqliteLedger(ledger_path) as ledger:  # what the killed process left: the call paused, its charge recorded
        left = {record.tool_name: record.status for record in ledger.records()}
    assert left == ({"refund_order": Status.PAUSED, "charge": Status.COMPLETED} if protect else {})

    resumed = run_in_child(interrupt_child, *args, timeout=60)
    assert resumed.value == "Refunded."
    assert effects.read_text().split() == (["A1"] if protect else ["A1", "A1"])


class Approvals:
    """A user's approval hook: a refund waits for a human (``event.interrupt`` in ``BeforeToolCallEvent``)."""

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self.ask)

    def ask(self, event: BeforeToolCallEvent) -> None:
        if event.tool_use["name"] == "refund_order" and event.interrupt("approve", reason="refund?") != "yes":
            event.cancel_tool = "the refund was not approved"


def test_an_approval_hook_holds_no_claim_and_the_turn_resumes_once(tmp_path: Path, ledger: Ledger) -> None:
    """An email and a refund in one turn, the refund waiting for approval: the email runs and is recorded, the
    refund is kept paused for a decision (it holds no running claim) while it waits; resumed from the session with
    the approval, the refund runs once and the email is not run again (Strands keeps the turn's finished results
    with the interrupt)."""
    effects: list[str] = []
    tools = effect_tools(effects)
    calls = (ScriptedCall("send_email", {"to": "ana@example.com"}), ScriptedCall("refund_order", {"order_id": "A1"}))
    script = Script((calls, "Done."), name="approval")
    _, (email_id, refund_id) = script.ids("bedrock", 0)
    thread, message = "order-A1/default", tracking_id(script, 0)

    def agent() -> Agent:
        session = FileSessionManager(session_id="order-A1", storage_dir=str(tmp_path / "sessions"))
        return build(script, tools, hooks=[Approvals(), ReplaySafeHooks(ledger)], session=session)

    paused = agent()("Refund A1 and tell Ana")
    assert paused.stop_reason == "interrupt"
    assert effects == ["email ana@example.com"]
    waiting = ledger.get(CallKey(thread, message, refund_id))
    assert waiting is not None
    assert waiting.status is Status.PAUSED
    assert paused.interrupts is not None
    response: list[Any] = [{"interruptResponse": {"interruptId": paused.interrupts[0].id, "response": "yes"}}]
    agent()(response)
    assert effects == ["email ana@example.com", "refund A1"]
    for call_id in (email_id, refund_id):
        record = ledger.get(CallKey(thread, message, call_id))
        assert record is not None
        assert record.status is Status.COMPLETED
