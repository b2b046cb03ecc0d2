"""Approvals: ``HumanInTheLoopMiddleware``'s decisions recorded as replaysafe approvals, bound to the call.

Each case runs a ``create_agent`` agent on a SQLite checkpointer and a ledger in files (PostgreSQL for one
case), with ``ReplaySafeHumanInTheLoopMiddleware`` and ``ReplaySafeMiddleware`` (``adapter``), and the same
agent with LangChain's own ``HumanInTheLoopMiddleware`` and no replaysafe (``control``), which runs what the
human did not approve. The crash case kills a child process with a real SIGKILL inside the approved tool and
resumes the thread in a new one. The human answers as ``HumanInTheLoopMiddleware`` documents:
``Command(resume={"decisions": [...]})`` in ``batched`` mode, ``Command(resume=<decision>)`` in ``per_call``
mode; a call the adapter asks about again is answered the same way.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command, interrupt
from psycopg import sql

import replaysafe
from replaysafe import CallKey, EventKind, Ledger, PostgresLedger, SqliteLedger, Status
from replaysafe.testing import SteppedClock, kill_point, run_in_child
from replaysafe_langgraph import ReplaySafeHumanInTheLoopMiddleware, ReplaySafeMiddleware, replay_safe_tool_node

from _langgraph_fakes import final_answer, scripted, state_graph

THREAD = "approvals-thread"
KEY = CallKey(THREAD, "msg-turn1-tools", "call_1")
APPROVE: dict[str, Any] = {"type": "approve"}
MODES = ["batched", "per_call"]
VARIANTS = ["adapter", "control"]


def append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")


def lines(path: str | Path) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines() if Path(path).exists() else []


def refund_tool(effects: str) -> BaseTool:
    @tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund an order."""
        append(effects, f"refund {order_id} {amount}")
        kill_point("inside")  # killed here: the money moved, the call did not return
        return f"refunded {order_id} {amount}"

    return refund_order


def refund_call(amount: int, message_id: str = "msg-turn1-tools", call_id: str = "call_1") -> AIMessage:
    return AIMessage(
        id=message_id,
        content="",
        tool_calls=[
            {"name": "refund_order", "args": {"order_id": "A1", "amount": amount}, "id": call_id, "type": "tool_call"}
        ],
    )


def middleware(variant: str, mode: str, ledger: Ledger | None, **review: Any) -> list[Any]:
    interrupt_on: dict[str, Any] = {"refund_order": review.pop("interrupt_on", True)}
    if variant == "control":
        return [HumanInTheLoopMiddleware(interrupt_on, interrupt_mode=mode)]
    assert ledger is not None
    return [
        ReplaySafeHumanInTheLoopMiddleware(interrupt_on, ledger=ledger, interrupt_mode=mode, approver="ana", **review),
        ReplaySafeMiddleware(ledger, approver="ana"),
    ]


def answer(mode: str, decision: dict[str, Any]) -> Command[Any]:
    """The human's answer to HumanInTheLoopMiddleware's interrupt, as it documents it."""
    return Command(resume=decision if mode == "per_call" else {"decisions": [decision]})


def outcome(agent: Any, state: Any) -> dict[str, Any]:
    """The tool results and the interrupts the run stopped at."""
    values = state.value if hasattr(state, "value") else state
    results = {m.tool_call_id: m.content for m in values["messages"] if isinstance(m, ToolMessage)}
    return {"results": results, "asked": [i.value for i in state.interrupts]}


def asked_again(value: dict[str, Any]) -> str | None:
    """The reason of an interrupt the adapter raised to ask again (None for HumanInTheLoopMiddleware's own)."""
    if value.get("type") == "tool_approval" and "reason" in value:
        return str(value["reason"])
    return None


