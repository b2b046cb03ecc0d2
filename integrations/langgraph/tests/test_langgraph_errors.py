"""Errors under the adapter: what stops a run, what the model is shown, which failures run again on resume."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode

from replaysafe import (
    CallInDoubtError,
    CallKey,
    ReplayMismatchError,
    SqliteLedger,
    Status,
    UnprotectedCallWarning,
    replay_safe,
)
from replaysafe_langgraph import (
    InterceptorOptions,
    MessageSerializer,
    ReplaySafeInterceptor,
    ReplaySafeMiddleware,
    replay_safe_tool_node,
)

from _langgraph_fakes import (
    abefore_tools,
    agent_graph,
    ask,
    before_tools,
    config,
    final_answer,
    scripted,
    state_graph,
    tool_call_message,
)

KEY = ("msg-turn1-tools", "call_1")


def refund_tool(effects: list[str], *, decorated: bool, hang: asyncio.Event | None = None) -> BaseTool:
    """``refund_order``, decorated with ``@replay_safe`` or left to the adapter; it hangs on ``hang``."""

    async def refund_order(order_id: str) -> str:
        """Refund an order."""
        effects.append(f"refund_order {order_id}")
        if hang is not None:
            await hang.wait()
        return f"refunded {order_id}"

    return tool(replay_safe(refund_order) if decorated else refund_order)


def shown_to_model(messages: list[Any]) -> str:
    return "\n".join(str(m.content) for m in messages if isinstance(m, ToolMessage))


# --- replaysafe's own errors stop the run ----------------------------------------------------


@pytest.mark.parametrize("decorated", [False, True], ids=["adapter", "decorated"])
async def test_a_call_in_doubt_stops_the_run_under_handle_tool_errors(
    decorated: bool, ledger: SqliteLedger, thread_id: str
) -> None:
    """in_doubt="raise" under handle_tool_errors=True: CallInDoubtError ends the run, it is no ToolMessage.

    The first run's tool passes its deadline: that is the tool's outcome, shown to the model as an
    error, and the message names neither this host nor this process.
    """
    effects: list[str] = []
    never = asyncio.Event()
    model = scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}), final_answer(1))
    node = replay_safe_tool_node(
        [refund_tool(effects, decorated=decorated, hang=never)], ledger=ledger, handle_tool_errors=True
    )
    graph = state_graph(model, node, InMemorySaver())
    first = await graph.ainvoke(ask(1), {"configurable": {"thread_id": thread_id, "tool_timeout": 0.05}})
    record = ledger.get(CallKey(thread_id, *KEY))
    assert record is not None
    assert record.status is Status.IN_DOUBT
    shown = shown_to_model(first["messages"])
    assert "ToolTimeoutError" in shown
    assert socket.gethostname() not in shown
    assert f"{os.getpid()}" not in shown
    assert record.owner not in shown

    fork = await abefore_tools(graph, thread_id)
    fork["configurable"]["in_doubt"] = "raise"
    with pytest.raises(CallInDoubtError, match="refund_order"):
        await graph.ainvoke(None, fork)
    assert effects == ["refund_order A1"]


async def test_a_tool_node_of_ones_own_that_shows_a_refusal_shows_no_owner(
    ledger: SqliteLedger, thread_id: str
) -> None:
    """A ToolNode built by hand with handle_tool_errors=True (without tool_error_handler) hands the model
    CallInDoubtError's text: it names the call and the next step, never this host, process or owner token."""
    effects: list[str] = []
    never = asyncio.Event()
    model = scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}), final_answer(1), final_answer(2))
    interceptor = ReplaySafeInterceptor(ledger)
    node = ToolNode(
        [refund_tool(effects, decorated=False, hang=never)],
        wrap_tool_call=interceptor.wrap,
        awrap_tool_call=interceptor.awrap,
        handle_tool_errors=True,
    )
    graph = state_graph(model, node, InMemorySaver())
    await graph.ainvoke(ask(1), {"configurable": {"thread_id": thread_id, "tool_timeout": 0.05}})
    record = ledger.get(CallKey(thread_id, *KEY))
    assert record is not None
    assert record.status is Status.IN_DOUBT

    fork = await abefore_tools(graph, thread_id)
    fork["configurable"]["in_doubt"] = "raise"
    done = await graph.ainvoke(None, fork)
    shown = [m for m in done["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == "call_1"][-1]
    text = str(shown.content)
    assert "is in doubt" in text
    assert "replaysafe ledger resolve" in text
    assert "call_1" in text
    assert record.owner not in text
    assert socket.gethostname() not in text
    assert str(os.getpid()) not in text
    assert effects == ["refund_order A1"]


@pytest.mark.parametrize("decorated", [False, True], ids=["adapter", "decorated"])
async def test_a_mismatch_stops_the_run_under_handle_tool_errors(
    decorated: bool, ledger: SqliteLedger, thread_id: str
) -> None:
    """A fork with edited arguments raises ReplayMismatchError out of the graph; the model is not asked again."""
    effects: list[str] = []
    model = scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}), final_answer(1))
    tools = [refund_tool(effects, decorated=decorated)]
    graph = state_graph(model, replay_safe_tool_node(tools, ledger=ledger, handle_tool_errors=True), InMemorySaver())
    await graph.ainvoke(ask(1), config(thread_id))
    edited = tool_call_message(1, "refund_order", {"order_id": "B2"})
    fork = await graph.aupdate_state(await abefore_tools(graph, thread_id), {"messages": [edited]})
    with pytest.raises(ReplayMismatchError, match="refund_order"):
        await graph.ainvoke(None, fork)
    assert effects == ["refund_order A1"]


