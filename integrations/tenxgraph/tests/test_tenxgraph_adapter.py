"""The 10xGraph adapter inside one process: keys, injected parameters, pauses, result types, the README."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from injectq import InjectQ
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.graph.compiled_graph import CompiledGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state import AgentState, Message, ToolResult
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils.constants import END
from tenxgraph.utils.interrupt import interrupt, pending_interrupt

from replaysafe import MemoryLedger, Status, UnprotectedCallWarning, current_call
from replaysafe_tenxgraph import ToolResultSerializer, call_key, message_id, replay_safe_tool, replay_safe_tools

from conftest import POSTGRES_URL, REDIS_URL
from tenxgraph_scenario import REFUND_OUTPUT, ScriptedModel, route, tool_results

README = Path(__file__).parents[1] / "README.md"


def build(tools: list[Callable[..., Any]]) -> tuple[CompiledGraph[Any], InMemoryCheckpointer[Any]]:
    checkpointer: InMemoryCheckpointer[Any] = InMemoryCheckpointer()  # type: ignore[no-untyped-call]
    # A container of its own: graphs compiled in one process share the global one, checkpointer included.
    graph: StateGraph[Any] = StateGraph(container=InjectQ())
    graph.add_node("MAIN", ScriptedModel())
    graph.add_node("TOOL", ToolNode(tools))
    graph.add_conditional_edges("MAIN", route, {"TOOL": "TOOL", END: END})
    graph.add_edge("TOOL", "MAIN")
    graph.set_entry_point("MAIN")
    return graph.compile(checkpointer=checkpointer), checkpointer


def user(text: str) -> dict[str, Any]:
    return {"messages": [Message.text_message(text, role="user")]}


async def thread_state(checkpointer: InMemoryCheckpointer[Any], thread_id: str) -> AgentState:
    state: AgentState | None = await checkpointer.aget_state({"thread_id": thread_id, "user_id": "anonymous"})
    assert state is not None
    return state


def test_the_model_sees_the_same_tool_schema() -> None:
    """The wrapper adds tool_call_id/state/config for the ToolNode to fill; they stay out of the schema."""

    def refund_order(order_id: str, amount: float = 1.0) -> str:
        """Refund an order."""
        return order_id

    def note(text: str, state: AgentState, *, config: dict[str, Any]) -> str:
        """Write a note."""
        return text

    plain = ToolNode([refund_order, note]).get_local_tool()
    protected = ToolNode(replay_safe_tools([refund_order, note], ledger=MemoryLedger())).get_local_tool()
    assert protected == plain
    assert [tool["function"]["name"] for tool in protected] == ["refund_order", "note"]


async def test_a_new_turn_reusing_call_1_runs_the_tool_again() -> None:
    """Every turn's model reply asks for call_1; its message id makes it a new call."""
    ledger = MemoryLedger()
    runs: list[str] = []

    def refund_order(order_id: str, amount: float) -> str:
        """Refund an order."""
        call = current_call()
        assert call is not None
        runs.append(call.message_id)
        return f"Refunded {amount:.2f} for order {order_id}"

    app, checkpointer = build(replay_safe_tools([refund_order], ledger=ledger))
    await app.ainvoke(user("Refund order A1"), config={"thread_id": "t-turns"})
    await app.ainvoke(user("And again"), config={"thread_id": "t-turns"})

    assert len(runs) == 2
    assert runs[0] != runs[1]
    state = await thread_state(checkpointer, "t-turns")
    asked = [str(m.message_id) for m in state.context if m.role == "assistant" and m.tools_calls]
    assert runs == asked
    keys = {(record.key.thread_id, record.key.message_id, record.key.tool_call_id) for record in ledger.records()}
    assert keys == {("t-turns", asked[0], "call_1"), ("t-turns", asked[1], "call_1")}


async def test_async_tools_are_protected_and_replayed() -> None:
    """An async tool runs once; running its ToolNode step again returns the record."""
    ledger = MemoryLedger()
    runs: list[int] = []

    async def refund_order(order_id: str, amount: float) -> str:
        """Refund an order."""
        runs.append(1)
        return f"Refunded {amount:.2f} for order {order_id}"

    [tool] = replay_safe_tools([refund_order], ledger=ledger)
    app, checkpointer = build([tool])
    await app.ainvoke(user("Refund order A1"), config={"thread_id": "t-async"})
    state = await thread_state(checkpointer, "t-async")
    asking = next(m for m in state.context if m.tools_calls)
    replay_state = state.model_copy(update={"context": state.context[: state.context.index(asking) + 1]})

    again = await tool(
        order_id="A1", amount=59.0, tool_call_id="call_1", state=replay_state, config={"thread_id": "t-async"}
    )

    assert again == REFUND_OUTPUT
    assert runs == [1]
    [record] = ledger.records()
    assert (record.status, record.key.message_id) == (Status.COMPLETED, str(asking.message_id))


def test_injected_parameters_reach_the_tool_and_stay_out_of_the_argument_digest() -> None:
    """A tool taking state and config gets them; a replay with a grown state is the same call."""
    ledger = MemoryLedger()
    seen: list[tuple[str, int]] = []

    def refund_order(order_id: str, state: AgentState, config: dict[str, Any]) -> str:
        """Refund an order."""
        seen.append((config["thread_id"], len(state.context)))
        return f"refunded {order_id}"

    tool = replay_safe_tool(refund_order, ledger=ledger)
    asking = Message.text_message("", role="assistant", message_id="msg-7")
    asking.tools_calls = [{"id": "call_1", "type": "function", "function": {"name": "refund_order"}}]
    state = AgentState(context=[Message.text_message("refund", role="user"), asking])
    later = AgentState(context=[*state.context, Message.text_message("more", role="user")])

    first = tool(order_id="A1", tool_call_id="call_1", state=state, config={"thread_id": "t1"})
    second = tool(order_id="A1", tool_call_id="call_1", state=later, config={"thread_id": "t1"})

    assert first == second == "refunded A1"
    assert seen == [("t1", 2)]  # ran once, with the ToolNode's state and config
    assert call_key({"thread_id": "t1"}, later, "call_1") == ("t1", "msg-7", "call_1")
    assert message_id(later, "call_9") is None


