"""The conformance kit's driver for Strands Agents (``replaysafe.testing.conformance``).

A real ``Agent`` on the scripted model (``replaysafe_strands.testing.ScriptedModel``), its tools the kit's as
``@tool``s, with ``ReplaySafeHooks`` (the control: without). Its conversation is a ``FileSessionManager`` in
the run's folder: Strands saves every message as it enters the history, the model's toolUse message before
any of its tools runs, and a turn's tool results once all its tools have run. A run that finds the session
continues it with no new prompt: when the last message is the model's toolUse, Strands runs that turn's
calls again, under the same toolUseIds and message tracking_id, without asking the model.

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from strands import Agent, tool
from strands.hooks import BeforeToolCallEvent, HookRegistry
from strands.session import FileSessionManager

from replaysafe import ApprovalRequiredError
from replaysafe.testing.conformance import AgentRun
from replaysafe_strands import ReplaySafeHooks
from replaysafe_strands.testing import ScriptedModel

PROMPT = "Handle order A1 for ana@example.com"


def finished(messages: list[Any]) -> bool:
    """Whether the conversation ends with the model's final answer (an assistant message with no toolUse)."""
    last = messages[-1] if messages else None
    return last is not None and last["role"] == "assistant" and not any("toolUse" in block for block in last["content"])


class AskTheHuman:
    """The app's approval hook (the kit's ``needs_approval`` scenarios): every call waits for its human
    (``event.interrupt``); an answer other than ``"yes"`` cancels it."""

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self.ask)

    def ask(self, event: BeforeToolCallEvent) -> None:
        answer = event.interrupt("approve", reason="run this tool?")
        if answer != "yes":
            event.cancel_tool = f"refused: {answer}"


def _responses(answers: dict[str, str]) -> list[Any]:
    return [{"interruptResponse": {"interruptId": key, "response": value}} for key, value in answers.items()]


class StrandsDriver:
    """Builds the agent of ``run`` and runs it to the script's end, continuing the saved session.

    Approvals: the app keeps its human's answers in the run's folder and hands them back when it restarts
    (Strands saves an interrupt unanswered until its turn ends), as an app retrying the human's answer does.
    """

    offers = frozenset({"approvals", "tool_errors"})

    #: Strands resumes a session's pending toolUse without asking the model again (it was saved before any
    #: tool ran), so a restart never re-plans a call under new ids: the kit's re-plan has no Strands path.
    not_applicable: ClassVar[dict[str, str]] = {
        "replan_args": (
            "Strands saves the model's toolUse message before its tools run and, resumed with no new prompt, "
            "runs those calls again under the same ids without asking the model: a killed run is never re-planned"
        )
    }

    def run(self, run: AgentRun) -> None:
        session = FileSessionManager(session_id=run.thread_id, storage_dir=str(run.folder / "sessions"))
        tools: list[Any] = [tool(name=name)(function) for name, function in run.tools.items()]
        model = ScriptedModel(run.script, boot=run.boot)
        hooks: list[Any] = [model]  # it fixes its messages' tracking_ids, as a provider fixes its ids
        if run.options.get("needs_approval"):
            hooks.append(AskTheHuman())
        if run.protect:
            hooks.append(ReplaySafeHooks(run.ledger, **run.options))
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
        answers: dict[str, str] = json.loads(saved.read_text()) if saved.exists() else {}
        prompt: Any = _responses(answers) if answers and run.boot else (None if agent.messages else PROMPT)
        while True:
            try:
                result = agent(prompt)
            except ApprovalRequiredError:
                return  # asked again (in doubt after it ran on its approval): waits for a new decision
            if result.stop_reason != "interrupt" or not result.interrupts:
                return
            if run.approver is None:
                return  # nobody answers in this run: it waits
            answers = {interrupt.id: "yes" for interrupt in result.interrupts}
            saved.write_text(json.dumps(answers))  # kept before the answer is handed over
            prompt = _responses(answers)


DRIVER = StrandsDriver()
