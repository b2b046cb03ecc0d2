"""The adapter inside one process: real LangGraph graphs and create_agent agents, offline test models."""

from __future__ import annotations

import asyncio
import operator
import time
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from replaysafe import (
    CallInfo,
    CallKey,
    MissingCallIdError,
    ReplayMismatchError,
    SqliteLedger,
    Status,
    ToolTimeoutError,
    UnprotectedCallWarning,
    current_call,
    replay_safe,
    set_default_timeouts,
)
from replaysafe.testing import reset
from replaysafe_langgraph import ReplaySafeMiddleware, ai_message_digest, replay_safe_tool_node

from _langgraph_fakes import (
    abefore_tools,
    agent_graph,
    ask,
    before_tools,
    config,
    final_answer,
    refund_and_email,
    scripted,
    state_graph,
    tool_call_message,
)

GRAPHS = ["toolnode", "agent"]


def make_tools(effects: list[str], *, asynchronous: bool = False) -> list[BaseTool]:
    """``refund_order`` and ``send_email``, undecorated; each appends to ``effects`` when it acts."""
    if asynchronous:

        async def refund_order(order_id: str) -> str:
            """Refund an order."""
            effects.append(f"refund_order {order_id}")
            return f"refunded {order_id}"

        async def send_email(to: str) -> str:
            """Email the customer."""
            effects.append(f"send_email {to}")
            return f"sent to {to}"

    else:

        def refund_order(order_id: str) -> str:
            """Refund an order."""
            effects.append(f"refund_order {order_id}")
            return f"refunded {order_id}"

        def send_email(to: str) -> str:
            """Email the customer."""
            effects.append(f"send_email {to}")
            return f"sent to {to}"

    return [tool(refund_order), tool(send_email)]


def build(graph: str, model: Any, tools: list[BaseTool], ledger: SqliteLedger | None, **options: Any) -> Any:
    """A checkpointed graph of either kind; ``ledger=None`` builds it without the adapter."""
    if graph == "toolnode":
        node = ToolNode(tools) if ledger is None else replay_safe_tool_node(tools, ledger=ledger, **options)
        return state_graph(model, node, InMemorySaver())
    middleware = [] if ledger is None else [ReplaySafeMiddleware(ledger, **options)]
    return agent_graph(model, tools, middleware, InMemorySaver())


def tool_results(messages: list[AnyMessage]) -> dict[str, Any]:
    return {m.tool_call_id: m.content for m in messages if isinstance(m, ToolMessage)}


# --- replay and new turns -----------------------------------------------------------


@pytest.mark.parametrize("graph", GRAPHS)
def test_new_turn_with_same_tool_call_ids_runs_the_tools(graph: str, ledger: SqliteLedger, thread_id: str) -> None:
    """A new model message with the same call_1/call_2 ids is a new call and runs."""
    effects: list[str] = []
    model = scripted(refund_and_email(1), final_answer(1), refund_and_email(2), final_answer(2))
    agent = build(graph, model, make_tools(effects), ledger)
    agent.invoke(ask(1), config(thread_id))
    out = agent.invoke(ask(2), config(thread_id))
    assert sorted(effects) == ["refund_order A1"] * 2 + ["send_email customer@example.com"] * 2
    assert {(r.key.message_id, r.key.tool_call_id) for r in ledger.records(thread_id=thread_id)} == {
        ("msg-turn1-tools", "call_1"),
        ("msg-turn1-tools", "call_2"),
        ("msg-turn2-tools", "call_1"),
        ("msg-turn2-tools", "call_2"),
    }
    assert [m.id for m in out["messages"] if isinstance(m, AIMessage)] == [
        "msg-turn1-tools",
        "msg-turn1-final",
        "msg-turn2-tools",
        "msg-turn2-final",
    ]