async def test_an_interrupt_inside_a_protected_tool_keeps_the_call_paused() -> None:
    """interrupt() pauses the call for a human: kept paused (not recorded, not in doubt); approved, it runs once."""
    ledger = MemoryLedger()
    runs: list[Any] = []

    def refund_order(order_id: str, amount: float) -> str:
        """Refund an order."""
        approved = interrupt({"order_id": order_id}, reason="tool_approval")
        runs.append(approved)
        return f"Refunded {amount:.2f} for order {order_id}"

    app, checkpointer = build(replay_safe_tools([refund_order], ledger=ledger))
    config = {"thread_id": "t-approval"}
    await app.ainvoke(user("Refund order A1"), config=config)
    pause = pending_interrupt(await thread_state(checkpointer, "t-approval"))
    assert pause is not None
    assert pause.reason == "tool_approval"
    [paused] = ledger.records()
    assert paused.status is Status.PAUSED  # neither recorded nor in doubt
    assert paused.result is None

    await app.ainvoke({"resume": True}, config=config)

    assert runs == [True]
    [record] = ledger.records()
    assert record.status is Status.COMPLETED
    assert record.attempt == 2  # the paused call, resumed
    assert tool_results(await thread_state(checkpointer, "t-approval")) == [
        {"call_id": "call_1", "output": REFUND_OUTPUT, "is_error": False}
    ]


@pytest.mark.parametrize(
    "value",
    [
        ToolResult("noted", state={"note": 1}, is_error=False),
        ToolResult(content=["x"], is_error=True),
        Message.text_message("hello", role="tool", message_id="m-1"),
        {"tenxgraph": "message", "value": {"not": "a message"}},
        ["plain", 1, None],
    ],
    ids=["tool-result", "tool-error", "message", "dict-with-the-envelope-key", "list"],
)
def test_results_the_tool_node_treats_differently_replay_as_their_own_type(value: object) -> None:
    """A ToolResult or Message comes back as one; a user's dict never passes for either."""
    serializer = ToolResultSerializer()
    replayed = serializer.loads(serializer.dumps(value))
    assert type(replayed) is type(value)
    assert replayed == value


def test_a_recorded_tool_result_replays_with_its_state_update() -> None:
    """A replayed ToolResult still carries its state update to the ToolNode."""
    ledger = MemoryLedger()
    runs: list[int] = []

    def remember(note: str) -> ToolResult:
        """Remember a note."""
        runs.append(1)
        return ToolResult(f"noted {note}", state={"note": note})

    tool = replay_safe_tool(remember, ledger=ledger)
    asking = Message.text_message("", role="assistant", message_id="msg-1")
    asking.tools_calls = [{"id": "call_1", "type": "function", "function": {"name": "remember"}}]
    state = AgentState(context=[asking])
    kwargs: dict[str, Any] = {"note": "n", "tool_call_id": "call_1", "state": state, "config": {"thread_id": "t"}}

    assert tool(**kwargs) == tool(**kwargs) == ToolResult("noted n", state={"note": "n"})
    assert runs == [1]


def test_outside_a_graph_the_tool_runs_unprotected_with_a_warning() -> None:
    """No ids, no key: the core's rule applies (a warning, or MissingCallIdError with on_missing_ids="raise")."""
    tool = replay_safe_tool(lambda_free_tool, ledger=MemoryLedger())
    with pytest.warns(UnprotectedCallWarning, match="WITHOUT replay protection"):
        assert tool(x=2) == 4


def lambda_free_tool(x: int) -> int:
    """Double x."""
    return 2 * x


async def test_the_readme_example_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, schema: str, thread_id: str
) -> None:
    """The README's example on the test servers, with the test model in place of the provider's."""
    # Marked notest for the docs runner: this test runs it, on the test servers. The one block that builds a
    # ReactAgent (the other, the crash test, runs in test_tenxgraph_readme.py), so that another block added
    # above it cannot silently become the one tested.
    found = re.findall(r"```python notest\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    blocks = [block for block in found if "ReactAgent(" in block]
    assert len(blocks) == 1, f"README.md has {len(blocks)} python blocks that build a ReactAgent; this test runs one"
    code = (
        blocks[0]
        .replace('"postgresql://app@db/agents"', repr(POSTGRES_URL))
        .replace('"redis://cache:6379/0"', repr(REDIS_URL))
        .replace("PgCheckpointer(", f"PgCheckpointer(schema={schema!r}, ")
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-unused")  # the provider client is built, never called
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    namespace["app"].override_node("MAIN", ScriptedModel())
    try:
        await namespace["turn"](thread_id, "Refund order A1")
        resumed = await namespace["turn"](thread_id, None)  # a finished thread: the model just answers
    finally:
        await namespace["checkpointer"].arelease()
        namespace["ledger"].close()
    assert resumed["messages"][-1].text() == "done"
    [record] = ledger_records = list(namespace["ledger"].records())
    assert len(ledger_records) == 1
    assert (record.status, record.tool_name, record.key.thread_id) == (Status.COMPLETED, "refund_order", thread_id)
