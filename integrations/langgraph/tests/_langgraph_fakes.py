"""Offline test models and graphs shared by the tests and the child-process script.

Every AIMessage carries an explicit id unique to its turn: langchain-core's test
models would otherwise reuse ids, and a test passing only because ids collide proves
nothing. Tool call ids are deliberately ``call_1`` / ``call_2`` on every turn, as a
real provider's are not but many test models' are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition


class ToolCallingFakeModel(GenericFakeChatModel):
    """``GenericFakeChatModel`` (scripted replies, one per call) that accepts ``bind_tools``."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        return self


def scripted(*replies: AIMessage | str) -> ToolCallingFakeModel:
    """A model answering ``replies`` in order; asking it once more fails the run."""
    return ToolCallingFakeModel(messages=iter(replies))


def refund_and_email(turn: int, order_id: str = "A1") -> AIMessage:
    """Turn ``turn``'s model message: two parallel calls, ``refund_order`` then ``send_email``."""
    return AIMessage(
        id=f"msg-turn{turn}-tools",
        content="",
        tool_calls=[
            {"name": "refund_order", "args": {"order_id": order_id}, "id": "call_1", "type": "tool_call"},
            {"name": "send_email", "args": {"to": "customer@example.com"}, "id": "call_2", "type": "tool_call"},
        ],
    )


def final_answer(turn: int) -> AIMessage:
    return AIMessage(id=f"msg-turn{turn}-final", content=f"turn {turn} done")


def tool_call_message(turn: int, name: str, args: dict[str, Any], call_id: str = "call_1") -> AIMessage:
    return AIMessage(
        id=f"msg-turn{turn}-tools",
        content="",
        tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}],
    )


def state_graph(
    model: ToolCallingFakeModel,
    tool_node: ToolNode,
    checkpointer: BaseCheckpointSaver[Any] | None,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The classic agent loop: a model node, a ``ToolNode``, and ``tools_condition`` between them."""

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", RunnableLambda(agent, afunc=aagent))
    builder.add_node("tools", tool_node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def agent_graph(
    model: ToolCallingFakeModel,
    tools: Iterable[BaseTool | Callable[..., Any]],
    middleware: Sequence[AgentMiddleware[Any, Any, Any]],
    checkpointer: BaseCheckpointSaver[Any] | None,
) -> Any:
    """A ``langchain.agents.create_agent`` agent."""
    return create_agent(model, tools=list(tools), middleware=middleware, checkpointer=checkpointer)


def summary(messages: Iterable[BaseMessage]) -> list[list[Any]]:
    """``[type, id, tool_call_id, content]`` per message: what the tests compare."""
    return [[m.type, m.id, getattr(m, "tool_call_id", None), m.content] for m in messages]


# --- running a graph on a thread -------------------------------------------------------


def config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def ask(turn: int) -> dict[str, list[AnyMessage]]:
    return {"messages": [HumanMessage(f"turn {turn}: refund order A1 and tell the customer", id=f"human-turn{turn}")]}


def before_tools(graph: Any, thread_id: str) -> Any:
    """The config of the checkpoint taken after the model asked for the tools, before they ran."""
    return next(s.config for s in graph.get_state_history(config(thread_id)) if set(s.next) == {"tools"})


async def abefore_tools(graph: Any, thread_id: str) -> Any:
    async for snapshot in graph.aget_state_history(config(thread_id)):
        if set(snapshot.next) == {"tools"}:
            return snapshot.config
    raise AssertionError("no checkpoint before the tools step")
