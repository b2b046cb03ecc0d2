"""The conformance kit's driver for the OpenAI Agents SDK (``replaysafe.testing.conformance``).

A real ``Agent`` on the scripted model (``replaysafe_openai_agents.testing.scripted_model``), its tools the
kit's as ``function_tool``s, wrapped by ``replay_safe_agent`` (the control: left as they are). Its
conversation is an ``SQLiteSession`` in a file in the run's folder: the SDK saves each turn's items there
once the turn's tools have run. A run that finds items there continues the conversation (no new input); a
run killed mid-turn left the session before that turn, so its resume asks the model again (the re-planned
call of ``replan_args`` is that ask).

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents import Agent, RunConfig, Runner, SQLiteSession, Tool, function_tool

from replaysafe.testing.conformance import AgentRun
from replaysafe_openai_agents import context_field, replay_safe_agent
from replaysafe_openai_agents.testing import scripted_model

PROMPT = "Handle order A1 for ana@example.com"
RUN_CONFIG = RunConfig(tracing_disabled=True)


def _finished(items: list[Any]) -> bool:
    """Whether the conversation ends with the model's final answer (an assistant message)."""
    last = items[-1] if items else None
    return isinstance(last, dict) and last.get("role") == "assistant" and last.get("type", "message") == "message"


class AgentsDriver:
    """Builds the agent of ``run`` and runs it to the script's end, continuing the saved session."""

    async def _run(self, run: AgentRun) -> None:
        session = SQLiteSession(run.thread_id, run.folder / "session.db")
        try:
            items = await session.get_items()
            if _finished(items):
                return
            tools: list[Tool] = [function_tool(function, name_override=name) for name, function in run.tools.items()]
            agent: Agent[Any] = Agent(name="support", model=scripted_model(run.script, boot=run.boot), tools=tools)
            if run.protect:
                agent = replay_safe_agent(agent, run.ledger, thread_id=context_field("thread_id"), **run.options)
            await Runner.run(
                agent,
                [] if items else PROMPT,
                session=session,
                context={"thread_id": run.thread_id},
                run_config=RUN_CONFIG,
            )
        finally:
            session.close()

    def run(self, run: AgentRun) -> None:
        asyncio.run(self._run(run))


DRIVER = AgentsDriver()
