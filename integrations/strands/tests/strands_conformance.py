"""The conformance kit's driver for Strands Agents (``replaysafe.testing.conformance``).

A real ``Agent`` on the scripted model (``replaysafe_strands.testing.ScriptedModel``), its tools the kit's as
``@tool``s, with ``ReplaySafeHooks`` (the control: without). Its conversation is a ``FileSessionManager`` in
the run's folder: Strands saves every message as it enters the history, the model's toolUse message before
any of its tools runs, and a turn's tool results once all its tools have run. A run that finds the session
continues it with no new prompt: when the last message is the model's toolUse, Strands runs that turn's
calls again, under the same toolUseIds and message tracking_id, without asking the model.

Approvals are Strands' own: the app's ``BeforeToolCallEvent`` hook holds each call for its human
(``event.interrupt``) and applies the answer the Strands way (``"yes"`` runs it, an edit is assigned to
``event.tool_use``, anything else sets ``event.cancel_tool``, Strands' rejection). Strands saves the interrupt
unanswered until its turn ends, so the app keeps its human's answer in the run's folder before it hands it to the
agent, and hands it back when it restarts; ``ReplaySafeHooks`` records the answer as an approval bound to the call
(once, while the call waits for its first decision) and the call's claim spends it.

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from strands import Agent, tool
from strands.hooks import BeforeToolCallEvent, HookRegistry
from strands.session import FileSessionManager

from replaysafe import ApprovalExpiredError, ApprovalMismatchError, ApprovalRequiredError
from replaysafe.testing.conformance import APPROVER, AgentRun, ApprovalAnswer
from replaysafe_strands import ReplaySafeHooks
from replaysafe_strands.testing import ScriptedModel

PROMPT = "Handle order A1 for ana@example.com"


def finished(messages: list[Any]) -> bool:
    """Whether the conversation ends with the model's final answer (an assistant message with no toolUse)."""
    last = messages[-1] if messages else None
    return last is not None and last["role"] == "assistant" and not any("toolUse" in block for block in last["content"])


class AskTheHuman:
    """The app's approval hook (the kit's ``needs_approval`` scenarios): every call waits for its human
    (``event.interrupt``). ``"yes"`` runs it; a mapping is an edit, the arguments the human approves instead, which
    the hook applies to the call; anything else cancels it (the model reads the cancel message)."""

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self.ask)

    def ask(self, event: BeforeToolCallEvent) -> None:
        answer = event.interrupt("approve", reason="run this tool?")
        if isinstance(answer, dict):
            event.tool_use = {**event.tool_use, "input": dict(answer)}
        elif answer != "yes":
            event.cancel_tool = f"refused: {answer}"


def human_answer(approval: ApprovalAnswer) -> Any:
    """What the kit's human answers an interrupt of ``AskTheHuman``: ``"yes"``, an edit, or ``"no"``."""
    if not approval.approve:
        return "no"
    return "yes" if approval.args is None else dict(approval.args)


def _responses(answers: dict[str, Any]) -> list[Any]:
    return [{"interruptResponse": {"interruptId": key, "response": value}} for key, value in answers.items()]


class StrandsDriver:
    """Builds the agent of ``run`` and runs it to the script's end, continuing the saved session.

    Approvals: the app keeps its human's answers in the run's folder before it hands them over, and hands them back
    when it restarts (Strands saves an interrupt unanswered until its turn ends), as an app retrying the human's
    answer does. A call the adapter refuses (no decision, an expired one, or one for other arguments) ends the run,
    waiting for a new decision.
    """

    offers = frozenset({"approvals", "tool_errors"})

    #: Strands resumes a session's pending toolUse without asking the model again (it was saved before any
    #: tool ran), so a restart never re-plans a call under new ids or with other arguments: the kit's re-plans
    #: have no Strands path.
    not_applicable: ClassVar[dict[str, str]] = {
        "replan_args": (
            "Strands saves the model's toolUse message before its tools run and, resumed with no new prompt, "
            "runs those calls again under the same ids without asking the model: a killed run is never re-planned"
        ),
        "approval_args_changed": (
            "Strands saves the model's toolUse message before its tools run, and a session killed in an approved "
            "turn is restored waiting on the call's interrupt, which it resumes only with interruptResponses (any "
            "other prompt raises TypeError), running the saved toolUse again without asking the model: the call "
            "comes back with the arguments it was approved for, never re-planned with others"
        ),
        "approval_reused": (
            "Strands saves the model's toolUse message before its tools run, and a session killed in an approved "
            "turn is resumed only with interruptResponses, which run the saved toolUse again under the same "
            "toolUseIds without asking the model: no re-plan under new ids on resume; and Strands keys a "
            "BeforeToolCallEvent interrupt's answer by the call's toolUseId, so it never hands one call's answer to "
            "another (a later call with the same arguments asks again: tests/test_strands_approvals.py)"
        ),
    }

    def run(self, run: AgentRun) -> None:
        session = FileSessionManager(session_id=run.thread_id, storage_dir=str(run.folder / "sessions"))
        tools: list[Any] = [tool(name=name)(function) for name, function in run.tools.items()]
        model = ScriptedModel(run.script, boot=run.boot)
        hooks: list[Any] = [model]  # it fixes its messages' tracking_ids, as a provider fixes its ids
        if run.options.get("needs_approval"):
            hooks.append(AskTheHuman())
        if run.protect:
            expiry: dict[str, Any] = {}
            if run.approval_expires_in is not None:
                expiry["approval_expires_in"] = run.approval_expires_in  # else the hooks' default
            hooks.append(ReplaySafeHooks(run.ledger, approver=APPROVER, **expiry, **run.options))
        agent = Agent(
            model=model,
            tools=tools,
            hooks=hooks,
            session_manager=session,
            callback_handler=None,
        )
        if finished(agent.messages):
            return
        saved = run.folder / "answers.json"
        answers: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() else {}
        waiting = interrupted(agent)
        kept = {id_: answer for id_, answer in answers.items() if id_ in waiting}
        if waiting and not kept:
            return  # restored waiting for its human, and no answer was kept: it goes on waiting
        prompt: Any = _responses(kept) if kept else (None if agent.messages else PROMPT)
        while True:
            try:
                result = agent(prompt)
            except (ApprovalRequiredError, ApprovalMismatchError, ApprovalExpiredError):
                return  # the adapter refused the answer it has (spent, other arguments, expired): waits for a new one
            if result.stop_reason != "interrupt" or not result.interrupts:
                return
            if run.approver is None:
                return  # nobody answers in this run: it waits
            answers = {interrupt.id: human_answer(run.approval) for interrupt in result.interrupts}
            saved.write_text(json.dumps(answers))  # kept before the answer is handed over
            prompt = _responses(answers)


def interrupted(agent: Agent) -> set[str]:
    """The ids of the interrupts a restored agent waits on (Strands keeps them in its session, and has no public
    accessor): the app hands back its kept answers for those, and only those."""
    state = agent._interrupt_state
    return set(state.interrupts) if state.activated else set()


DRIVER = StrandsDriver()
