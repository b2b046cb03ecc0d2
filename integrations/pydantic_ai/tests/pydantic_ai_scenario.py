"""The agent the Pydantic AI tests run, in the test process and in child processes.

Its model (a ``FunctionModel``) answers a user prompt with two tool calls in one response,
``refund_order`` (``call_1``) and ``send_email`` (``call_2``), and answers tool results with text.
Every response gets its own ``provider_response_id`` (``resp_<n>``, n counting the responses of
the conversation), so a new turn has a new message id while its tool call ids repeat.
Each tool appends one line to an effects file: the side effect the tests count.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from replaysafe import Ledger, replay_safe
from replaysafe_pydantic_ai import ReplaySafe

#: How the tools are protected: by the capability, by ``@replay_safe`` (with the capability
#: supplying the ids), or not at all (the control that shows the framework re-runs them).
Variant = Literal["capability", "decorated", "unprotected"]
#: The default lease: a killed owner on this machine is detected at once, without waiting for it.
LEASE = None


def script(*, provider_ids: bool = True) -> Callable[[list[ModelMessage], AgentInfo], ModelResponse]:
    """The model: two tool calls for a user prompt, text for tool results."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        number = sum(isinstance(message, ModelResponse) for message in messages) + 1
        response_id = f"resp_{number}" if provider_ids else None
        last = messages[-1]
        if isinstance(last, ModelRequest) and any(isinstance(part, ToolReturnPart) for part in last.parts):
            return ModelResponse(parts=[TextPart("done")], provider_response_id=response_id)
        calls = [
            ToolCallPart("refund_order", {"order_id": "A1"}, tool_call_id="call_1"),
            ToolCallPart("send_email", {"to": "bob@example.com"}, tool_call_id="call_2"),
        ]
        return ModelResponse(parts=calls, provider_response_id=response_id)

    return respond


def effects(path: Path) -> list[str]:
    """The side effects recorded so far, one line each."""
    return path.read_text().splitlines() if path.exists() else []


def _append(path: Path, line: str) -> None:
    with path.open("a") as file:
        file.write(line + "\n")


def build_agent(
    ledger: Ledger,
    effects_path: Path,
    variant: Variant = "capability",
    *,
    crash_in_email: bool = False,
    email_needs_approval: bool = False,
    email_deferred: bool = False,
    provider_ids: bool = True,
    record_errors: bool = False,
) -> Agent[None, Any]:
    """The agent with its two tools; ``crash_in_email`` SIGKILLs the process inside ``send_email``."""

    def refund_order(order_id: str) -> dict[str, Any]:
        _append(effects_path, f"refund {order_id}")
        return {"order_id": order_id, "refunded": True}

    def send_email(ctx: RunContext[None], to: str) -> str:
        if email_needs_approval and not ctx.tool_call_approved:
            raise ApprovalRequired()
        if email_deferred:
            raise CallDeferred()  # handed to an external system: its result comes back later
        _append(effects_path, f"email {to}")
        if crash_in_email:
            os.kill(os.getpid(), signal.SIGKILL)
        return f"sent to {to}"

    functions: Sequence[Callable[..., Any]] = [refund_order, send_email]
    if variant == "decorated":
        # Named apart from the tool, so a record shows that the decorator (not the capability) wrote it.
        # A RunContext is not data: a decorated tool leaves it out of its argument digest.
        functions = [
            replay_safe(lease=LEASE, name="decorated_refund_order", record_errors=record_errors)(refund_order),
            replay_safe(lease=LEASE, name="decorated_send_email", exclude_args=("ctx",), record_errors=record_errors)(
                send_email
            ),
        ]
    # sequential: the refund returns before the email starts, so the crash comes after it.
    tools = [Tool(function, sequential=True) for function in functions]
    capabilities = [] if variant == "unprotected" else [ReplaySafe(ledger, lease=LEASE, record_errors=record_errors)]
    return Agent(
        FunctionModel(script(provider_ids=provider_ids)),
        tools=tools,
        capabilities=capabilities,
        output_type=[str, DeferredToolRequests],
    )
