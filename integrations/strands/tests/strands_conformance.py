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

Pauses are Strands' too: each tool is given to the agent as a ``@tool(context=True)`` that sets a context variable
to its ``ToolContext`` while the kit's function runs (its name, description and parameters, as the model sees them,
unchanged), and ``ask`` pauses the call with ``tool_context.interrupt``. The run stops with stop_reason
``"interrupt"``; the driver, as the app, answers it with ``run.answer`` in every run (kept in the run's folder
before it is handed over, like an approval's), and Strands runs the tool again, where the interrupt returns it.

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, ClassVar

from strands import Agent, ToolContext, tool
from strands.hooks import BeforeToolCallEvent, HookRegistry
from strands.interrupt import Interrupt
from strands.session import FileSessionManager

from replaysafe import ApprovalExpiredError, ApprovalMismatchError, ApprovalRequiredError
from replaysafe.testing.conformance import APPROVER, AgentRun, ApprovalAnswer
from replaysafe_strands import ReplaySafeHooks
from replaysafe_strands.testing import ScriptedModel

PROMPT = "Handle order A1 for ana@example.com"
#: The name of the interrupt a tool waiting for its human raises (``StrandsDriver.ask``).
PAUSE = "ask_the_human"
#: The ``ToolContext`` of the tool running in this context (``with_context``), for ``StrandsDriver.ask``.
_TOOL_CONTEXT: ContextVar[ToolContext | None] = ContextVar("replaysafe_conformance_tool_context", default=None)


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


def with_context(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` taking Strands' ``ToolContext`` as ``tool_context`` (for ``@tool(context=True)``), which it
    sets for ``StrandsDriver.ask`` while ``function`` runs. Its name, docstring and other parameters are
    ``function``'s: the tool the model sees is the same."""

    def with_tool_context(**arguments: Any) -> Any:
        token = _TOOL_CONTEXT.set(arguments.pop("tool_context"))
        try:
            return function(**arguments)
        finally:
            _TOOL_CONTEXT.reset(token)

    hints = typing.get_type_hints(function, include_extras=True)
    signature = inspect.signature(function)
    parameters = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()]
    parameters.append(inspect.Parameter("tool_context", inspect.Parameter.KEYWORD_ONLY, annotation=ToolContext))
    wrapper: Any = with_tool_context
    wrapper.__signature__ = signature.replace(parameters=parameters, return_annotation=hints.get("return", Any))
    wrapper.__annotations__ = {**hints, "tool_context": ToolContext}
    wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = function.__name__, function.__qualname__, function.__doc__
    return with_tool_context


class StrandsDriver:
    """Builds the agent of ``run`` and runs it to the script's end, continuing the saved session.

    Approvals: the app keeps its human's answers in the run's folder before it hands them over, and hands them back
    when it restarts (Strands saves an interrupt unanswered until its turn ends), as an app retrying the human's
    answer does. A call the adapter refuses (no decision, an expired one, or one for other arguments) ends the run,
    waiting for a new decision.

    Pauses: a tool waits for its human with ``tool_context.interrupt`` (``ask``); the driver answers it with
    ``run.answer`` in every run, the same way (kept in the folder first, handed back on a restart).
    """

    offers = frozenset({"approvals", "pauses", "tool_errors"})

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

    def ask(self, run: AgentRun, question: str) -> str:
        """A tool waits for its human with Strands' ``tool_context.interrupt``: the first time it raises and the run
        stops with stop_reason ``"interrupt"``; Strands runs the tool again when the agent is resumed with the
        answer (``interruptResponse``), and the interrupt returns it."""
        context = _TOOL_CONTEXT.get()
        if context is None:
            raise RuntimeError("ask is called only inside a tool of the driver's agent")
        return str(context.interrupt(PAUSE, reason=question))

    def run(self, run: AgentRun) -> None:
        session = FileSessionManager(session_id=run.thread_id, storage_dir=str(run.folder / "sessions"))
        tools: list[Any] = [tool(name=name, context=True)(with_context(f)) for name, f in run.tools.items()]
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
        kept |= {id_: kept.get(id_, run.answer) for id_, interrupt in waiting.items() if interrupt.name == PAUSE}
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
            if run.approver is None and any(interrupt.name != PAUSE for interrupt in result.interrupts):
                return  # nobody answers an approval in this run: it waits
            answers = {
                interrupt.id: run.answer if interrupt.name == PAUSE else human_answer(run.approval)
                for interrupt in result.interrupts
            }
            saved.write_text(json.dumps(answers))  # kept before the answer is handed over
            prompt = _responses(answers)


def interrupted(agent: Agent) -> dict[str, Interrupt]:
    """The interrupts a restored agent waits on, by id (Strands keeps them in its session, and has no public
    accessor): the app hands back its kept answers for those, and only those (a pause's: its human's answer)."""
    state = agent._interrupt_state
    return dict(state.interrupts) if state.activated else {}


DRIVER = StrandsDriver()