@pytest.mark.parametrize("graph", GRAPHS)
async def test_new_turn_with_same_tool_call_ids_runs_the_tools_async(
    graph: str, ledger: SqliteLedger, thread_id: str
) -> None:
    """Under ainvoke, with async tools, a new model message with the same call ids runs again."""
    effects: list[str] = []
    model = scripted(refund_and_email(1), final_answer(1), refund_and_email(2), final_answer(2))
    agent = build(graph, model, make_tools(effects, asynchronous=True), ledger)
    await agent.ainvoke(ask(1), config(thread_id))
    await agent.ainvoke(ask(2), config(thread_id))
    assert sorted(effects) == ["refund_order A1"] * 2 + ["send_email customer@example.com"] * 2
    assert len(list(ledger.records(thread_id=thread_id))) == 4


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize(("adapter", "runs"), [(True, 1), (False, 2)], ids=["adapter", "no-adapter"])
def test_replaying_a_checkpoint_does_not_run_tools_again(
    graph: str, adapter: bool, runs: int, ledger: SqliteLedger, thread_id: str
) -> None:
    """Re-running the tools step from its checkpoint replays the recorded results (and runs them without it)."""
    effects: list[str] = []
    fork_answer = AIMessage(id="msg-turn1-final-fork", content="done again")
    model = scripted(refund_and_email(1), final_answer(1), fork_answer)
    agent = build(graph, model, make_tools(effects), ledger if adapter else None)
    first = agent.invoke(ask(1), config(thread_id))
    replayed = agent.invoke(None, before_tools(agent, thread_id))
    assert effects.count("refund_order A1") == runs
    assert effects.count("send_email customer@example.com") == runs
    assert tool_results(replayed["messages"]) == tool_results(first["messages"])
    assert tool_results(replayed["messages"]) == {"call_1": "refunded A1", "call_2": "sent to customer@example.com"}


@pytest.mark.parametrize("graph", GRAPHS)
async def test_replaying_a_checkpoint_does_not_run_async_tools_again(
    graph: str, ledger: SqliteLedger, thread_id: str
) -> None:
    """Under ainvoke, re-running the tools step replays the recorded results of async tools."""
    effects: list[str] = []
    model = scripted(refund_and_email(1), final_answer(1), AIMessage(id="msg-turn1-final-fork", content="again"))
    agent = build(graph, model, make_tools(effects, asynchronous=True), ledger)
    first = await agent.ainvoke(ask(1), config(thread_id))
    replayed = await agent.ainvoke(None, await abefore_tools(agent, thread_id))
    assert sorted(effects) == ["refund_order A1", "send_email customer@example.com"]
    assert tool_results(replayed["messages"]) == tool_results(first["messages"])


def test_recorded_tool_message_is_replayed_whole(ledger: SqliteLedger, thread_id: str) -> None:
    """A replayed ToolMessage keeps the tool's artifact and status, not only its text."""
    effects: list[str] = []

    @tool(response_format="content_and_artifact")
    def refund_order(order_id: str) -> tuple[str, dict[str, Any]]:
        """Refund an order."""
        effects.append(f"refund_order {order_id}")
        return f"refunded {order_id}", {"refund_id": "re_123", "amount_cents": 1250}

    model = scripted(
        tool_call_message(1, "refund_order", {"order_id": "A1"}),
        final_answer(1),
        AIMessage(id="msg-turn1-final-fork", content="again"),
    )
    agent = build("toolnode", model, [refund_order], ledger)
    first = agent.invoke(ask(1), config(thread_id))
    replayed = agent.invoke(None, before_tools(agent, thread_id))
    original = next(m for m in first["messages"] if isinstance(m, ToolMessage))
    again = next(m for m in replayed["messages"] if isinstance(m, ToolMessage))
    assert effects == ["refund_order A1"]
    assert (again.content, again.artifact, again.status, again.name, again.tool_call_id) == (
        original.content,
        {"refund_id": "re_123", "amount_cents": 1250},
        "success",
        "refund_order",
        "call_1",
    )


def test_edited_tool_call_on_replay_is_refused(ledger: SqliteLedger, thread_id: str) -> None:
    """A fork that keeps the ids but changes the arguments raises ReplayMismatchError instead of refunding."""
    effects: list[str] = []
    model = scripted(refund_and_email(1), final_answer(1))
    agent = build("toolnode", model, make_tools(effects), ledger)
    agent.invoke(ask(1), config(thread_id))
    fork = agent.update_state(before_tools(agent, thread_id), {"messages": [refund_and_email(1, order_id="B2")]})
    with pytest.raises(ReplayMismatchError, match="refund_order"):
        agent.invoke(None, fork)
    assert effects.count("refund_order A1") == 1
    assert "refund_order B2" not in effects


class RefundState(MessagesState):
    refund_status: str


