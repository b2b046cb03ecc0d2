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

Approvals (``needs_approval``): every tool is reviewed before it runs, the framework's way, and the driver, as
the application, answers the review's ``interrupt()`` with ``Command(resume=...)`` in the first run only (without
an interrupt id, as ``HumanInTheLoopMiddleware`` documents: LangGraph then saves the answer with the thread before
the review runs again, and hands it back to the review that a crash cut short). ``DRIVER`` reviews with
``HumanInTheLoopMiddleware`` (``ReplaySafeHumanInTheLoopMiddleware`` when protected); ``TOOLNODE_DRIVER`` with a
review node of its own (``review_graph``), which records the answer with ``replaysafe.approvals`` when protected.
A run stopped at an interrupt that nobody answers ends, waiting. Neither can have the two scenarios whose model
re-plans after a restart (``NOT_APPLICABLE`` says why).

Pauses: a tool waits for its human with ``interrupt()`` (``ask``); the driver answers with ``Command(resume=...)``
in every run, and the tool runs again from its top, its completed steps replayed by the adapter.

This module is imported by name (``langgraph_conformance_driver``) in the kit's child processes, which get
the import path of the process that runs the kit. Every case at every kill point::

    export PYTHONPATH=integrations/langgraph/tests
    python -m replaysafe.testing.conformance langgraph_conformance_driver:DRIVER
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Literal

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.prebuilt.tool_node import ToolCallWithContext
from langgraph.types import Command, Send, interrupt

from replaysafe import CallKey, Ledger, ReplayMismatchError, approvals, replay_safe
from replaysafe.testing import Script
from replaysafe.testing.conformance import APPROVER, AgentRun, ApprovalAnswer
from replaysafe_langgraph import (
    InterceptorOptions,
    ReplaySafeHumanInTheLoopMiddleware,
    ReplaySafeInterceptor,
    ReplaySafeMiddleware,
    replay_safe_tool_node,
)
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


#: The words ``HumanInTheLoopMiddleware`` (and the adapter, for a rejection it recorded) answer a rejected call with.
REJECTED = "User rejected the tool call for "
#: What the kit's human says when it rejects a call.
REJECTION = "the human said no"


def review_graph(
    model: ScriptedChatModel,
    tools: list[BaseTool],
    tool_node: ToolNode,
    saver: SqliteSaver,
    run: AgentRun,
    interceptor: ReplaySafeInterceptor | None,
) -> Any:
    """The agent loop with a review before its tools, as LangGraph's docs build one: a ``review`` node asks the
    human about the model's calls with ``interrupt()`` (the same request and decisions as
    ``HumanInTheLoopMiddleware``'s batched mode) and applies the answer: an edit replaces the call's arguments in
    the model's message, a rejection answers the model with ``HumanInTheLoopMiddleware``'s words and the call is
    not run. With the adapter (``interceptor``, the ``ToolNode``'s) the node also keeps each call paused for its
    decision in the ledger before it asks (``replaysafe.approvals.request``, bound to the arguments the human is
    shown, with the digest the interceptor's protection gives them) and records the answer (``approve``, with
    the edit, for ``approval_expires_in`` seconds, or ``reject``) while the call waits for its first decision:
    an answer LangGraph hands back to the node after a crash once it was recorded is not recorded again."""
    bound = model.bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    def review(state: MessagesState) -> dict[str, list[BaseMessage]]:
        message = next(m for m in reversed(state["messages"]) if isinstance(m, AIMessage))
        keys = [CallKey(run.thread_id, str(message.id), str(call["id"])) for call in message.tool_calls]
        if interceptor is not None:
            for key, call in zip(keys, message.tool_calls, strict=True):
                asking(interceptor, key, call["name"], call["args"], run.ledger)
        requests = [
            {"name": c["name"], "args": c["args"], "description": f"Run {c['name']}?"} for c in message.tool_calls
        ]
        decisions = interrupt({"action_requests": requests})["decisions"]
        calls, rejected = [], []
        for key, call, decided in zip(keys, message.tool_calls, decisions, strict=True):
            if interceptor is not None:
                recorded(key, decided, run)
            if decided["type"] == "reject":
                text = f"{REJECTED}`{call['name']}` with reason: {decided['message']}"
                rejected.append(ToolMessage(text, name=call["name"], tool_call_id=call["id"], status="error"))
            elif decided["type"] == "edit":
                call = {**call, "args": dict(decided["edited_action"]["args"])}
            calls.append(call)
        return {"messages": [message.model_copy(update={"tool_calls": calls}), *rejected]}

    def route(state: MessagesState) -> Any:
        """The tools step for the calls the review did not answer (all of them: ``ToolNode``'s one task)."""
        message = next(m for m in reversed(state["messages"]) if isinstance(m, AIMessage))
        answered = {m.tool_call_id for m in state["messages"] if isinstance(m, ToolMessage)}
        pending = [call for call in message.tool_calls if call["id"] not in answered]
        if len(pending) == len(message.tool_calls):
            return "tools"
        if not pending:
            return "agent"
        return [
            Send("tools", ToolCallWithContext(__type="tool_call_with_context", tool_call=call, state=state))
            for call in pending
        ]

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("review", review)
    builder.add_node("tools", tool_node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "review", "__end__": "__end__"})
    builder.add_conditional_edges("review", route, ["tools", "agent"])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def asking(interceptor: ReplaySafeInterceptor, key: CallKey, tool: str, args: Any, ledger: Ledger) -> None:
    """The call is kept paused in the ledger for its human's decision, with the arguments the human is shown
    (once: asked again, it is one request)."""
    # Asked before with other arguments, or run already: the tools step's claim refuses it, or replays it.
    with contextlib.suppress(ReplayMismatchError, ValueError):
        approvals.request(key, tool=interceptor.digest_tool(tool), args={"args": args}, ledger=ledger)


