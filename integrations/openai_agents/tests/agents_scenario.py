"""The agent the Agents SDK tests run, in the test process and in child processes.

Its model (the SDK's own ``agents.testing.ScriptedModel``) answers with two function calls in one
response, ``refund_order`` (``call_1``) and ``send_email`` (``call_2``), then with text. Every step
has its own response id and item ids, so a new turn has new message ids while its call ids repeat.
Each tool appends one line to an effects file: the side effect the tests count.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Literal

from agents import Agent, FunctionTool, RunConfig, function_tool
from agents.run_config import ToolExecutionConfig
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from replaysafe import Ledger, replay_safe
from replaysafe_openai_agents import context_field, replay_safe_agent

#: How the tools are protected: wrapped by the adapter, decorated with ``@replay_safe`` (the adapter
#: supplying the ids), or not at all (the control that shows the SDK re-runs them).
Variant = Literal["wrapped", "decorated", "unprotected"]
#: The default lease: a killed owner on this machine is detected at once, without waiting for it.
LEASE = None
THREAD = "thread-1"
#: One tool at a time, in the model's order: the refund returns before the email starts.
RUN_CONFIG = RunConfig(tracing_disabled=True, tool_execution=ToolExecutionConfig(max_function_tool_concurrency=1))


def calls_step(turn: int) -> ModelStep:
    """The model asks for both tools; ids unique to the turn, call ids always call_1 and call_2."""
    return ModelStep(
        output=[
            function_call("refund_order", {"order_id": "A1"}, call_id="call_1", item_id=f"fc_{turn}_1"),
            function_call("send_email", {"to": "bob@example.com"}, call_id="call_2", item_id=f"fc_{turn}_2"),
        ],
        response_id=f"resp_{turn}_calls",
    )


def done_step(turn: int) -> ModelStep:
    """The model answers the tool results with text."""
    return ModelStep(output=[assistant_message("done", item_id=f"msg_{turn}")], response_id=f"resp_{turn}_done")


def effects(path: Path) -> list[str]:
    """The side effects recorded so far, one line each."""
    return path.read_text().splitlines() if path.exists() else []


def _append(path: Path, line: str) -> None:
    with path.open("a") as file:
        file.write(line + "\n")


def build_agent(
    ledger: Ledger,
    effects_path: Path,
    steps: list[ModelStep],
    variant: Variant = "wrapped",
    *,
    needs_approval: bool = False,
    crash_in_email: bool = False,
) -> Agent[Any]:
    """The agent and its two tools; ``crash_in_email`` SIGKILLs the process inside ``send_email``."""

    def refund_order(order_id: str) -> str:
        _append(effects_path, f"refund {order_id}")
        return f"refunded {order_id}"

    def send_email(to: str) -> str:
        _append(effects_path, f"email {to}")
        if crash_in_email:
            os.kill(os.getpid(), signal.SIGKILL)
        return f"sent to {to}"

    functions = [refund_order, send_email]
    if variant == "decorated":
        # Named apart from the tool, so a record shows that the decorator (not the adapter) wrote it.
        functions = [replay_safe(lease=LEASE, name=f"decorated_{f.__name__}")(f) for f in functions]
    tools: list[Any] = [function_tool(f, needs_approval=needs_approval) for f in functions]
    assert all(isinstance(tool, FunctionTool) for tool in tools)
    agent: Agent[Any] = Agent(name="support", model=ScriptedModel(steps), tools=tools)
    if variant == "unprotected":
        return agent
    return replay_safe_agent(agent, ledger, thread_id=context_field("thread_id"), lease=LEASE)
