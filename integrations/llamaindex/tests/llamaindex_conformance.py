"""The conformance kit's driver for LlamaIndex (``replaysafe.testing.conformance``).

A real ``FunctionAgent`` on the scripted model (``replaysafe_llamaindex.testing.scripted_llm``), its tools the
kit's as ``FunctionTool``s, wrapped by ``replay_safe_agent`` (the control: left as it is). What survives a
crash is LlamaIndex's own: the run's ``Context``, saved with ``Context.to_dict()`` to a file in the run's
folder after every event the run streams, whenever no step but tool calls is running (``save``), with
``JsonPickleSerializer``, which keeps the agent's memory where the JSON serializer leaves it out. A run that
finds the file resumes it with ``Context.from_dict()``: the steps that were in flight run again, the tool calls
under the ids they had. A run killed before any context was saved starts again, and the model plans the same
calls under the same ids.

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, ClassVar

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.tools import FunctionTool
from llama_index.core.workflow import Context, JsonPickleSerializer

from replaysafe.testing.conformance import AgentRun
from replaysafe_llamaindex import replay_safe_agent
from replaysafe_llamaindex.testing import scripted_llm

PROMPT = "Handle order A1 for ana@example.com"
SERIALIZER = JsonPickleSerializer()


def words(text: str) -> list[str]:
    """The memory's tokenizer: a plain function, which pickles (LlamaIndex's default tiktoken encoder fetches its
    vocabulary again when unpickled)."""
    return text.split()


def resumable(data: dict[str, Any]) -> bool:
    """Whether a saved context resumes as the run stood: no step but ``call_tool`` was running.

    A step that has written to the context's state store before it ended (``run_agent_step`` appends the model's
    answer to the scratchpad, ``aggregate_tool_results`` the tools' results) is saved as still to run, beside
    its own writes: resumed, it runs again over them (the model, asked again, finds its answer already there).
    ``call_tool`` writes nothing there, so a context saved while only tool calls run resumes them cleanly.
    """
    return all(not worker["in_progress"] or step == "call_tool" for step, worker in data["workers"].items())


def save(path: Path, ctx: Context) -> None:
    """The context as it is now, if it resumes cleanly, written whole or not at all (a kill mid-write leaves
    the last one)."""
    data = ctx.to_dict(serializer=SERIALIZER)
    if not resumable(data):
        return
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


class LlamaIndexDriver:
    """Builds the agent of ``run`` and runs it to the script's end, resuming the saved ``Context``."""

    #: LlamaIndex's ``call_tool`` answers a tool's exception with an error ``ToolOutput`` the model reads, and
    #: the run goes on (the adapter hands a recorded failure back the same way). Approvals are not driven: a
    #: FunctionAgent has no approval flow of its own (an app pauses a tool with ``ctx.wait_for_event``).
    offers = frozenset({"tool_errors"})

    #: A run resumed from its saved Context never asks the model again for an answer it had planned calls from.
    not_applicable: ClassVar[dict[str, str]] = {
        "replan_args": (
            "the driver saves the Context while tool calls run, so a resume runs the planned calls under the ids "
            "they had and never asks the model to plan them again; tests/test_llamaindex.py re-plans a call "
            'under new ids in one thread (key="args" replays it) and re-parses a ReActAgent\'s answer'
        )
    }

    async def _run(self, run: AgentRun) -> None:
        done, snapshot = run.folder / "done", run.folder / "context.json"
        if done.exists():
            return
        tools: list[Any] = [FunctionTool.from_defaults(fn=function, name=name) for name, function in run.tools.items()]
        agent = FunctionAgent(name="support", tools=tools, llm=scripted_llm(run.script, boot=run.boot))
        if run.protect:
            agent = replay_safe_agent(agent, ledger=run.ledger, thread_id=run.thread_id, **run.options)
        if snapshot.exists():
            ctx = Context.from_dict(agent, json.loads(snapshot.read_text()), serializer=SERIALIZER)
            handler = agent.run(ctx=ctx)
        else:
            ctx = Context(agent)
            handler = agent.run(user_msg=PROMPT, ctx=ctx, memory=ChatMemoryBuffer.from_defaults(tokenizer_fn=words))
        async for _ in handler.stream_events():
            save(snapshot, ctx)
        await handler
        done.write_text("")

    def run(self, run: AgentRun) -> None:
        asyncio.run(self._run(run))


DRIVER = LlamaIndexDriver()