def recorded(key: CallKey, decided: Mapping[str, Any], run: AgentRun) -> None:
    """The human's answer, recorded as a decision on the call it was given for, once: only while the call waits
    for its first decision (an answer handed back after a crash was recorded already)."""
    state = approvals.state(key, ledger=run.ledger)
    if state is None or not state.waiting:
        return
    if decided["type"] == "reject":
        approvals.reject(key, by=APPROVER, reason=str(decided["message"]), ledger=run.ledger)
        return
    edit = decided["edited_action"]["args"] if decided["type"] == "edit" else None
    expiry = approvals.DEFAULT_EXPIRY if run.approval_expires_in is None else run.approval_expires_in
    approvals.approve(
        key, by=APPROVER, args=None if edit is None else {"args": dict(edit)}, ledger=run.ledger, expires_in=expiry
    )


def check_conversation(messages: list[BaseMessage], script: Script) -> None:
    """The thread the agent ended with is whole: every call the model made answered once, by a result (not
    an error, but for its human's rejection), and the script's final text last. A replay that lost or doubled a
    ``ToolMessage`` fails here."""
    answered = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    failed = [
        m.tool_call_id
        for m in messages
        if isinstance(m, ToolMessage) and m.status == "error" and not str(m.content).startswith(REJECTED)
    ]
    asked = [call["id"] for m in messages if isinstance(m, AIMessage) for call in m.tool_calls]
    final = messages[-1] if messages else None
    planned = [turn for turn in script.turns if isinstance(turn, str)]
    if sorted(answered, key=str) != sorted(asked, key=str) or len(set(asked)) != len(asked) or failed:
        raise AssertionError(f"the thread's tool calls {asked} were answered by {answered} (errors: {failed})")
    if not isinstance(final, AIMessage) or final.tool_calls or final.content != (planned[0] if planned else "done"):
        raise AssertionError(f"the thread did not end with the script's final answer: {final!r}")


def decision(approval: ApprovalAnswer, tool: str) -> dict[str, Any]:
    """The kit's human's answer as a ``HumanInTheLoopMiddleware`` decision: approve, edit, or reject."""
    if not approval.approve:
        return {"type": "reject", "message": REJECTION}
    if approval.args is not None:
        return {"type": "edit", "edited_action": {"name": tool, "args": dict(approval.args)}}
    return {"type": "approve"}


