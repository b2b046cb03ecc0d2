"""The conformance kit's driver for 10xGraph: the README's agent on a scripted model.

The agent is ``ReactAgent``'s graph (a ``MAIN`` model node, a ``TOOL`` ``ToolNode``, back to ``MAIN`` while the
model asks for tools), built with ``StateGraph`` because ``ReactAgent`` builds a provider client for its model:
its model node is ``replaysafe_tenxgraph.testing.scripted_model``. The tools are
``replay_safe_tools(tools, ledger=run.ledger, **run.options)`` when protected, the plain functions otherwise.

The thread lives in 10xGraph's ``SqliteCheckpointer``, one file under the run's folder, which 10xGraph writes
after every step (``durable_checkpoint_every_step``): a run that finds the thread there resumes it as 10xGraph
resumes one (``ainvoke({"messages": []})`` on the same ``thread_id``), from the step the crash interrupted.
A script whose model re-plans after a restart (``new_ids_after_restart``) runs on an ``InMemoryCheckpointer``:
nothing of the crashed run survives, the restarted run asks the model again, and it answers under new ids (the
README's "When it cannot help": a crash before the model's reply was saved).

A call that replaysafe refuses to run again (in doubt under ``in_doubt="raise"``) pauses the run with 10xGraph's
``interrupt()`` (reason ``replaysafe_refused``) rather than raising: the run ends there, paused for an operator,
and the refused tool has not run again.

This module is imported by name (``tenxgraph_conformance_driver``) in the kit's child processes, which get the
import path of the process that runs the kit. Every case at every kill point, from ``integrations/tenxgraph``::

    PYTHONPATH=tests .venv312/bin/python -m replaysafe.testing.conformance tenxgraph_conformance_driver:DRIVER
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from tenxgraph.core.graph import StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import TextBlock, ToolResultBlock
from tenxgraph.storage.checkpointer import BaseCheckpointer, InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.utils.constants import END
from tenxgraph.utils.interrupt import pending_interrupt

from replaysafe.testing import Script
from replaysafe.testing.conformance import AgentRun
from replaysafe_tenxgraph import PAUSE_REASON, replay_safe_tools
from replaysafe_tenxgraph.testing import scripted_model


def route(state: AgentState) -> str:
    """ReactAgent's routing: to the ToolNode while the model asks for tools."""
    last = state.context[-1] if state.context else None
    return "TOOL" if last is not None and last.role == "assistant" and last.tools_calls else END


#: The kit's tools that fail by design (``conformance.cancel_order``: the provider acts, then raises): the
#: ToolNode answers their exception with an error result, the model reads it and the run goes on.
FAILING_TOOLS = frozenset({"cancel_order"})


def check_conversation(state: AgentState, script: Script) -> None:
    """The thread the agent ended with is whole: every call the model made answered once, by a result (an error
    only for a tool that fails by design), and the script's final text last. A replay that lost or doubled a tool
    result fails here."""
    context = state.context or []
    asked = [str(call["id"]) for m in context if m.role == "assistant" for call in m.tools_calls or []]
    may_fail = {
        str(call["id"])
        for m in context
        if m.role == "assistant"
        for call in m.tools_calls or []
        if tool_name(call) in FAILING_TOOLS
    }
    results = [block for m in context if m.role == "tool" for block in m.content if isinstance(block, ToolResultBlock)]
    answered = [block.call_id for block in results]
    failed = [block.call_id for block in results if block.is_error and block.call_id not in may_fail]
    if sorted(answered) != sorted(asked) or len(set(asked)) != len(asked) or failed:
        raise AssertionError(f"the thread's tool calls {asked} were answered by {answered} (errors: {failed})")
    final = context[-1] if context else None
    planned = next((turn for turn in script.turns if isinstance(turn, str)), "done")
    text = [block.text for block in final.content if isinstance(block, TextBlock)] if final is not None else []
    if final is None or final.role != "assistant" or final.tools_calls or text != [planned]:
        raise AssertionError(f"the thread did not end with the script's final answer: {final!r}")


def tool_name(call: Mapping[str, Any]) -> str:
    """The name of a tool call as 10xGraph keeps it on the assistant message (OpenAI's shape, or flat)."""
    function = call.get("function")
    return str(function.get("name") if isinstance(function, Mapping) else call.get("name"))


class TenxGraphDriver:
    """Runs a scenario's agent on 10xGraph."""

    #: 10xGraph's ToolNode answers a tool's exception with an error tool result (``is_error``) and the graph goes
    #: back to the model; a failure recorded under ``record_errors`` replays as ``RecordedToolError``, answered the
    #: same way. Approvals are not driven: 10xGraph pauses a tool with ``interrupt()``, the app's own flow, which
    #: this driver does not build.
    offers = frozenset({"tool_errors"})

    #: Every scenario of the kit applies to 10xGraph.
    not_applicable: Mapping[str, str] = {}

    def run(self, run: AgentRun) -> None:
        asyncio.run(self.arun(run))

    async def arun(self, run: AgentRun) -> None:
        checkpointer: BaseCheckpointer[AgentState]
        if run.script.new_ids_after_restart:
            checkpointer = InMemoryCheckpointer()  # type: ignore[no-untyped-call]
        else:
            checkpointer = SqliteCheckpointer(run.folder / "checkpoints.db")
        await checkpointer.asetup()
        functions: list[Callable[..., Any]] = list(run.tools.values())
        tools = replay_safe_tools(functions, ledger=run.ledger, **run.options) if run.protect else functions
        graph: StateGraph[AgentState] = StateGraph()
        graph.add_node("MAIN", scripted_model(run.script, boot=run.boot))
        graph.add_node("TOOL", ToolNode(tools))
        graph.add_conditional_edges("MAIN", route, {"TOOL": "TOOL", END: END})
        graph.add_edge("TOOL", "MAIN")
        graph.set_entry_point("MAIN")
        app = graph.compile(checkpointer=checkpointer)
        config = {"thread_id": run.thread_id}
        try:
            saved = await checkpointer.aget_state_cache(config) or await checkpointer.aget_state(config)
            if saved is None:  # a first run, or one whose crash left nothing saved
                ask = Message.text_message("Refund order A1 and tell the customer.", role="user")
                await app.ainvoke({"messages": [ask]}, config=config)
            elif not saved.execution_meta.is_interrupted() and saved.execution_meta.current_node != END:
                await app.ainvoke({"messages": []}, config=config)  # resume the thread where the crash left it
            state = await checkpointer.aget_state(config)
        finally:
            await app.aclose()  # and its checkpointer
        if state is None:
            raise AssertionError("the agent saved no state")
        pause = pending_interrupt(state)
        if pause is not None and pause.reason == PAUSE_REASON:
            return  # paused for an operator: replaysafe refused to run a call in doubt again
        check_conversation(state, run.script)


DRIVER = TenxGraphDriver()