class Agent:
    """A create_agent agent with the review middleware, on a SQLite checkpointer in ``folder``."""

    def __init__(
        self,
        folder: Path,
        ledger: Ledger | None,
        *,
        variant: str,
        mode: str,
        replies: list[AIMessage],
        interrupt_before: list[str] | None = None,
        **review: Any,
    ) -> None:
        self.effects = str(folder / "effects.log")
        self.saver_context = SqliteSaver.from_conn_string(str(folder / "checkpoints.db"))
        saver = self.saver_context.__enter__()
        self.graph = create_agent(
            scripted(*replies),
            [refund_tool(self.effects)],
            middleware=middleware(variant, mode, ledger, **review),
            checkpointer=saver,
            interrupt_before=interrupt_before,
        )
        self.config: Any = {"configurable": {"thread_id": THREAD}}

    def close(self) -> None:
        self.saver_context.__exit__(None, None, None)

    def invoke(self, inputs: Any) -> dict[str, Any]:
        state = self.graph.invoke(inputs, self.config, version="v2", durability="sync")
        return outcome(self.graph, state)

    def ask(self) -> dict[str, Any]:
        return self.invoke({"messages": [HumanMessage("Refund order A1", id="human-turn1")]})


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Any]:
    """Builds agents in ``tmp_path`` and closes them."""
    built: list[Agent] = []

    def make(ledger: Ledger | None, **options: Any) -> Agent:
        built.append(Agent(tmp_path, ledger, **options))
        return built[-1]

    yield make
    for agent in built:
        agent.close()


@pytest.fixture
def events(replaysafe_events: list[replaysafe.Event]) -> list[replaysafe.Event]:
    return replaysafe_events


def approval_events(seen: list[replaysafe.Event]) -> list[tuple[str, str | None]]:
    kinds = {EventKind.APPROVAL_REQUESTED, EventKind.APPROVED, EventKind.REJECTED, EventKind.APPROVAL_REFUSED}
    return [
        (str(e.kind.value), e.reason if e.kind is EventKind.APPROVAL_REFUSED else e.approver)
        for e in seen
        if e.kind in kinds
    ]


# --- a. approved, then killed inside the tool: asked again, never run twice on one approval -------------


def crash_run(folder: str, ledger_path: str, variant: str, mode: str, phase: str) -> dict[str, Any]:
    """One process of the crash case: ``ask``, ``approve`` (killed inside the tool), ``resume`` (invoke(None)),
    ``approve-again`` (the human answers what the resumed run asked) or ``reject-again`` (the human, told
    it may have run, finds the refund at the provider)."""
    replies = [refund_call(30), final_answer(1)] if phase == "ask" else [final_answer(1)]
    with SqliteLedger(ledger_path) as ledger:
        agent = Agent(
            Path(folder), ledger if variant == "adapter" else None, variant=variant, mode=mode, replies=replies
        )
        try:
            if phase == "ask":
                return agent.ask()
            if phase in ("approve", "approve-again"):
                return agent.invoke(answer(mode, APPROVE))
            if phase == "reject-again":  # the adapter's own question: one decision, whatever the mode
                return agent.invoke(Command(resume={"type": "reject", "message": "already refunded"}))
            return agent.invoke(None)
        finally:
            agent.close()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_approved_then_killed_inside_the_tool_asks_again_instead_of_running_twice(
    tmp_path: Path, variant: str, mode: str
) -> None:
    """SIGKILL inside the approved refund, after the money moved; a new process resumes the thread.

    With the adapter the resume runs nothing and asks the human again, saying the first attempt may have
    taken effect (with the idempotency key to look it up by). The control runs the refund again, on the
    answer LangGraph kept."""
    files = (str(tmp_path), str(tmp_path / "ledger.db"), variant, mode)
    effects = tmp_path / "effects.log"
    asked = run_in_child(crash_run, *files, "ask").value
    assert [v.get("args") or v["action_requests"][0]["args"] for v in asked["asked"]] == [
        {"order_id": "A1", "amount": 30}
    ]
    assert run_in_child(crash_run, *files, "approve", kill_at="inside").killed
    assert lines(effects) == ["refund A1 30"]

    resumed = run_in_child(crash_run, *files, "resume").value
    if variant == "adapter":
        assert lines(effects) == ["refund A1 30"], resumed  # nothing ran on the spent approval
        [value] = resumed["asked"]
        assert asked_again(value) == "may_have_run"
        assert value["may_have_run"] is True
        assert value["idempotency_key"]
        with SqliteLedger(tmp_path / "ledger.db") as ledger:
            record = ledger.get(KEY)
        assert record is not None
        assert record.status is Status.PAUSED
        settled = run_in_child(crash_run, *files, "reject-again").value
        assert lines(effects) == ["refund A1 30"]
        assert settled["results"] == {
            "call_1": "User rejected the tool call for `refund_order` with reason: already refunded"
        }
        return
    if resumed["asked"]:  # LangGraph lost the answer with the killed task: the same question again
        [value] = resumed["asked"]
        assert asked_again(value) is None
        assert lines(effects) == ["refund A1 30"]
        run_in_child(crash_run, *files, "approve-again")
    assert lines(effects) == ["refund A1 30", "refund A1 30"]