def test_tool_error_handler_keeps_the_flag_for_other_errors(ledger: SqliteLedger, thread_id: str) -> None:
    """handle_tool_errors=(ValueError,): a ValueError is a message for the model, a KeyError stops the run."""

    @tool
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        if order_id == "A1":
            raise ValueError("card declined")
        raise KeyError(order_id)

    model = scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}), final_answer(1))
    node = replay_safe_tool_node([refund_order], ledger=ledger, handle_tool_errors=(ValueError,))
    graph = state_graph(model, node, InMemorySaver())
    done = graph.invoke(ask(1), config(thread_id))
    assert "card declined" in shown_to_model(done["messages"])

    model = scripted(tool_call_message(2, "refund_order", {"order_id": "B2"}))
    graph = state_graph(model, node, None)
    with pytest.raises(KeyError):
        graph.invoke(ask(2), config(thread_id))


# --- a tool that raises after its side effect ---------------------------------------------------


@pytest.mark.parametrize("decorated", [False, True], ids=["adapter", "decorated"])
@pytest.mark.parametrize("graph_kind", ["toolnode", "agent"])
def test_a_tool_that_raised_runs_again_on_resume(
    decorated: bool, graph_kind: str, ledger: SqliteLedger, thread_id: str
) -> None:
    """Decorated or protected by the adapter alone, a failed call is not recorded: a resume runs it again.

    The rule is the library's (docs/semantics.md, rule 4): a tool that raises releases its claim.
    ToolNode turns the error into a message for the model either way; neither records it.
    """
    effects: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        effects.append(f"refund_order {order_id}")
        raise ValueError("the bank timed out after the refund was sent")

    function = replay_safe(refund_order) if decorated else refund_order
    model = scripted(
        tool_call_message(1, "refund_order", {"order_id": "A1"}),
        final_answer(1),
        AIMessage(id="msg-turn1-final-fork", content="again"),
    )
    if graph_kind == "toolnode":
        node = replay_safe_tool_node([tool(function)], ledger=ledger, handle_tool_errors=True)
        graph = state_graph(model, node, InMemorySaver())
        first = graph.invoke(ask(1), config(thread_id))
        assert "bank timed out" in shown_to_model(first["messages"])
        assert ledger.get(CallKey(thread_id, *KEY)) is None
        graph.invoke(None, before_tools(graph, thread_id))
    else:  # create_agent lets the error end the run; the resume runs the tools step again
        graph = agent_graph(model, [tool(function)], [ReplaySafeMiddleware(ledger)], InMemorySaver())
        with pytest.raises(ValueError, match="bank timed out"):
            graph.invoke(ask(1), config(thread_id))
        assert ledger.get(CallKey(thread_id, *KEY)) is None
        with pytest.raises(ValueError, match="bank timed out"):
            graph.invoke(None, config(thread_id))
    assert effects == ["refund_order A1", "refund_order A1"]
    assert ledger.get(CallKey(thread_id, *KEY)) is None


# --- options ------------------------------------------------------------------------------------------


