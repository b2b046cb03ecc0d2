"""A 10xGraph agent that refunds an order: a scripted model node, a ToolNode, and kill points.

The graph is ReactAgent's shape (``MAIN`` model node, ``TOOL`` ToolNode, back to ``MAIN``) built
with ``StateGraph``, because ReactAgent builds a provider client for its model; the model is
10xGraph's own offline ``TestAgent``, scripted to ask for ``refund_order`` after a user message and
to answer ``done`` after a tool result. Every side effect is a line in a file, so it is counted
outside the process that may be SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tenxgraph.core.graph import StateGraph
from tenxgraph.core.graph.compiled_graph import CompiledGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.qa.testing import TestAgent
from tenxgraph.qa.testing.test_agent import MockLLMResponse
from tenxgraph.storage.checkpointer import BaseCheckpointer
from tenxgraph.utils.callbacks import CallbackContext, CallbackManager, InvocationType
from tenxgraph.utils.constants import END

from replaysafe import Ledger, current_call_or_none
from replaysafe_tenxgraph import replay_safe_tools

Variant = Literal["adapter", "unprotected"]
#: Where the process SIGKILLs itself: inside the refund, after the ToolNode got the refund's result
#: (before 10xGraph's own ledger records it), or before the refund starts.
Kill = Literal["none", "in_tool", "after_tool", "before_tool"]

REFUND_OUTPUT = "Refunded 59.00 for order A1"


@dataclass(frozen=True)
class Spec:
    """One run of the scenario, as the test hands it to a child process (JSON)."""

    postgres_url: str
    schema: str
    redis_url: str
    ledger_url: str
    thread_id: str
    effects: str
    variant: Variant = "adapter"
    mode: Literal["invoke", "astream"] = "invoke"
    kill: Kill = "none"
    first: bool = True
    #: Resume a thread paused by interrupt() (``{"resume": "settled"}``).
    resume: bool = False
    in_doubt: str | None = None
    #: Two workers: each writes a line here when it reaches the ToolNode; the refund waits for two.
    arrivals: str | None = None
    #: Each worker writes the refund result its ToolNode received here.
    seen: str | None = None


def append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")


def lines(path: str | Path) -> list[str]:
    file = Path(path)
    return file.read_text(encoding="utf-8").splitlines() if file.exists() else []


def refund_effects(path: str | Path) -> list[str]:
    return [line for line in lines(path) if line.startswith("refund ")]


class ScriptedModel(TestAgent):
    """10xGraph's offline test model, answering by the last message instead of by call count.

    The call count restarts in every process, so a resumed process would ask for the tools again.
    The tool call id is ``call_1`` on every turn, as many models do; each reply gets a fresh
    message id, which 10xGraph stores with the thread's state.
    """

    async def _call_llm(self, messages: list[dict[str, Any]], tools: list[Any] | None = None, **kwargs: Any) -> Any:
        if messages and messages[-1].get("role") == "user":
            arguments = json.dumps({"order_id": "A1", "amount": 59.0})
            call = {"id": "call_1", "type": "function", "function": {"name": "refund_order", "arguments": arguments}}
            return MockLLMResponse("", "scripted", tools_calls=[call])
        return MockLLMResponse("done", "scripted")


def route(state: AgentState) -> str:
    """ReactAgent's routing: to the ToolNode while the model asks for tools."""
    last = state.context[-1] if state.context else None
    return "TOOL" if last is not None and last.role == "assistant" and last.tools_calls else END


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def build_app(spec: Spec, checkpointer: BaseCheckpointer[Any], ledger: Ledger | None) -> CompiledGraph[Any]:
    def refund_order(order_id: str, amount: float) -> str:
        """Refund an order. Moves money, so it must not run twice for one request."""
        call = current_call_or_none()
        identity = f"attempt={call.attempt} key={call.idempotency_key}" if call else "unprotected"
        append(spec.effects, f"refund {order_id} {identity}")
        if spec.kill == "in_tool":
            _kill()
        if spec.arrivals:
            _wait_for_both_workers(spec.arrivals)
        return f"Refunded {amount:.2f} for order {order_id}"

    callbacks = CallbackManager()  # type: ignore[no-untyped-call]

    def before_tool(context: CallbackContext, input_data: Any) -> Any:
        if spec.arrivals:
            append(spec.arrivals, f"arrived {os.getpid()}")
        if spec.kill == "before_tool":
            _kill()
        return input_data

    def after_tool(context: CallbackContext, input_data: Any, output: Any) -> Any:
        if spec.seen:
            append(spec.seen, str(output))
        if spec.kill == "after_tool":
            _kill()
        return output

    callbacks.register_before_invoke(InvocationType.TOOL, before_tool)
    callbacks.register_after_invoke(InvocationType.TOOL, after_tool)

    tools = [refund_order] if spec.variant == "unprotected" else replay_safe_tools([refund_order], ledger=ledger)
    graph: StateGraph[Any] = StateGraph()
    graph.add_node("MAIN", ScriptedModel())
    graph.add_node("TOOL", ToolNode(tools))
    graph.add_conditional_edges("MAIN", route, {"TOOL": "TOOL", END: END})
    graph.add_edge("TOOL", "MAIN")
    graph.set_entry_point("MAIN")
    return graph.compile(checkpointer=checkpointer, callback_manager=callbacks)


def _wait_for_both_workers(arrivals: str) -> None:
    """Hold the refund until the other worker reached the ToolNode too (bounded: 60 s)."""
    deadline = time.monotonic() + 60
    while len(lines(arrivals)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)


def run_input(spec: Spec) -> dict[str, Any]:
    """A first run brings the user's message; a resume brings nothing (or the answer to a pause)."""
    if spec.first:
        return {"messages": [Message.text_message("Refund order A1", role="user")]}
    return {"resume": "settled"} if spec.resume else {"messages": []}


def run_config(spec: Spec) -> dict[str, Any]:
    config: dict[str, Any] = {"thread_id": spec.thread_id}
    if spec.in_doubt is not None:
        config["in_doubt"] = spec.in_doubt  # read by replaysafe's tool_call.from_config
    return config


def tool_results(state: AgentState | None) -> list[dict[str, Any]]:
    """``[{"call_id", "output", "is_error"}]`` of the tool messages in a thread's state."""
    results: list[dict[str, Any]] = []
    for message in state.context if state is not None else []:
        if message.role != "tool" or not isinstance(message.content, list):
            continue
        for block in message.content:
            if getattr(block, "type", None) == "tool_result":
                results.append({"call_id": block.call_id, "output": block.output, "is_error": block.is_error})
    return results