def answer(interrupts: Any, approval: ApprovalAnswer, paused: str) -> Any:
    """The ``Command(resume=...)`` value that answers the interrupts the run stopped at, as
    ``HumanInTheLoopMiddleware`` documents it: ``{"decisions": [...]}`` for its batched request, one decision
    for a per-call one (the adapter's own question, when it asks again); by interrupt id when there are several.
    (LangGraph saves an answer given without an id with the thread before anything runs, as a pending write, and
    hands it back to the interrupt that asks again after a crash; one given by id it saves only with the
    result of the task that asked.)"""
    answered: dict[str, Any] = {}
    for asked in interrupts:
        value = asked.value
        if isinstance(value, Mapping) and "action_requests" in value:
            answered[asked.id] = {"decisions": [decision(approval, a["name"]) for a in value["action_requests"]]}
        elif isinstance(value, Mapping) and value.get("type") == "tool_approval":
            # After an attempt that may have taken effect, the adapter takes an approval that names that attempt.
            shown = {"attempt": value["attempt"]} if value.get("may_have_run") else {}
            answered[asked.id] = {**decision(approval, value["name"]), **shown}
        elif isinstance(value, str):  # a tool's own question (LangGraphDriver.ask): the human's answer
            answered[asked.id] = paused
        else:
            raise AssertionError(f"the run stopped at an interrupt the driver cannot answer: {value!r}")
    return next(iter(answered.values())) if len(answered) == 1 else answered


class LangGraphDriver:
    """Runs a scenario's agent on LangGraph: ``create_agent`` (``"agent"``) or a ``StateGraph`` (``"toolnode"``).

    ``"approvals"`` (``create_agent`` only): a scenario's ``needs_approval`` puts every tool under
    ``HumanInTheLoopMiddleware`` (batched, its default), which stops the run with ``interrupt()`` after the
    model's turn; the driver, as the application, answers it with ``Command(resume=...)`` in the first run
    (approve, edit, reject), and LangGraph keeps that answer with the thread (a pending write of the review's
    task) and hands it back to the review when a resume runs it again. With the adapter the review is
    ``ReplaySafeHumanInTheLoopMiddleware``, which records the answer as an approval bound to the call (for
    ``approval_expires_in`` seconds), once; a call the adapter refuses is asked about again with ``interrupt()``.
    A run stopped at an interrupt with nobody to answer it (``approver`` is ``None``) ends, waiting.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.offers = frozenset({"approvals", "pauses"})
        self.not_applicable: Mapping[str, str] = NOT_APPLICABLE[graph]

    def ask(self, run: AgentRun, question: str) -> str:
        """A tool waits for its human with LangGraph's ``interrupt()``: the run stops, and the tool runs again from
        its top on ``Command(resume=...)``, where ``interrupt()`` returns the answer LangGraph kept."""
        return str(interrupt(question))

    def run(self, run: AgentRun) -> None:
        options = dict(run.options)
        needs_approval = bool(options.pop("needs_approval", False))
        adapter, decorator = split_options(options)
        tools = langchain_tools(run.tools, run.ledger, decorator if run.protect else {})
        model = scripted_chat_model(run.script, boot=run.boot)
        durability = "exit" if run.script.new_ids_after_restart else "sync"
        config: Any = {"configurable": {"thread_id": run.thread_id}}
        with SqliteSaver.from_conn_string(str(run.folder / "checkpoints.db")) as saver:
            if self.graph == "agent":
                middleware = self.middleware(run, adapter, [t.name for t in tools] if needs_approval else [])
                agent = create_agent(model, tools, middleware=middleware, checkpointer=saver)
            elif needs_approval:
                settings = self.settings(run, adapter, reviewed=True)
                interceptor = ReplaySafeInterceptor(run.ledger, **settings) if run.protect else None
                node = (
                    ToolNode(tools, wrap_tool_call=interceptor.wrap, awrap_tool_call=interceptor.awrap)
                    if interceptor is not None
                    else ToolNode(tools)
                )
                agent = review_graph(model, tools, node, saver, run, interceptor)
            else:
                node = replay_safe_tool_node(tools, ledger=run.ledger, **adapter) if run.protect else ToolNode(tools)
                agent = state_graph(model, tools, node, saver)
            saved = agent.get_state(config)
            if not saved.values:  # a first run, or one whose crash left nothing saved
                ask = {"messages": [HumanMessage("Refund order A1 and tell the customer.", id="human-1")]}
                agent.invoke(ask, config, durability=durability)
            elif saved.next:  # the step the crash interrupted (or the review it left waiting), from its checkpoint
                agent.invoke(None, config, durability=durability)
            state = agent.get_state(config)
            while state.interrupts:  # the run stopped for its human
                if run.approver is None and not all(isinstance(i.value, str) for i in state.interrupts):
                    return  # nobody answers an approval in this run: the thread waits for a decision
                resume = answer(state.interrupts, run.approval, run.answer)
                agent.invoke(Command(resume=resume), config, durability=durability)
                state = agent.get_state(config)
            messages = state.values["messages"]
        check_conversation(messages, run.script)

    @staticmethod
    def middleware(
        run: AgentRun, adapter: Mapping[str, Any], reviewed: list[str]
    ) -> list[AgentMiddleware[Any, Any, Any]]:
        """``create_agent``'s middleware: the review of ``reviewed`` (LangChain's ``HumanInTheLoopMiddleware``,
        or the adapter's in its place), and the adapter last."""
        interrupt_on: dict[str, Any] = dict.fromkeys(reviewed, True)
        if not run.protect:
            return [HumanInTheLoopMiddleware(interrupt_on)] if reviewed else []
        expiry = approvals.DEFAULT_EXPIRY if run.approval_expires_in is None else run.approval_expires_in
        review: list[AgentMiddleware[Any, Any, Any]] = (
            [ReplaySafeHumanInTheLoopMiddleware(interrupt_on, ledger=run.ledger, approver=APPROVER, expires_in=expiry)]
            if reviewed
            else []
        )
        return [*review, ReplaySafeMiddleware(run.ledger, **LangGraphDriver.settings(run, adapter, bool(reviewed)))]

    @staticmethod
    def settings(run: AgentRun, adapter: Mapping[str, Any], reviewed: bool) -> InterceptorOptions:
        """The adapter's options; under a review, the approver and the expiry of the decisions given when the
        adapter asks again for a call it refused."""
        settings: dict[str, Any] = dict(adapter)
        if reviewed:
            settings.setdefault("approver", APPROVER)
            if run.approval_expires_in is not None:
                settings.setdefault("approval_expires_in", run.approval_expires_in)
        return settings  # type: ignore[return-value]


