"""replaysafe for agent loops written on the Anthropic Python SDK.

Persist the model's ``Message`` before running its tool calls; on resume, process the stored
message again. ``run_tool_calls`` keys each ``tool_use`` block by ``(thread_id, Message.id,
block id)``, so a call that finished before a crash returns its recorded result instead of
running again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from anthropic.types import Message, ToolResultBlockParam, ToolUseBlock, UserMessageParam

from replaysafe import CallKey, Ledger

from ._loops import Call, as_text, runner

__all__ = ["Call", "arun_tool_calls", "run_tool_calls", "tool_calls"]


def tool_calls(message: Message, *, thread_id: str) -> list[Call]:
    """The ``tool_use`` blocks of ``message``, keyed by ``(thread_id, message.id, block.id)``.

    Server tools (``server_tool_use``) run at Anthropic and are not included.
    """
    return [
        Call(CallKey(thread_id, message.id, block.id), block.name, block.input)
        for block in message.content
        if isinstance(block, ToolUseBlock)
    ]


def _results(calls: list[Call], results: list[Any]) -> list[UserMessageParam]:
    if not calls:
        return []
    blocks = [
        ToolResultBlockParam(type="tool_result", tool_use_id=call.key.tool_call_id, content=as_text(result))
        for call, result in zip(calls, results, strict=True)
    ]
    return [UserMessageParam(role="user", content=blocks)]


def run_tool_calls(
    message: Message,
    tools: Mapping[str, Callable[..., Any]],
    *,
    thread_id: str,
    ledger: Ledger | None = None,
    pauses: Sequence[type[BaseException]] = (),
    **options: Any,
) -> list[UserMessageParam]:
    """Run the message's tool calls one by one, each at most once; the reply, ready to append.

    Returns ``[{"role": "user", "content": [{"type": "tool_result", "tool_use_id", "content"}, …]}]``,
    or ``[]`` when the message asks for no tool. ``tools`` maps tool names to functions taking the
    block's ``input`` as keyword arguments. A function decorated with ``@replay_safe`` protects
    itself; any other is protected here, with ``options`` as ``@replay_safe`` options. A result that
    is not a string is sent as JSON. A tool that raises stops the run; its error propagates and is
    not recorded, so processing the same message again replays the finished calls and runs the
    failed one again.
    """
    run = runner(tools, ledger, pauses, options)
    calls = tool_calls(message, thread_id=thread_id)
    return _results(calls, [run.run(call) for call in calls])


async def arun_tool_calls(
    message: Message,
    tools: Mapping[str, Callable[..., Any]],
    *,
    thread_id: str,
    ledger: Ledger | None = None,
    pauses: Sequence[type[BaseException]] = (),
    **options: Any,
) -> list[UserMessageParam]:
    """``run_tool_calls`` for async loops: async tools are awaited, sync ones run in a worker thread."""
    run = runner(tools, ledger, pauses, options)
    calls = tool_calls(message, thread_id=thread_id)
    return _results(calls, [await run.arun(call) for call in calls])