def test_tool_returning_a_command_is_replayed(ledger: SqliteLedger, thread_id: str) -> None:
    """A Command (state update plus ToolMessage) is recorded and applied again on replay without running."""
    effects: list[str] = []

    @tool
    def refund_order(order_id: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Refund an order."""
        effects.append(f"refund_order {order_id}")
        message = ToolMessage(f"refunded {order_id}", tool_call_id=tool_call_id)
        return Command(update={"refund_status": f"refunded {order_id}", "messages": [message]})

    model = scripted(
        tool_call_message(1, "refund_order", {"order_id": "A1"}),
        final_answer(1),
        AIMessage(id="msg-turn1-final-fork", content="again"),
    )

    def agent_node(state: RefundState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: RefundState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(RefundState)
    builder.add_node("agent", agent_node)
    builder.add_node("tools", replay_safe_tool_node([refund_order], ledger=ledger))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    graph.invoke(ask(1), config(thread_id))
    fork = before_tools(graph, thread_id)
    assert graph.get_state(fork).values.get("refund_status") is None
    replayed = graph.invoke(None, fork)
    assert effects == ["refund_order A1"]
    assert replayed["refund_status"] == "refunded A1"
    assert tool_results(replayed["messages"]) == {"call_1": "refunded A1"}


# --- tools decorated with @replay_safe -------------------------------------------------


@pytest.mark.parametrize("graph", GRAPHS)
def test_decorated_tool_is_keyed_by_the_adapter_and_recorded_once(
    graph: str, ledger: SqliteLedger, thread_id: str
) -> None:
    """A @replay_safe tool gets the graph's ids from the adapter and records its own result, once."""
    seen: list[CallInfo | None] = []

    @tool
    @replay_safe
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        seen.append(current_call())
        return f"refunded {order_id}"

    model = scripted(
        tool_call_message(1, "refund_order", {"order_id": "A1"}),
        final_answer(1),
        AIMessage(id="msg-turn1-final-fork", content="again"),
    )
    agent = build(graph, model, [refund_order], ledger)
    agent.invoke(ask(1), config(thread_id))
    agent.invoke(None, before_tools(agent, thread_id))
    assert len(seen) == 1
    assert seen[0] is not None
    assert seen[0].key == CallKey(thread_id, "msg-turn1-tools", "call_1")
    records = list(ledger.records(thread_id=thread_id))
    assert [(r.tool_name, r.status, r.result) for r in records] == [("refund_order", Status.COMPLETED, '"refunded A1"')]


async def test_decorated_async_tool_is_keyed_by_the_adapter(ledger: SqliteLedger, thread_id: str) -> None:
    """An async @replay_safe tool under ainvoke sees the adapter's key and is replayed, not re-run."""
    seen: list[CallInfo | None] = []

    @tool
    @replay_safe
    async def refund_order(order_id: str) -> str:
        """Refund an order."""
        seen.append(current_call())
        return f"refunded {order_id}"

    model = scripted(
        tool_call_message(1, "refund_order", {"order_id": "A1"}),
        final_answer(1),
        AIMessage(id="msg-turn1-final-fork", content="again"),
    )
    agent = build("toolnode", model, [refund_order], ledger)
    await agent.ainvoke(ask(1), config(thread_id))
    await agent.ainvoke(None, await abefore_tools(agent, thread_id))
    assert [info.key if info else None for info in seen] == [CallKey(thread_id, "msg-turn1-tools", "call_1")]
    assert len(list(ledger.records(thread_id=thread_id))) == 1


async def test_tool_timeout_from_the_run_config(ledger: SqliteLedger, thread_id: str) -> None:
    """configurable tool_timeout bounds a protected call: ToolTimeoutError, and the call is left in doubt."""
    never = asyncio.Event()

    @tool
    async def refund_order(order_id: str) -> str:
        """Refund an order (this one hangs)."""
        await never.wait()
        return f"refunded {order_id}"

    model = scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}))
    agent = build("toolnode", model, [refund_order], ledger)
    run_config = {"configurable": {"thread_id": thread_id, "tool_timeout": 0.05}}
    with pytest.raises(ToolTimeoutError, match="refund_order"):
        await agent.ainvoke(ask(1), run_config)
    record = ledger.get(CallKey(thread_id, "msg-turn1-tools", "call_1"))
    assert record is not None
    assert record.status is Status.IN_DOUBT