# --- b. approved, then asked with other arguments: refused, asked again -------------------------------


def replace_call(agent: Agent, message: AIMessage, *, as_node: str | None = None) -> None:
    """The call the model planned changes (a re-plan, an edit of the thread): its AIMessage is replaced."""
    state = agent.graph.get_state(agent.config)
    old = next(m for m in reversed(state.values["messages"]) if isinstance(m, AIMessage))
    update: list[Any] = [message] if old.id == message.id else [RemoveMessage(id=old.id), message]
    agent.graph.update_state(agent.config, {"messages": update}, as_node=as_node)


@pytest.mark.parametrize("variant", VARIANTS)
def test_batched_approved_then_the_call_changes_arguments_is_refused(
    agents: Any, tmp_path: Path, variant: str, events: list[replaysafe.Event]
) -> None:
    """Approved for 30; before the tools step the call asks for 82000 under the same ids: nothing runs, the
    human is asked about 82000. The control refunds 82000, which nobody approved."""
    with SqliteLedger(tmp_path / "ledger.db") as ledger:
        agent = agents(
            ledger, variant=variant, mode="batched", replies=[refund_call(30), final_answer(1)],
            interrupt_before=["tools"],
        )  # fmt: skip
        agent.ask()
        agent.invoke(answer("batched", APPROVE))  # decided; stops before the tools step
        node = "ReplaySafeHumanInTheLoopMiddleware" if variant == "adapter" else "HumanInTheLoopMiddleware"
        replace_call(agent, refund_call(82000), as_node=f"{node}.after_model")
        resumed = agent.invoke(None)
        if variant == "control":
            assert lines(agent.effects) == ["refund A1 82000"]
            return
        assert lines(agent.effects) == []
        [value] = resumed["asked"]
        assert (asked_again(value), value["args"]) == ("mismatch", {"order_id": "A1", "amount": 82000})
        assert ("approval_refused", "mismatch") in approval_events(events)
        # The human, shown 82000, approves 500 instead: the edit runs, once.
        edit = {"type": "edit", "edited_action": {"name": "refund_order", "args": {"order_id": "A1", "amount": 500}}}
        done = agent.invoke(Command(resume=edit))
        assert lines(agent.effects) == ["refund A1 500"]
        assert done["results"] == {"call_1": "refunded A1 500"}


