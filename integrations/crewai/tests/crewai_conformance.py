"""The conformance kit's driver for CrewAI (``replaysafe.testing.conformance``).

A real ``Crew`` (one agent, one task) on the scripted LLM (``replaysafe_crewai.testing.ScriptedLLM``), its tools
the kit's functions made CrewAI tools with ``crewai.tools.tool``, wrapped by ``replay_safe_crew`` (the control:
left as they are). The crew runs inside a ``Flow`` with ``@persist`` on a ``SQLiteFlowPersistence`` file in the
run's folder, kicked off with the thread's id as its state id (``self.state.id``, the adapter's thread id): the
Flow saves its state once the crew answered, and a run that finds the answer there returns it. CrewAI saves
nothing inside a task, so a run killed mid-task resumes by running the task again: the model is asked again from
the start, and the calls it plans come back with the same ids (new ones for ``replan_args``), which the adapter
replays.

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import os
from typing import Any

for _name in ("CREWAI_DISABLE_TELEMETRY", "OTEL_SDK_DISABLED"):  # offline: no telemetry, no tracing prompt
    os.environ.setdefault(_name, "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import Agent, Crew, CrewOutput, Task  # noqa: E402
from crewai.flow.flow import Flow, start  # noqa: E402
from crewai.flow.persistence import SQLiteFlowPersistence, persist  # noqa: E402
from crewai.tools import BaseTool, tool  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from replaysafe.testing.conformance import AgentRun  # noqa: E402
from replaysafe_crewai import replay_safe_crew  # noqa: E402
from replaysafe_crewai.testing import ScriptedLLM  # noqa: E402


class SupportState(BaseModel):
    """What the Flow persists: its id (the thread) and the crew's answer, once it has one."""

    id: str = ""
    answer: str = ""


def build_crew(run: AgentRun, thread_id: str) -> Crew:
    tools: list[BaseTool] = [tool(name)(function) for name, function in run.tools.items()]
    agent = Agent(
        role="support",
        goal="Handle the customer's order",
        backstory="A support agent.",
        llm=ScriptedLLM(script=run.script, boot=run.boot),
        tools=tools,
        max_retry_limit=0,
    )
    task = Task(description="Handle order A1 for ana@example.com", expected_output="A sentence.", agent=agent)
    crew = Crew(agents=[agent], tasks=[task])
    return replay_safe_crew(crew, ledger=run.ledger, thread_id=thread_id, **run.options) if run.protect else crew


class CrewAIDriver:
    """Builds the crew of ``run`` inside a persisted Flow and runs it to the script's end."""

    #: CrewAI hands a tool's exception to the model as a message ("Error executing tool: ...") and the task goes
    #: on; a failure recorded under ``record_errors`` replays as ``RecordedToolError``, which takes the same path.
    #: Approvals are not driven: CrewAI asks its human about a task's answer (``human_input``), not before a tool.
    offers = frozenset({"tool_errors"})

    def run(self, run: AgentRun) -> None:
        @persist(SQLiteFlowPersistence(str(run.folder / "flows.db")))
        class SupportFlow(Flow[SupportState]):
            _skip_auto_memory = True  # CrewAI gives a Flow a vector memory (LanceDB) unless told not to: none needed

            @start()
            def handle(self) -> str:
                if not self.state.answer:
                    # The flow's persisted id is the crew's thread; an app that hands none over (the missing-ids
                    # scenario: ``run.thread_id`` is "") still persists its flow under an id of its own.
                    output = build_crew(run, self.state.id if run.thread_id else "").kickoff()
                    assert isinstance(output, CrewOutput)
                    self.state.answer = output.raw
                return str(self.state.answer)

        flow: Any = SupportFlow()
        flow.kickoff(inputs={"id": run.thread_id or "conformance-flow"})


DRIVER = CrewAIDriver()
