"""An offline scripted agent for MCP: plays a ``replaysafe.testing.Script`` against an MCP client session.

MCP has no model of its own: an agent's model asks for tool calls, and the agent sends them over MCP. This
module stands in for the model with fixed, provider-shaped ids, so an agent can be crash-tested offline:
``play_turn(session, script, turn, thread_id=...)`` sends turn ``turn``'s calls with ``session.call_tool``,
each inside ``tool_call(thread_id, message id, tool call id)`` with the ids ``Script.ids`` gives (``style``:
``chatcmpl-…``/``call_…`` by default, ``msg_01…``/``toolu_01…`` for ``"anthropic"``), and returns their
``CallToolResult``\\ s, or the final text at the script's end. A turn's calls go out side by side, as an agent
sends a model's parallel calls. It keeps no state: turn ``n`` is the number of turns the agent has finished
(saved), so a process that resumes after a crash sends the calls, and the ids, that the crashed one sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import anyio
from mcp.types import CallToolResult

from replaysafe import tool_call
from replaysafe.testing import IdStyle, Script

__all__ = ["PlannedCall", "play_turn", "turn_calls"]


@dataclasses.dataclass(frozen=True)
class PlannedCall:
    """One tool call of a scripted turn, with the ids the model gave it."""

    message_id: str
    tool_call_id: str
    tool: str
    arguments: Mapping[str, Any]


def turn_calls(script: Script, turn: int, *, boot: int = 0, style: IdStyle = "openai-chat") -> list[PlannedCall] | str:
    """Turn ``turn``'s tool calls with their ids, or the final text. ``boot`` counts the restarts of the
    process asking (0 for its first run): it changes the ids only for a script made with
    ``new_ids_after_restart``, as a real model asked again after a crash answers with new ids."""
    answer = script.turn(turn)
    if isinstance(answer, str):
        return answer
    message_id, call_ids = script.ids(style, turn, boot)
    return [
        PlannedCall(message_id, call_id, call.tool, call.args) for call, call_id in zip(answer, call_ids, strict=True)
    ]


async def play_turn(
    session: Any,
    script: Script,
    turn: int,
    *,
    thread_id: str,
    boot: int = 0,
    style: IdStyle = "openai-chat",
) -> list[CallToolResult] | str:
    """Send turn ``turn``'s calls through ``session.call_tool`` (a ``replay_safe_session``, or the plain session
    for a control), each inside ``tool_call(thread_id, message_id, tool_call_id)``, side by side; their
    results in the script's order, or the final text when the script has no more calls."""
    calls = turn_calls(script, turn, boot=boot, style=style)
    if isinstance(calls, str):
        return calls
    results: list[CallToolResult | None] = [None] * len(calls)

    async def send(index: int, call: PlannedCall) -> None:
        async with tool_call(thread_id, call.message_id, call.tool_call_id):
            results[index] = await session.call_tool(call.tool, dict(call.arguments))

    if len(calls) == 1:
        await send(0, calls[0])
    else:
        try:
            async with anyio.create_task_group() as group:
                for index, call in enumerate(calls):
                    group.start_soon(send, index, call)
        except Exception as error:  # one call failed: raise its error, as a single call would
            inner = getattr(error, "exceptions", None)
            if inner is not None and len(inner) == 1:
                raise inner[0] from error
            raise
    return [result for result in results if result is not None]