# --- c. approved with an edit: the edit runs, once -------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_approved_with_an_edit_runs_the_edit_once_and_binds_it(
    agents: Any, tmp_path: Path, mode: str, events: list[replaysafe.Event]
) -> None:
    """The reviewer edits 30 into 25: 25 runs, once, on an approval recorded with the edit; running the tools
    step again from its checkpoint replays it."""
    with SqliteLedger(tmp_path / "ledger.db") as ledger:
        agent = agents(
            ledger, variant="adapter", mode=mode, replies=[refund_call(30), final_answer(1), final_answer(2)]
        )
        agent.ask()
        edit = {"type": "edit", "edited_action": {"name": "refund_order", "args": {"order_id": "A1", "amount": 25}}}
        agent.invoke(answer(mode, edit))
        assert lines(agent.effects) == ["refund A1 25"]
        assert approval_events(events) == [("approval_requested", None), ("approved", "ana")]
        record = ledger.get(KEY)
        assert record is not None
        assert record.status is Status.COMPLETED
        if mode == "batched":  # the tools step again, from the checkpoint taken after the review
            before_tools = next(s.config for s in agent.graph.get_state_history(agent.config) if "tools" in s.next)
            agent.graph.invoke(None, before_tools, version="v2")
            assert lines(agent.effects) == ["refund A1 25"]


# --- d. an expired approval: refused, asked again ---------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_approval_that_expired_before_the_tool_ran_is_refused(
    agents: Any, tmp_path: Path, variant: str, events: list[replaysafe.Event]
) -> None:
    """Approved for 60 seconds; the tools step runs 61 seconds later: nothing runs, the human is asked again.
    (In per_call mode the decision and the run are one step: an approval there is spent as it is given.)"""
    with SteppedClock() as clock, SqliteLedger(tmp_path / "ledger.db") as ledger:
        agent = agents(
            ledger, variant=variant, mode="batched", replies=[refund_call(30), final_answer(1)],
            interrupt_before=["tools"], **({"expires_in": 60} if variant == "adapter" else {}),
        )  # fmt: skip
        agent.ask()
        agent.invoke(answer("batched", APPROVE))
        clock.advance(61)
        resumed = agent.invoke(None)
        if variant == "control":
            assert lines(agent.effects) == ["refund A1 30"]
            return
        assert lines(agent.effects) == []
        [value] = resumed["asked"]
        assert asked_again(value) == "expired"
        assert ("approval_refused", "expired") in approval_events(events)
        agent.invoke(Command(resume=APPROVE))  # approved again, in time: runs once
        assert lines(agent.effects) == ["refund A1 30"]


# --- e. rejected: never runs ------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_rejected_call_never_runs_even_when_the_review_is_skipped_later(
    agents: Any, tmp_path: Path, variant: str
) -> None:
    """Rejected; then the thread is run again from the checkpoint before the review, under a policy that no
    longer reviews refunds (HumanInTheLoopMiddleware's `when` now says no): the control refunds; with the
    adapter the ledger holds the rejection and the model gets the rejection again."""
    review = {"on": True}
    policy = {"allowed_decisions": ["approve", "edit", "reject"], "when": lambda request: review["on"]}
    with SqliteLedger(tmp_path / "ledger.db") as ledger:
        agent = agents(
            ledger, variant=variant, mode="batched", interrupt_on=policy,
            replies=[refund_call(30), final_answer(1), final_answer(2)],
        )  # fmt: skip
        agent.ask()
        rejected = agent.invoke(answer("batched", {"type": "reject", "message": "not this one"}))
        assert lines(agent.effects) == []
        assert "not this one" in rejected["results"]["call_1"]
        if variant == "adapter":
            record = ledger.get(KEY)
            assert record is not None
            assert record.status is Status.PAUSED
        review["on"] = False
        before_review = [
            s.config
            for s in agent.graph.get_state_history(agent.config)
            if any(node.endswith(".after_model") for node in s.next)
        ][-1]  # turn 1's (the history is newest first)
        again = outcome(agent.graph, agent.graph.invoke(None, before_review, version="v2"))
        if variant == "control":
            assert lines(agent.effects) == ["refund A1 30"]
            return
        assert lines(agent.effects) == []
        assert again["results"]["call_1"] == "User rejected the tool call for `refund_order` with reason: not this one"


