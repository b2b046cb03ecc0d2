"""The conformance kit's driver for the OpenAI Agents SDK (``replaysafe.testing.conformance``).

A real ``Agent`` on the scripted model (``replaysafe_openai_agents.testing.scripted_model``), its tools the
kit's as ``function_tool``s, wrapped by ``replay_safe_agent`` (the control: left as they are). Its
conversation is an ``SQLiteSession`` in a file in the run's folder: the SDK saves each turn's items there
once the turn's tools have run. A run that finds items there continues the conversation (no new input); a
run killed mid-turn left the session before that turn, so its resume asks the model again (the re-planned
call of ``replan_args`` is that ask).

Approvals (``"approvals"``) are the SDK's own: the scenario's tools are ``function_tool(needs_approval=True)``,
so the SDK interrupts the run before it calls one (``result.interruptions``). The app keeps the interrupted
run as the SDK documents, ``result.to_state().to_string()``, in a file of the run's folder; its human answers
with ``RunState.approve`` / ``reject`` on that state, which the app stores again, the answer in it, before it
resumes the run from it (``Runner.run(agent, state)``). A restarted process resumes the stored state, and the
SDK hands the answer it holds back to the call it was given for (by tool name and call id). With the adapter,
``replay_safe_agent`` records the SDK's answer as a bound replaysafe approval (by ``conformance.APPROVER``, for
``AgentRun.approval_expires_in`` seconds), once, while the call waits for its first decision. A call the
adapter refuses (``ApprovalRequiredError``, ``ApprovalMismatchError``, ``ApprovalExpiredError``: the SDK run
raises it) ends the run waiting for a new decision; a rejected call gets the SDK's rejection answer.

The SDK has no edit, and a resume with an answer never asks the model again: ``NOT_APPLICABLE`` says why.

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner, RunState, SQLiteSession, Tool, function_tool

from replaysafe import ApprovalExpiredError, ApprovalMismatchError, ApprovalRequiredError
from replaysafe.testing.conformance import APPROVER, AgentRun
from replaysafe_openai_agents import context_field, replay_safe_agent
from replaysafe_openai_agents.testing import scripted_model

PROMPT = "Handle order A1 for ana@example.com"
RUN_CONFIG = RunConfig(tracing_disabled=True)
#: What the model is told of a call its human rejected (``RunState.reject(..., rejection_message=...)``).
REJECTED = "rejected by its human"
#: The app's store of an interrupted run (``RunState.to_string()``), in the run's folder.
STATE_FILE = "run_state.json"
#: What the adapter refuses a call with: the run ends, the call waiting for a new decision.
WAITING = (ApprovalRequiredError, ApprovalMismatchError, ApprovalExpiredError)

#: Why the SDK cannot have these cases (read in its source, openai-agents 0.24).
NOT_APPLICABLE = {
    "approval_edited": (
        "the SDK has no edit: its human answers a held-back call with RunState.approve(item, always_approve=False) "
        "or RunState.reject(item, always_reject=False, rejection_message=None), and the call runs with the model's "
        "arguments or not at all"
    ),
    "approval_args_changed": (
        "a resume never asks the model again for the call: the SDK's answer is kept in the RunState taken at the "
        "interruption, which holds the model's response that asked for the call (_model_responses, "
        "_last_processed_response), and Runner.run on it resolves that interrupted turn from the stored response "
        "(resolve_interrupted_turn): the call cannot come back re-planned with other arguments"
    ),
    "approval_reused": (
        "a resume never asks the model again for the call: the SDK's answer is kept in the RunState taken at the "
        "interruption, which holds the model's response that asked for the call, and Runner.run on it resolves that "
        "interrupted turn from the stored response under the same item and call ids: no second call under new ids "
        "(and the SDK keys its answers by tool name and call id, so it hands none to another call)"
    ),
}


def _finished(items: list[Any]) -> bool:
    """Whether the conversation ends with the model's final answer (an assistant message)."""
    last = items[-1] if items else None
    return isinstance(last, dict) and last.get("role") == "assistant" and last.get("type", "message") == "message"


def _write(path: Path, text: str) -> None:
    """The app's store: the new state in full, then moved over the old one (a kill leaves one or the other)."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(path)


class AgentsDriver:
    """Builds the agent of ``run`` and runs it to the script's end, continuing the saved session, or resuming
    the run the app stored at an approval interruption."""

    offers = frozenset({"approvals"})
    not_applicable = NOT_APPLICABLE

    @staticmethod
    def _agent(run: AgentRun) -> Agent[Any]:
        options = dict(run.options)
        needs_approval = bool(options.pop("needs_approval", False))  # the SDK's own, on the tool
        tools: list[Tool] = [
            function_tool(function, name_override=name, needs_approval=needs_approval)
            for name, function in run.tools.items()
        ]
        agent: Agent[Any] = Agent(name="support", model=scripted_model(run.script, boot=run.boot), tools=tools)
        if not run.protect:
            return agent
        if run.approval_expires_in is not None:
            options["approval_expires_in"] = run.approval_expires_in
        return replay_safe_agent(agent, run.ledger, thread_id=context_field("thread_id"), approver=APPROVER, **options)

    @staticmethod
    def _answer(run: AgentRun, state: RunState[Any]) -> None:
        """The human's answer to each call the SDK holds back, given the SDK's way, on the state."""
        for item in state.get_interruptions():
            if run.approval.approve:
                state.approve(item)
            else:
                state.reject(item, rejection_message=REJECTED)

    async def _run(self, run: AgentRun) -> None:
        session = SQLiteSession(run.thread_id, run.folder / "session.db")
        stored = run.folder / STATE_FILE
        try:
            items = await session.get_items()
            if _finished(items):
                return
            agent = self._agent(run)
            start: str | list[Any] | RunState[Any] = [] if items else PROMPT
            if stored.exists():  # interrupted for an approval: resume the stored run, with what it holds
                start = await RunState.from_string(agent, stored.read_text())
            while True:
                try:
                    result = await Runner.run(
                        agent, start, session=session, context={"thread_id": run.thread_id}, run_config=RUN_CONFIG
                    )
                except WAITING:
                    return  # the adapter refused the answer it has: the call waits for a new decision
                if not result.interruptions:
                    return
                state = result.to_state()
                _write(stored, state.to_string())  # interrupted: the app keeps the run
                if run.approver is None:
                    return  # nobody answers in this run: it ends waiting
                self._answer(run, state)
                _write(stored, state.to_string())  # the answer, kept with the run before anything records it
                start = state
        finally:
            session.close()

    def run(self, run: AgentRun) -> None:
        asyncio.run(self._run(run))


DRIVER = AgentsDriver()
