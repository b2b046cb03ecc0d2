"""The conformance kit's drivers for LangGraph: the agents of the adapter's README, on a scripted model.

``DRIVER`` builds a ``langchain.agents.create_agent`` agent (``ReplaySafeMiddleware`` when protected);
``TOOLNODE_DRIVER`` the classic ``StateGraph`` loop, a model node and a ``ToolNode`` (``replay_safe_tool_node``
when protected). Both keep their thread in a ``SqliteSaver`` file under the run's folder and resume it as
LangGraph resumes one: ``invoke(None, config)`` when the checkpoint has a step to run, a new run when there
is none. The tools run as LangGraph runs them: side by side when the model asks for several at once.

Checkpoints are written before each step runs (``durability="sync"``), so a resumed thread replays the model's
message with its ids. A script whose model re-plans after a restart (``new_ids_after_restart``) runs with
``durability="exit"``, the setting under which LangGraph saves nothing of a run that dies: the restarted
run asks the model again, which answers under new ids (the README's "Keys" case).

The scenarios' ``@replay_safe`` options go where the adapter takes them: those of ``InterceptorOptions``
(``in_doubt``, ``timeout``, ...) to the middleware or the tool node; a ``key=`` to a ``@replay_safe`` on each
tool, as the README says to choose a key (the adapter then keys and records the decorated tool's call).

This module is imported by name (``langgraph_conformance_driver``) in the kit's child processes, which get
the import path of the process that runs the kit. Every case at every kill point::

    export PYTHONPATH=integrations/langgraph/tests
    python -m replaysafe.testing.conformance langgraph_conformance_driver:DRIVER
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from replaysafe import Ledger, replay_safe
from replaysafe.testing import Script
from replaysafe.testing.conformance import AgentRun
from replaysafe_langgraph import InterceptorOptions, ReplaySafeMiddleware, replay_safe_tool_node
from replaysafe_langgraph.testing import ScriptedChatModel, scripted_chat_model

Graph = Literal["agent", "toolnode"]


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The options the adapter takes (``InterceptorOptions``), and those for a ``@replay_safe`` on each tool."""
    adapter = {name: value for name, value in options.items() if name in InterceptorOptions.__annotations__}
    decorator = {name: value for name, value in options.items() if name not in adapter}
    return adapter, decorator


def langchain_tools(
    tools: Mapping[str, Callable[..., Any]], ledger: Ledger, decorator: Mapping[str, Any]
) -> list[BaseTool]:
    """The scenario's functions as LangChain tools, each decorated with ``@replay_safe(**decorator)`` if given."""
    made: list[BaseTool] = []
    for name, function in tools.items():
        if decorator:
            function = replay_safe(ledger=ledger, name=name, **decorator)(function)
        made.append(StructuredTool.from_function(function, name=name))
    return made


def state_graph(model: ScriptedChatModel, tools: list[BaseTool], tool_node: ToolNode, saver: SqliteSaver) -> Any:
    """The classic agent loop: a model node, a ``ToolNode``, and ``tools_condition`` between them."""
    bound = model.bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tool_node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def check_conversation(messages: list[BaseMessage], script: Script) -> None:
    """The thread the agent ended with is whole: every call the model made answered once, by a result (not
    an error), and the script's final text last. A replay that lost or doubled a ``ToolMessage`` fails here."""
    answered = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    failed = [m.tool_call_id for m in messages if isinstance(m, ToolMessage) and m.status == "error"]
    asked = [call["id"] for m in messages if isinstance(m, AIMessage) for call in m.tool_calls]
    final = messages[-1] if messages else None
    planned = [turn for turn in script.turns if isinstance(turn, str)]
    if sorted(answered, key=str) != sorted(asked, key=str) or len(set(asked)) != len(asked) or failed:
        raise AssertionError(f"the thread's tool calls {asked} were answered by {answered} (errors: {failed})")
    if not isinstance(final, AIMessage) or final.tool_calls or final.content != (planned[0] if planned else "done"):
        raise AssertionError(f"the thread did not end with the script's final answer: {final!r}")


class LangGraphDriver:
    """Runs a scenario's agent on LangGraph: ``create_agent`` (``"agent"``) or a ``StateGraph`` (``"toolnode"``)."""

    #: Every scenario of the kit applies to LangGraph.
    not_applicable: Mapping[str, str] = {}

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def run(self, run: AgentRun) -> None:
        adapter, decorator = split_options(run.options)
        tools = langchain_tools(run.tools, run.ledger, decorator if run.protect else {})
        model = scripted_chat_model(run.script, boot=run.boot)
        durability = "exit" if run.script.new_ids_after_restart else "sync"
        config: Any = {"configurable": {"thread_id": run.thread_id}}
        with SqliteSaver.from_conn_string(str(run.folder / "checkpoints.db")) as saver:
            if self.graph == "agent":
                middleware = [ReplaySafeMiddleware(run.ledger, **adapter)] if run.protect else []
                agent = create_agent(model, tools, middleware=middleware, checkpointer=saver)
            else:
                node = replay_safe_tool_node(tools, ledger=run.ledger, **adapter) if run.protect else ToolNode(tools)
                agent = state_graph(model, tools, node, saver)
            saved = agent.get_state(config)
            if not saved.values:  # a first run, or one whose crash left nothing saved
                ask = {"messages": [HumanMessage("Refund order A1 and tell the customer.", id="human-1")]}
                agent.invoke(ask, config, durability=durability)
            elif saved.next:  # the step the crash interrupted, from its checkpoint
                agent.invoke(None, config, durability=durability)
            messages = agent.get_state(config).values["messages"]
        check_conversation(messages, run.script)


DRIVER = LangGraphDriver("agent")
TOOLNODE_DRIVER = LangGraphDriver("toolnode")