# --- f. an approval is not reused by another call with the same arguments -----------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_answer_is_not_reused_by_a_second_call_with_the_same_arguments(
    agents: Any, tmp_path: Path, variant: str
) -> None:
    """The human approves call_1 of message 1; before the tools step the thread holds the same refund planned
    again, as a new message with new ids (a re-plan, an edit of the thread). The control refunds on the
    review of the first call. With the adapter the approval stays with call_1: the new call is asked for on
    its own, and runs once approved."""
    second = refund_call(30, message_id="msg-turn1-replanned", call_id="call_9")
    with SqliteLedger(tmp_path / "ledger.db") as ledger:
        agent = agents(
            ledger, variant=variant, mode="batched", replies=[refund_call(30), final_answer(1)],
            interrupt_before=["tools"],
        )  # fmt: skip
        agent.ask()
        agent.invoke(answer("batched", APPROVE))  # approved call_1; stops before the tools step
        node = "ReplaySafeHumanInTheLoopMiddleware" if variant == "adapter" else "HumanInTheLoopMiddleware"
        replace_call(agent, second, as_node=f"{node}.after_model")
        resumed = agent.invoke(None)
        if variant == "control":
            assert lines(agent.effects) == ["refund A1 30"]
            return
        assert lines(agent.effects) == []
        [value] = resumed["asked"]
        assert (asked_again(value), value["tool_call_id"]) == ("required", "call_9")
        agent.invoke(Command(resume=APPROVE))
        assert lines(agent.effects) == ["refund A1 30"]
        record = ledger.get(CallKey(THREAD, "msg-turn1-replanned", "call_9"))
        assert record is not None
        assert record.status is Status.COMPLETED


# --- PostgreSQL -------------------------------------------------------------------------------------------


@pytest.fixture
def postgres_ledger() -> Iterator[PostgresLedger]:
    schema = f"rs_lg_approvals_{uuid.uuid4().hex[:12]}"
    url = os.environ.get("REPLAYSAFE_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")
    ledger = PostgresLedger(url, schema=schema)
    try:
        yield ledger
    finally:
        ledger.close()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_on_postgres_an_approval_binds_and_is_spent_once(
    agents: Any, postgres_ledger: PostgresLedger, events: list[replaysafe.Event]
) -> None:
    """The batched flow on a PostgreSQL ledger: approved for 30, asked with 82000: refused and asked again;
    approved then: 82000 runs, once, and a second run of the tools step replays it."""
    agent = agents(
        postgres_ledger, variant="adapter", mode="batched", replies=[refund_call(30), final_answer(1), final_answer(2)],
        interrupt_before=["tools"],
    )  # fmt: skip
    agent.ask()
    agent.invoke(answer("batched", APPROVE))
    replace_call(agent, refund_call(82000), as_node="ReplaySafeHumanInTheLoopMiddleware.after_model")
    [value] = agent.invoke(None)["asked"]
    assert asked_again(value) == "mismatch"
    assert lines(agent.effects) == []
    agent.invoke(Command(resume=APPROVE))
    assert lines(agent.effects) == ["refund A1 82000"]
    record = postgres_ledger.get(KEY)
    assert record is not None
    assert record.status is Status.COMPLETED
    decided = approval_events(events)
    assert decided[:3] == [("approval_requested", None), ("approved", "ana"), ("approval_refused", "mismatch")]
    assert decided[-1] == ("approved", "ana")


