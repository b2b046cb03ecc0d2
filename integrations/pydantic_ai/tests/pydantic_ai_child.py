"""Child process of the Pydantic AI crash tests.

Usage: ``pydantic_ai_child.py first|resume HISTORY LEDGER EFFECTS VARIANT``

``first`` runs the agent from a user prompt, writes the message history to HISTORY once the model
has answered (before any tool runs), and is SIGKILLed inside ``send_email``. ``resume`` re-runs
that history in this new process and prints the tool results as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, cast

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest, ToolReturnPart

from replaysafe import SqliteLedger

from pydantic_ai_scenario import Variant, build_agent


async def first(agent: Agent[None, Any], history: Path) -> None:
    """Run from a user prompt, persisting the history when the model has asked for the tools."""
    saved = False
    async with agent.iter("Refund order A1 and tell bob") as run:
        async for node in run:
            if Agent.is_call_tools_node(node) and not saved:
                await asyncio.to_thread(history.write_bytes, ModelMessagesTypeAdapter.dump_json(run.all_messages()))
                saved = True


async def resume(agent: Agent[None, Any], history: Path) -> dict[str, Any]:
    """Re-run the persisted history; the run's output and each tool call's returned content."""
    messages = ModelMessagesTypeAdapter.validate_json(await asyncio.to_thread(history.read_bytes))
    result = await agent.run(None, message_history=messages)
    returns = {
        part.tool_call_id: part.content
        for message in result.new_messages()
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }
    return {"output": result.output, "returns": returns}


def main() -> None:
    mode, history, ledger_path, effects_path, variant = sys.argv[1:]
    with SqliteLedger(ledger_path) as ledger:
        agent = build_agent(ledger, Path(effects_path), cast(Variant, variant), crash_in_email=mode == "first")
        if mode == "first":
            asyncio.run(first(agent, Path(history)))
        else:
            print(json.dumps(asyncio.run(resume(agent, Path(history)))))


if __name__ == "__main__":
    main()
