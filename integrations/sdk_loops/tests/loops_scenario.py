"""Model responses and tools for the SDK-loop tests, in the test process and in child processes.

Each response asks for two tool calls, ``refund_order`` then ``send_email``, and is built with the
SDK's own pydantic model (``model_validate``) from the JSON the API sends. Every turn has its own
response id; the call ids repeat (``call_1``/``call_2``, ``toolu_1``/``toolu_2``).
Each tool appends one line to an effects file: the side effect the tests count.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from replaysafe import replay_safe

Sdk = Literal["chat", "responses", "anthropic"]
#: How the tools are protected: by the helper, or by ``@replay_safe`` (the helper supplying the ids).
Variant = Literal["helper", "decorated"]
#: The default lease: a killed owner on this machine is detected at once, without waiting for it.
LEASE = None
THREAD = "thread-1"
ARGUMENTS = ({"order_id": "A1"}, {"to": "bob@example.com"})


def chat_completion(turn: int) -> dict[str, Any]:
    calls = [
        {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        for n, name, arguments in zip((1, 2), ("refund_order", "send_email"), ARGUMENTS, strict=True)
    ]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    choice = {"index": 0, "finish_reason": "tool_calls", "message": message}
    return {"id": f"chatcmpl-{turn}", "object": "chat.completion", "created": 1, "model": "m", "choices": [choice]}


def response(turn: int) -> dict[str, Any]:
    items = [
        {
            "type": "function_call",
            "id": f"fc_{turn}_{n}",
            "call_id": f"call_{n}",
            "name": name,
            "arguments": json.dumps(arguments),
        }
        for n, name, arguments in zip((1, 2), ("refund_order", "send_email"), ARGUMENTS, strict=True)
    ]
    return {
        "id": f"resp_{turn}",
        "object": "response",
        "created_at": 1,
        "model": "m",
        "output": items,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def message(turn: int) -> dict[str, Any]:
    blocks = [
        {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": arguments}
        for n, name, arguments in zip((1, 2), ("refund_order", "send_email"), ARGUMENTS, strict=True)
    ]
    return {
        "id": f"msg_{turn}",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [{"type": "text", "text": "On it."}, *blocks],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def model_output(sdk: Sdk, turn: int) -> ChatCompletion | Response | Message:
    """The SDK object of one turn's model output."""
    if sdk == "chat":
        return ChatCompletion.model_validate(chat_completion(turn))
    if sdk == "responses":
        return Response.model_validate(response(turn))
    return Message.model_validate(message(turn))


def load(sdk: Sdk, text: str) -> ChatCompletion | Response | Message:
    """A model output persisted as JSON, validated by its SDK's model."""
    if sdk == "chat":
        return ChatCompletion.model_validate_json(text)
    if sdk == "responses":
        return Response.model_validate_json(text)
    return Message.model_validate_json(text)


def effects(path: Path) -> list[str]:
    """The side effects recorded so far, one line each."""
    return path.read_text().splitlines() if path.exists() else []


def _append(path: Path, line: str) -> None:
    with path.open("a") as file:
        file.write(line + "\n")


def build_tools(
    effects_path: Path, variant: Variant = "helper", *, crash_in_email: bool = False, asynchronous: bool = False
) -> dict[str, Callable[..., Any]]:
    """The two tools by name; ``crash_in_email`` SIGKILLs the process inside ``send_email``."""

    def refund_order(order_id: str) -> str:
        _append(effects_path, f"refund {order_id}")
        return f"refunded {order_id}"

    def send_email(to: str) -> dict[str, str]:
        _append(effects_path, f"email {to}")
        if crash_in_email:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"sent_to": to}

    async def refund_order_async(order_id: str) -> str:
        return refund_order(order_id)

    tools: dict[str, Callable[..., Any]] = {
        "refund_order": refund_order_async if asynchronous else refund_order,
        "send_email": send_email,  # a sync tool: arun_tool_calls runs it in a worker thread
    }
    if variant == "decorated":
        # Named apart from the tool, so a record shows that the decorator (not the helper) wrote it.
        return {name: replay_safe(lease=LEASE, name=f"decorated_{name}")(f) for name, f in tools.items()}
    return tools