@pytest.mark.parametrize("mode", MODES)
async def test_async_the_approval_binds_the_arguments_and_asks_again(tmp_path: Path, mode: str) -> None:
    """Under ainvoke (InMemorySaver): approved for 30, asked with 82000 after the review: asked again, nothing
    runs; the human's approval of 82000 then runs it, once."""
    effects = str(tmp_path / "effects.log")
    with SqliteLedger(tmp_path / "ledger.db") as ledger:
        agent = create_agent(
            scripted(refund_call(30), final_answer(1)),
            [refund_tool(effects)],
            middleware=middleware("adapter", mode, ledger),
            checkpointer=InMemorySaver(),
            interrupt_before=["tools"] if mode == "batched" else None,
        )
        config: Any = {"configurable": {"thread_id": THREAD}}
        await agent.ainvoke({"messages": [HumanMessage("Refund order A1", id="human-turn1")]}, config, version="v2")
        if mode == "batched":
            await agent.ainvoke(answer(mode, APPROVE), config, version="v2")
            await agent.aupdate_state(
                config, {"messages": [refund_call(82000)]}, as_node="ReplaySafeHumanInTheLoopMiddleware.after_model"
            )
            resumed = await agent.ainvoke(None, config, version="v2")
            assert asked_again(resumed.interrupts[0].value) == "mismatch"
        else:
            await agent.ainvoke(answer(mode, APPROVE), config, version="v2")
            assert lines(effects) == ["refund A1 30"]
            return
        assert lines(effects) == []
        await agent.ainvoke(Command(resume=APPROVE), config, version="v2")
        assert lines(effects) == ["refund A1 82000"]


# --- f. the interceptor's own question: an answer LangGraph keeps is recorded once ------------------------


def reviewed_refund(effects: str) -> BaseTool:
    """``refund_order`` as a ``@replay_safe(needs_approval=True)`` tool: each call runs only on an approval."""

    @replaysafe.replay_safe(needs_approval=True)
    def refund_order(order_id: str, amount: int) -> str:
        """Refund an order."""
        append(effects, f"refund {order_id} {amount}")
        kill_point("inside")
        return f"refunded {order_id} {amount}"

    return tool(refund_order)


def kill_once_decided(event: replaysafe.Event) -> None:
    """SIGKILL right after a decision is written, before the call runs on it."""
    if event.kind in (EventKind.APPROVED, EventKind.REJECTED):
        kill_point("decided")


def tool_node_run(folder: str, ledger_path: str, phase: str, late: float) -> dict[str, Any]:
    """One process of a ``ToolNode`` graph (``replay_safe_tool_node``, approvals for 60 s) whose refund asks for
    an approval: ``ask`` (the interceptor asks with ``interrupt()``), ``approve`` (the human's answer, given
    as ``Command(resume=...)``), ``resume`` (``invoke(None)``), each ``late`` seconds after the first."""
    effects = str(Path(folder) / "effects.log")
    replies = [refund_call(30), final_answer(1)] if phase == "ask" else [final_answer(1)]
    start = datetime.now(timezone.utc) + timedelta(seconds=late)
    unsubscribe = replaysafe.on_event(kill_once_decided)
    try:
        with (
            SteppedClock(start),
            SqliteLedger(ledger_path) as ledger,
            SqliteSaver.from_conn_string(str(Path(folder) / "checkpoints.db")) as saver,
        ):
            node = replay_safe_tool_node(
                [reviewed_refund(effects)], ledger=ledger, approver="ana", approval_expires_in=60
            )
            graph = state_graph(scripted(*replies), node, saver)
            config: Any = {"configurable": {"thread_id": THREAD}}
            inputs: Any = {
                "ask": {"messages": [HumanMessage("Refund order A1", id="human-turn1")]},
                "approve": Command(resume=APPROVE),
                "approve-again": Command(resume=APPROVE),
            }.get(phase)
            return outcome(graph, graph.invoke(inputs, config, version="v2", durability="sync"))
    finally:
        unsubscribe()