#: Why a scenario cannot happen on each graph (``Driver.not_applicable``).
_REPLAN = (
    "LangGraph saves the thread when HumanInTheLoopMiddleware's interrupt() stops the run for its human, under "
    "every durability setting (an interrupt ends the run, and the end of a run is saved), and the thread then "
    "holds the model's AIMessage with the call: a run that resumes after the answer, or after a crash once the "
    "answer was given, goes on from that message and never asks the model again"
)
NOT_APPLICABLE: dict[Graph, dict[str, str]] = {
    "agent": {
        "approval_args_changed": f"{_REPLAN}, so the call cannot come back with other arguments (the adapter's "
        "refusal of a call whose arguments changed after its approval, by an edit of the thread, is "
        "test_langgraph_approvals.py's)",
        "approval_reused": f"{_REPLAN}, so the same call is never planned again under new ids after a restart (an "
        "answer handed to a call re-planned by an edit of the thread is test_langgraph_approvals.py's)",
    },
    "toolnode": {
        "approval_args_changed": _REPLAN.replace("HumanInTheLoopMiddleware's interrupt()", "the review's interrupt()")
        + ", so the call cannot come back with other arguments",
        "approval_reused": _REPLAN.replace("HumanInTheLoopMiddleware's interrupt()", "the review's interrupt()")
        + ", so the same call is never planned again under new ids after a restart",
    },
}


DRIVER = LangGraphDriver("agent")
TOOLNODE_DRIVER = LangGraphDriver("toolnode")