def test_tool_node_and_middleware_take_the_same_options(ledger: SqliteLedger, thread_id: str) -> None:
    """Every option of the interceptor is accepted by replay_safe_tool_node and ReplaySafeMiddleware alike."""
    dumped: list[str] = []

    class CountingSerializer(MessageSerializer):
        def dumps(self, value: Any, /) -> str:
            text = super().dumps(value)
            dumped.append(text)
            return text

    options: InterceptorOptions = {
        "messages_key": "messages",
        "fallback_message_id": None,
        "on_missing_ids": "raise",
        "on_ledger_error": "raise",
        "timeout": 30,
        "in_doubt": "raise",
        "lease": 60,
        "wait_timeout": 0,
        "serializer": CountingSerializer(),
    }
    for graph_kind in ("toolnode", "agent"):
        effects: list[str] = []
        model = scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}), final_answer(1))
        tools = [refund_tool(effects, decorated=False)]
        if graph_kind == "toolnode":
            graph = state_graph(model, replay_safe_tool_node(tools, ledger=ledger, **options), InMemorySaver())
        else:
            graph = agent_graph(model, tools, [ReplaySafeMiddleware(ledger, **options)], InMemorySaver())
        asyncio.run(graph.ainvoke(ask(1), config(f"{thread_id}-{graph_kind}")))
        assert effects == ["refund_order A1"]
    assert len(dumped) == 2
    assert set(InterceptorOptions.__annotations__) <= set(ReplaySafeInterceptor.__init__.__code__.co_varnames)


def test_a_sync_only_interceptor_names_the_async_one(ledger: SqliteLedger, thread_id: str) -> None:
    """An async tool reached through the sync interceptor alone: the error says to install awrap too."""
    effects: list[str] = []
    interceptor = ReplaySafeInterceptor(ledger)
    node = ToolNode([refund_tool(effects, decorated=False)], wrap_tool_call=interceptor.wrap)
    graph = state_graph(scripted(tool_call_message(1, "refund_order", {"order_id": "A1"})), node, InMemorySaver())
    with pytest.raises(TypeError, match=r"awrap_tool_call=interceptor\.awrap"):
        asyncio.run(graph.ainvoke(ask(1), config(thread_id)))
    assert effects == []


def test_without_a_ledger_each_tool_warns_once(thread_id: str) -> None:
    """No ledger anywhere: the first tool's warning does not silence the second adapter's tool."""
    effects: list[str] = []

    def send_email(to: str) -> str:
        """Email the customer."""
        effects.append(f"send_email {to}")
        return "sent"

    first = state_graph(
        scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}), final_answer(1)),
        replay_safe_tool_node([refund_tool(effects, decorated=False)], ledger=None),
        InMemorySaver(),
    )
    second = state_graph(
        scripted(tool_call_message(2, "send_email", {"to": "bob"}), final_answer(2)),
        replay_safe_tool_node([tool(send_email)], ledger=None),
        InMemorySaver(),
    )
    with pytest.warns(UnprotectedCallWarning, match="refund_order ran WITHOUT replay protection: no ledger"):
        asyncio.run(first.ainvoke(ask(1), config(thread_id)))
    with pytest.warns(UnprotectedCallWarning, match="send_email ran WITHOUT replay protection: no ledger"):
        second.invoke(ask(2), config(thread_id))
    assert effects == ["refund_order A1", "send_email bob"]


# --- a decorated tool replays what it returned ----------------------------------------------------------


@pytest.mark.parametrize("serializer", [None, MessageSerializer()], ids=["default", "message-serializer"])
@pytest.mark.parametrize("annotated", [True, False], ids=["annotated", "bare"])
def test_a_decorated_content_and_artifact_tool_replays_its_tuple(
    serializer: MessageSerializer | None, annotated: bool, ledger: SqliteLedger, thread_id: str
) -> None:
    """The (content, artifact) pair comes back a pair, with or without a return annotation: the model sees no error."""
    effects: list[str] = []

    def refund_order(order_id: str) -> tuple[str, dict[str, Any]]:
        """Refund an order."""
        effects.append(f"refund_order {order_id}")
        return f"refunded {order_id}", {"refund_id": "re_123"}

    if not annotated:
        del refund_order.__annotations__["return"]
    refund = tool(response_format="content_and_artifact")(replay_safe(serializer=serializer)(refund_order))
    model = scripted(
        tool_call_message(1, "refund_order", {"order_id": "A1"}),
        final_answer(1),
        AIMessage(id="msg-turn1-final-fork", content="again"),
    )
    graph = state_graph(model, replay_safe_tool_node([refund], ledger=ledger, handle_tool_errors=True), InMemorySaver())
    first = graph.invoke(ask(1), config(thread_id))
    replayed = graph.invoke(None, before_tools(graph, thread_id))
    original = next(m for m in first["messages"] if isinstance(m, ToolMessage))
    again = next(m for m in replayed["messages"] if isinstance(m, ToolMessage))
    assert effects == ["refund_order A1"]
    assert (again.content, again.artifact, again.status, again.name) == (
        original.content,
        {"refund_id": "re_123"},
        "success",
        "refund_order",
    )