def test_tool_node_an_answer_langgraph_hands_back_after_a_crash_is_not_recorded_again(tmp_path: Path) -> None:
    """The interceptor asks for the refund's approval with ``interrupt()``; the human approves (for 60 s) and
    the process is killed once the approval is written. The thread is resumed 120 s later: LangGraph hands the
    same answer back to the interceptor's question, and the approval it made has expired. Nothing runs: the
    interceptor asks again (``expired``) instead of recording that answer as a new approval; a new answer runs
    the refund, once."""
    files = (str(tmp_path), str(tmp_path / "ledger.db"))
    effects = tmp_path / "effects.log"
    asked = run_in_child(tool_node_run, *files, "ask", 0.0).value
    [value] = asked["asked"]
    assert (asked_again(value), value["args"]) == ("required", {"order_id": "A1", "amount": 30})
    assert run_in_child(tool_node_run, *files, "approve", 0.0, kill_at="decided").killed
    assert lines(effects) == []

    resumed = run_in_child(tool_node_run, *files, "resume", 120.0).value
    assert lines(effects) == [], resumed  # the expired approval did not run
    [value] = resumed["asked"]
    assert asked_again(value) == "expired"
    done = run_in_child(tool_node_run, *files, "approve-again", 130.0).value
    assert lines(effects) == ["refund A1 30"]
    assert done["results"] == {"call_1": "refunded A1 30"}


def test_tool_node_with_several_calls_takes_an_answer_only_for_the_call_it_names(
    tmp_path: Path, events: list[replaysafe.Event]
) -> None:
    """One message, two refunds in one ``ToolNode`` task, each asking for its approval with ``interrupt()``.
    LangGraph hands a task's answers back by their order alone, and the order shifts once a call replays: an
    answer that names no call is not taken (it could be another call's), and one that names a call is taken
    for it alone. Without the names, the rejection of B2 9000 came after the approval of A1 30 and the approval
    was handed to B2, which ran."""
    effects = str(tmp_path / "effects.log")
    message = AIMessage(
        id="msg-turn1-tools",
        content="",
        tool_calls=[
            {"name": "refund_order", "args": {"order_id": "A1", "amount": 30}, "id": "call_1", "type": "tool_call"},
            {"name": "refund_order", "args": {"order_id": "B2", "amount": 9000}, "id": "call_2", "type": "tool_call"},
        ],
    )
    with (
        SqliteLedger(tmp_path / "ledger.db") as ledger,
        SqliteSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as saver,
    ):
        node = replay_safe_tool_node([reviewed_refund(effects)], ledger=ledger, approver="ana")
        graph = state_graph(scripted(message, final_answer(1)), node, saver)
        # The calls one after another, so each run asks in the same order: side by side, an answer may reach the
        # other call's question first, which does not take it and asks again (nothing runs on it either way).
        config: Any = {"configurable": {"thread_id": THREAD}, "max_concurrency": 1}

        def run(inputs: Any) -> dict[str, Any]:
            return outcome(graph, graph.invoke(inputs, config, version="v2", durability="sync"))

        asked = run({"messages": [HumanMessage("Refund both", id="human-turn1")]})["asked"]
        assert asked
        assert all(value["name_the_call"] for value in asked)
        assert "name this one in your answer" in asked[0]["description"]
        run(Command(resume=APPROVE))  # names no call: not taken for either
        assert lines(effects) == []
        assert approval_events(events) == [("approval_requested", None)] * 2
        run(Command(resume={**APPROVE, "tool_call_id": "call_1"}))
        assert lines(effects) == ["refund A1 30"]
        done = run(Command(resume={"type": "reject", "message": "B2 9000 is fraud", "tool_call_id": "call_2"}))
        assert lines(effects) == ["refund A1 30"]
        assert done["results"] == {
            "call_1": "refunded A1 30",
            "call_2": "User rejected the tool call for `refund_order` with reason: B2 9000 is fraud",
        }


