"""The conformance kit's driver for Pydantic AI (``replaysafe.testing.conformance``).

A real ``Agent`` on the scripted model (``replaysafe_pydantic_ai.testing.scripted_model``), its tools the
kit's, with the ``ReplaySafe`` capability (the control: without it). Its message history is kept as JSON
(``ModelMessagesTypeAdapter``) in the run's folder, saved once each turn's tools have run (at each
``ModelRequestNode``, whose request carries their returns) and when the run ends; a run finds the history
there and continues it (``message_history=``, no new prompt). A run killed mid-turn left the history before
that turn, so its resume asks the model again: the re-planned call of ``replan_args`` is that ask.

Approvals are Pydantic AI's deferred tools: a tool of a ``needs_approval`` scenario is registered with
``requires_approval=True``, so a turn that calls it ends the run with ``DeferredToolRequests``. The app (this
driver) asks its human (``AgentRun.approver``), keeps the answer in the run's folder by ``tool_call_id`` before
anything else happens, and continues the run it holds in memory with ``deferred_tool_results``
(``ToolApproved()``, ``ToolApproved(override_args=...)`` for an edit, ``ToolDenied`` for a rejection), as Pydantic
AI documents. The history is still saved only once the turn's tools ran, so a resume asks the model again; when
the model asks for a call the app kept an answer for (by its ``tool_call_id``), the app hands that answer back.
With ``ReplaySafe`` the answer is recorded as the call's bound approval; a call it refuses (asked again for a
new decision, an approval expired or for other arguments) ends the run, waiting, as a deferred call does.

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic_ai import Agent, ModelMessagesTypeAdapter, Tool
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied

from replaysafe import ApprovalExpiredError, ApprovalRequiredError, ReplayMismatchError
from replaysafe.testing.conformance import APPROVER, AgentRun
from replaysafe_pydantic_ai import ReplaySafe
from replaysafe_pydantic_ai.testing import scripted_model

PROMPT = "Handle order A1 for ana@example.com"
#: What the app tells the model of a call its human rejected (``ToolDenied``).
REJECTED = "rejected by its human"
#: The adapter's refusals of the answer a call is handed (a mismatch: other arguments than approved, or than run
#: under the key): the run ends, the call waiting for a new decision.
WAITING = (
    ApprovalRequiredError,
    ReplayMismatchError,
    ApprovalExpiredError,
)

#: A kept answer, as JSON: ``{"approve": bool, "args": {...} | None}``.
Answer = dict[str, Any]


def _finished(messages: list[ModelMessage]) -> bool:
    """Whether the history ends with the model's final answer (a response that asks for no tool)."""
    last = messages[-1] if messages else None
    return isinstance(last, ModelResponse) and not any(isinstance(part, ToolCallPart) for part in last.parts)


def _save(path: Path, messages: list[ModelMessage]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_bytes(ModelMessagesTypeAdapter.dump_json(messages))
    temporary.replace(path)  # a kill mid-write leaves the previous history whole


def _load_answers(path: Path) -> dict[str, Answer]:
    kept: dict[str, Answer] = json.loads(path.read_text()) if path.exists() else {}
    return kept


def _keep_answers(path: Path, kept: dict[str, Answer]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(kept))
    temporary.replace(path)


def _result(answer: Answer) -> ToolApproved | ToolDenied:
    """A kept answer as Pydantic AI takes it (``DeferredToolResults.approvals``)."""
    if not answer["approve"]:
        return ToolDenied(REJECTED)
    return ToolApproved(override_args=None if answer["args"] is None else dict(answer["args"]))


class PydanticAIDriver:
    """Builds the agent of ``run`` and runs it to the script's end, continuing the saved history."""

    offers = frozenset({"approvals"})

    #: A call re-planned under new ids is never handed another call's answer in Pydantic AI.
    not_applicable: ClassVar[dict[str, str]] = {
        "approval_reused": (
            "Pydantic AI hands a deferred call its answer by tool_call_id (DeferredToolResults.approvals), so a "
            "call the model re-plans under new ids is never handed the old call's answer: it is deferred and asks "
            "its human itself, with the adapter or without it (the same tool_call_id in another model response is "
            "the adapter's own test_an_approval_handed_to_a_second_call_with_the_same_arguments_asks_again)"
        ),
    }

    def _agent(self, run: AgentRun) -> Agent[None, Any]:
        options = dict(run.options)
        needs_approval = bool(options.pop("needs_approval", False))
        capabilities: list[AbstractCapability[Any]] = []
        if run.protect:
            if run.approval_expires_in is not None:
                options["approval_expires_in"] = run.approval_expires_in
            capabilities.append(ReplaySafe(run.ledger, approver=APPROVER, **options))
        return Agent(
            scripted_model(run.script, boot=run.boot),
            tools=[Tool(function, name=name, requires_approval=needs_approval) for name, function in run.tools.items()],
            capabilities=capabilities,
            output_type=[str, DeferredToolRequests] if needs_approval else str,
        )

    async def _turns(
        self, agent: Agent[None, Any], run: AgentRun, path: Path, history: list[ModelMessage], results: Any
    ) -> tuple[Any, list[ModelMessage]]:
        """Run until the agent's output (its answer, or the calls it defers): saved once each turn's tools ran."""
        prompt = None if history else PROMPT
        async with agent.iter(
            prompt, message_history=history or None, deferred_tool_results=results, conversation_id=run.thread_id
        ) as agent_run:
            async for node in agent_run:
                if Agent.is_model_request_node(node):  # the turn before it has run its tools: save it
                    await asyncio.to_thread(_save, path, [*agent_run.all_messages(), node.request])
        assert agent_run.result is not None
        return agent_run.result.output, agent_run.all_messages()

    async def _run(self, run: AgentRun, path: Path, history: list[ModelMessage]) -> None:
        agent = self._agent(run)
        answers = run.folder / "approvals.json"
        handed: set[str] = set()
        results: DeferredToolResults | None = None
        while True:
            try:
                output, history = await self._turns(agent, run, path, history, results)
            except WAITING:
                return  # the adapter refused the answer it was handed: the call waits for a new decision
            if not isinstance(output, DeferredToolRequests):
                await asyncio.to_thread(_save, path, history)
                return
            # Held back for a human: the answer the app kept for each call (by its id), else its human's, kept
            # before it is handed over. The history stays in memory: it is saved once the turn's tools ran.
            kept = await asyncio.to_thread(_load_answers, answers)
            asked = [call.tool_call_id for call in output.approvals]
            if output.calls or any(call_id in handed for call_id in asked):
                return  # answered already in this run and deferred again: it waits for a new decision
            for call_id in asked:
                if call_id not in kept:
                    if run.approver is None:
                        return  # nobody answers in this run: it waits
                    kept[call_id] = {"approve": run.approval.approve, "args": run.approval.args}
                    await asyncio.to_thread(_keep_answers, answers, kept)
            handed.update(asked)
            results = DeferredToolResults(approvals={call_id: _result(kept[call_id]) for call_id in asked})

    def run(self, run: AgentRun) -> None:
        path = run.folder / "history.json"
        history = list(ModelMessagesTypeAdapter.validate_json(path.read_bytes())) if path.exists() else []
        if not _finished(history):
            asyncio.run(self._run(run, path, history))


DRIVER = PydanticAIDriver()
