"""The conformance kit's driver for Pydantic AI (``replaysafe.testing.conformance``).

A real ``Agent`` on the scripted model (``replaysafe_pydantic_ai.testing.scripted_model``), its tools the
kit's, with the ``ReplaySafe`` capability (the control: without it). Its message history is kept as JSON
(``ModelMessagesTypeAdapter``) in the run's folder, saved once each turn's tools have run (at each
``ModelRequestNode``, whose request carries their returns) and when the run ends; a run finds the history
there and continues it (``message_history=``, no new prompt). A run killed mid-turn left the history before
that turn, so its resume asks the model again: the re-planned call of ``replan_args`` is that ask.

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, ModelMessagesTypeAdapter, Tool
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart

from replaysafe.testing.conformance import AgentRun
from replaysafe_pydantic_ai import ReplaySafe
from replaysafe_pydantic_ai.testing import scripted_model

PROMPT = "Handle order A1 for ana@example.com"


def _finished(messages: list[ModelMessage]) -> bool:
    """Whether the history ends with the model's final answer (a response that asks for no tool)."""
    last = messages[-1] if messages else None
    return isinstance(last, ModelResponse) and not any(isinstance(part, ToolCallPart) for part in last.parts)


def _save(path: Path, messages: list[ModelMessage]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_bytes(ModelMessagesTypeAdapter.dump_json(messages))
    temporary.replace(path)  # a kill mid-write leaves the previous history whole


class PydanticAIDriver:
    """Builds the agent of ``run`` and runs it to the script's end, continuing the saved history."""

    async def _run(self, run: AgentRun, path: Path, history: list[ModelMessage]) -> None:
        capabilities: list[AbstractCapability[Any]] = [ReplaySafe(run.ledger, **run.options)] if run.protect else []
        agent = Agent(
            scripted_model(run.script, boot=run.boot),
            tools=[Tool(function, name=name) for name, function in run.tools.items()],
            capabilities=capabilities,
        )
        prompt = None if history else PROMPT
        async with agent.iter(prompt, message_history=history or None, conversation_id=run.thread_id) as agent_run:
            async for node in agent_run:
                if Agent.is_model_request_node(node):  # the turn before it has run its tools: save it
                    await asyncio.to_thread(_save, path, [*agent_run.all_messages(), node.request])
        await asyncio.to_thread(_save, path, agent_run.all_messages())

    def run(self, run: AgentRun) -> None:
        path = run.folder / "history.json"
        history = list(ModelMessagesTypeAdapter.validate_json(path.read_bytes())) if path.exists() else []
        if not _finished(history):
            asyncio.run(self._run(run, path, history))


DRIVER = PydanticAIDriver()