def test_tool_node_an_answer_the_call_raised_on_does_not_run_it_again_when_the_task_is_retried(
    tmp_path: Path, events: list[replaysafe.Event]
) -> None:
    """The human approves the refund once; it refunds, then raises (the provider timed out). ``invoke(None)``
    retries the task, and LangGraph hands the answer it kept to the interceptor twice: to the first question
    (the answer the call ran on, decided once) and to the one the call now asks (its approval spent, it may have
    run). Neither runs it: the human is asked, and an approval that names the attempt shown runs it once more."""
    effects = str(tmp_path / "effects.log")

    @replaysafe.replay_safe(needs_approval=True)
    def refund_order(order_id: str, amount: int) -> str:
        """Refund an order."""
        append(effects, f"refund {order_id} {amount}")
        if len(lines(effects)) == 1:
            raise TimeoutError("the provider timed out")
        return f"refunded {order_id} {amount}"

    with (
        SqliteLedger(tmp_path / "ledger.db") as ledger,
        SqliteSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as saver,
    ):
        node = replay_safe_tool_node([tool(refund_order)], ledger=ledger, approver="ana")
        graph = state_graph(scripted(refund_call(30), final_answer(1)), node, saver)
        config: Any = {"configurable": {"thread_id": THREAD}}

        def run(inputs: Any) -> dict[str, Any]:
            return outcome(graph, graph.invoke(inputs, config, version="v2", durability="sync"))

        [value] = run({"messages": [HumanMessage("Refund order A1", id="human-turn1")]})["asked"]
        assert asked_again(value) == "required"
        with pytest.raises(TimeoutError):
            run(Command(resume=APPROVE))
        assert lines(effects) == ["refund A1 30"]
        [value] = run(None)["asked"]  # the task retried: the answer LangGraph kept does not run it again
        assert lines(effects) == ["refund A1 30"]
        assert (asked_again(value), value["may_have_run"]) == ("may_have_run", True)
        paused = ledger.get(KEY)
        assert paused is not None
        assert value["attempt"] == paused.attempt
        assert '"attempt": ' in value["description"]
        [value] = run(Command(resume=APPROVE))["asked"]  # names no attempt: not taken
        assert lines(effects) == ["refund A1 30"]
        done = run(Command(resume={**APPROVE, "attempt": value["attempt"]}))
        assert lines(effects) == ["refund A1 30", "refund A1 30"]
        assert done["results"] == {"call_1": "refunded A1 30"}
    assert [kind for kind, _ in approval_events(events)].count("approved") == 2


def test_a_reviewed_tool_that_calls_interrupt_itself_stops_the_run_saying_so(tmp_path: Path) -> None:
    """The tool's pause spends its approval; on the answer to the tool's own question the adapter asks for a new
    approval, and LangGraph hands it that answer (by its order in the task). The run stops with a ValueError that
    names the cause and the way out; nothing runs."""
    effects = tmp_path / "effects.log"

    @tool
    def ship_replacement(order_id: str) -> str:
        """Ship a replacement."""
        warehouse = interrupt({"question": "which warehouse?"})
        append(str(effects), f"ship {order_id} from {warehouse}")
        return "shipped"

    message = AIMessage(
        id="msg-turn1-tools",
        content="",
        tool_calls=[{"name": "ship_replacement", "args": {"order_id": "A1"}, "id": "call_1", "type": "tool_call"}],
    )
    with (
        SqliteLedger(tmp_path / "ledger.db") as ledger,
        SqliteSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as saver,
    ):
        review = ReplaySafeHumanInTheLoopMiddleware({"ship_replacement": True}, ledger=ledger, approver="ana")
        graph = create_agent(
            scripted(message, final_answer(1)),
            [ship_replacement],
            middleware=[review, ReplaySafeMiddleware(ledger, approver="ana")],
            checkpointer=saver,
        )
        config: Any = {"configurable": {"thread_id": THREAD}}
        graph.invoke({"messages": [HumanMessage("Ship A1", id="human-turn1")]}, config, version="v2")
        paused = graph.invoke(Command(resume={"decisions": [APPROVE]}), config, version="v2")
        assert [i.value for i in paused.interrupts] == [{"question": "which warehouse?"}]
        with pytest.raises(ValueError, match=r"must not call interrupt\(\) itself"):
            graph.invoke(Command(resume="warehouse-7"), config, version="v2")
    assert lines(effects) == []