@pytest.mark.parametrize("where", ["adapter", "run config"])
def test_none_means_no_timeout(ledger: SqliteLedger, thread_id: str, where: str) -> None:
    """timeout=None on the adapter, or tool_timeout None in the run config, is no timeout: a global
    timeout the tool would pass does not apply. Left out, replaysafe's own (here the global) applies."""
    effects: list[str] = []

    @tool
    def refund_order(order_id: str) -> str:
        """Refund an order (slowly)."""
        time.sleep(0.3)
        effects.append(f"refund_order {order_id}")
        return f"refunded {order_id}"

    set_default_timeouts(tool_timeout=0.1)
    try:
        options = {"timeout": None} if where == "adapter" else {}
        run_config: Any = config(thread_id)
        if where == "run config":
            run_config["configurable"]["tool_timeout"] = None
        model = scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}), final_answer(1))
        build("toolnode", model, [refund_order], ledger, **options).invoke(ask(1), run_config)
        assert effects == ["refund_order A1"]
        # Left out: the global 0.1 s is a hard deadline for the same call in another thread.
        model = scripted(tool_call_message(1, "refund_order", {"order_id": "A2"}), final_answer(1))
        with pytest.raises(ToolTimeoutError, match="refund_order"):
            build("toolnode", model, [refund_order], ledger).invoke(ask(1), config(f"{thread_id}-default"))
    finally:
        reset()


# --- human in the loop ------------------------------------------------------------------


def approval_tools(effects: list[str]) -> list[BaseTool]:
    @tool
    def refund_order(order_id: str) -> str:
        """Refund an order once a person approves it."""
        if interrupt({"approve_refund": order_id}) != "yes":
            return "refund declined"
        effects.append(f"refund_order {order_id}")
        return f"refunded {order_id}"

    return [refund_order]


@pytest.mark.parametrize("graph", GRAPHS)
def test_interrupt_inside_a_tool_keeps_the_call_paused(graph: str, ledger: SqliteLedger, thread_id: str) -> None:
    """interrupt() in a tool keeps the call paused (no claim held); resuming after approval runs the tool once."""
    effects: list[str] = []
    model = scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}), final_answer(1))
    # wait_timeout=0: a claim left behind would fail the resume at once (CallInProgressError).
    agent = build(graph, model, approval_tools(effects), ledger, wait_timeout=0)
    paused = agent.invoke(ask(1), config(thread_id))
    key = CallKey(thread_id, "msg-turn1-tools", "call_1")
    assert [i.value for i in paused["__interrupt__"]] == [{"approve_refund": "A1"}]
    record = ledger.get(key)
    assert record is not None
    assert record.status is Status.PAUSED
    done = agent.invoke(Command(resume="yes"), config(thread_id))
    assert effects == ["refund_order A1"]
    assert tool_results(done["messages"]) == {"call_1": "refunded A1"}
    record = ledger.get(key)
    assert record is not None
    assert (record.status, record.attempt) == (Status.COMPLETED, 2)  # the resume is the call's second execution


@pytest.mark.parametrize("graph", GRAPHS)
async def test_interrupt_inside_a_tool_keeps_the_call_paused_async(
    graph: str, ledger: SqliteLedger, thread_id: str
) -> None:
    """Under ainvoke, interrupt() keeps the call paused; resuming after approval runs the tool once."""
    effects: list[str] = []
    model = scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}), final_answer(1))
    agent = build(graph, model, approval_tools(effects), ledger, wait_timeout=0)
    await agent.ainvoke(ask(1), config(thread_id))
    record = ledger.get(CallKey(thread_id, "msg-turn1-tools", "call_1"))
    assert record is not None
    assert record.status is Status.PAUSED
    await agent.ainvoke(Command(resume="yes"), config(thread_id))
    assert effects == ["refund_order A1"]


def test_human_in_the_loop_middleware_goes_before_replaysafe(ledger: SqliteLedger, thread_id: str) -> None:
    """With HumanInTheLoopMiddleware first, the reviewer's edit is what runs and is recorded, once."""
    effects: list[str] = []
    model = scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}), final_answer(1))
    review = HumanInTheLoopMiddleware(interrupt_on={"refund_order": True}, interrupt_mode="per_call")
    agent = agent_graph(
        model, make_tools(effects), [review, ReplaySafeMiddleware(ledger, wait_timeout=0)], InMemorySaver()
    )
    paused = agent.invoke(ask(1), config(thread_id), version="v2")
    assert ledger.get(CallKey(thread_id, "msg-turn1-tools", "call_1")) is None
    edit = {"type": "edit", "edited_action": {"name": "refund_order", "args": {"order_id": "B2"}}}
    agent.invoke(Command(resume={i.id: edit for i in paused.interrupts}), config(thread_id), version="v2")
    assert effects == ["refund_order B2"]
    record = ledger.get(CallKey(thread_id, "msg-turn1-tools", "call_1"))
    assert record is not None
    assert record.status is Status.COMPLETED


# --- missing ids ---------------------------------------------------------------------------


class RawState(TypedDict):
    """Messages appended as they come: no reducer assigns ids."""

    messages: Annotated[list[AnyMessage], operator.add]


def tools_only_graph(effects: list[str], ledger: SqliteLedger, **options: Any) -> Any:
    builder = StateGraph(RawState)
    builder.add_node("tools", replay_safe_tool_node(make_tools(effects), ledger=ledger, **options))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=InMemorySaver())


def id_less_call() -> dict[str, list[AnyMessage]]:
    message = AIMessage(content="", tool_calls=[{"name": "refund_order", "args": {"order_id": "A1"}, "id": "call_1"}])
    assert message.id is None
    return {"messages": [message]}


def test_message_without_id_runs_unprotected_with_a_warning(ledger: SqliteLedger, thread_id: str) -> None:
    """No message id and no fallback: the core's rule applies (warn, run unprotected)."""
    effects: list[str] = []
    graph = tools_only_graph(effects, ledger)
    with pytest.warns(UnprotectedCallWarning, match="refund_order ran WITHOUT replay protection") as warned:
        graph.invoke(id_less_call(), config(thread_id))
    assert "fallback_message_id=" in str(warned[0].message)
    assert "tool_call(" not in str(warned[0].message)  # the adapter's fix, not the generic advice
    assert effects == ["refund_order A1"]
    assert list(ledger.records()) == []


def test_message_without_id_raises_when_told_to(ledger: SqliteLedger, thread_id: str) -> None:
    """on_missing_ids='raise' refuses to run a call it cannot key."""
    effects: list[str] = []
    graph = tools_only_graph(effects, ledger, on_missing_ids="raise")
    with pytest.raises(MissingCallIdError, match="refund_order"):
        graph.invoke(id_less_call(), config(thread_id))
    assert effects == []


def test_fallback_message_id_keys_messages_without_ids(ledger: SqliteLedger, thread_id: str) -> None:
    """fallback_message_id supplies the message id when the state's messages carry none."""
    effects: list[str] = []
    graph = tools_only_graph(effects, ledger, fallback_message_id=ai_message_digest)
    graph.invoke(id_less_call(), config(thread_id))
    [record] = list(ledger.records(thread_id=thread_id))
    assert effects == ["refund_order A1"]
    assert record.key.message_id.startswith("digest-")
    assert record.key.tool_call_id == "call_1"


def test_without_a_thread_id_the_call_runs_unprotected_with_a_warning(ledger: SqliteLedger) -> None:
    """A graph run without a checkpointer has no thread id: warn and run."""
    effects: list[str] = []
    model = scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}), final_answer(1))
    node = replay_safe_tool_node(make_tools(effects), ledger=ledger)
    graph = state_graph(model, node, None)
    with pytest.warns(UnprotectedCallWarning, match="the call's thread_id is empty"):
        graph.invoke(ask(1))
    assert effects == ["refund_order A1"]
    assert list(ledger.records()) == []


# --- construction ------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["wrap_tool_call", "awrap_tool_call"])
def test_tool_node_refuses_a_second_interceptor(option: str, ledger: SqliteLedger) -> None:
    """replay_safe_tool_node() says how to combine interceptors instead of dropping one."""
    passthrough: Callable[..., Any] = lambda request, execute: execute(request)  # noqa: E731
    with pytest.raises(TypeError, match="innermost"):
        replay_safe_tool_node([], ledger=ledger, **{option: passthrough})


def test_tool_node_passes_tool_node_options(ledger: SqliteLedger) -> None:
    """Other keyword arguments go to ToolNode."""
    node = replay_safe_tool_node(make_tools([]), ledger=ledger, name="actions", handle_tool_errors=True)
    assert node.name == "actions"
    assert sorted(node.tools_by_name) == ["refund_order", "send_email"]
