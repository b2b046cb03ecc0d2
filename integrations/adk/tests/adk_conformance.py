"""The conformance kit's driver for Google ADK (``replaysafe.testing.conformance``).

A real ``LlmAgent`` on the scripted model (``replaysafe_adk.testing.ScriptedLlm``), its tools the kit's functions
as ADK makes them (``FunctionTool``), in a resumable ``App`` with ``ReplaySafePlugin`` (the control: without it).
Its session is ADK's ``SqliteSessionService`` on a file in the run's folder: ADK saves the model's event, with
its function calls, before any of them runs, and the calls' responses once they all ran. A run that finds the
session unfinished resumes its invocation (``Runner.run_async(invocation_id=...)``), which runs the calls that
have no saved response again under the ids it saved.

Approvals are ADK's tool confirmation: a tool of a scenario that ``needs_approval`` is a
``FunctionTool(require_confirmation=True)``, so ADK's gate asks the human with an ``adk_request_confirmation``
call and the invocation stops there. The human (``AgentRun.approver``, in the first run only) answers as ADK
documents it, a function response to that call carrying a ``ToolConfirmation(confirmed=..., payload=...)``, sent
as the user's message: ADK saves it in the session, where every resume finds it and hands it to the call again.
An edit is the application's: its answer puts the edited arguments in the payload, under ``"args"``; the plugin
reads them there (``edited_args=``), the control applies them in the agent's own ``before_tool_callback``.
A rejection is ADK's own (its gate answers ``{"error": "This tool call is rejected."}``, or the plugin the same).
A run whose call waits for an answer nobody gives (``approver`` is ``None``), or whose answer the plugin refuses
(``ApprovalRequiredError``, ``ApprovalMismatchError``, ``ApprovalExpiredError``), ends waiting for a new decision.

Pauses are ADK's confirmation asked by the tool itself: ``ask`` calls ``tool_context.request_confirmation(hint=...)``
and the tool returns without acting (the plugin keeps the call paused); the human (``AgentRun.answer``, in every
run) answers that ``adk_request_confirmation`` call with ``ToolConfirmation(confirmed=answer == "yes",
payload={"answer": answer})``, and ADK runs the tool again with it (confirmed or not: a tool that asked itself
handles a rejection itself), where ``ask`` returns the answer. The kit's tools are plain functions, which ADK hands
no ``ToolContext``: each is wrapped in a function of the same name, docstring and parameters that also takes
``tool_context`` (ADK leaves it out of the declaration the model sees) and sets it in a context variable for
``ask``. ADK's request is a final response: a run that finds one unanswered answers it, whatever the boot. A run
that ends with an answered call whose latest response is still the waiting one fails (``check_resumed``): the
answer never let the tool run again.

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, ClassVar

from google.adk.agents import LlmAgent
from google.adk.apps import App, ResumabilityConfig
from google.adk.events.event import Event
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.adk.sessions.session import Session
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from replaysafe import ApprovalExpiredError, ApprovalMismatchError, ApprovalRequiredError
from replaysafe.testing.conformance import AgentRun
from replaysafe_adk import ReplaySafePlugin, replaysafe_error
from replaysafe_adk.testing import ScriptedLlm, stable_ids

APP = "support"
USER = "ana"
PROMPT = "Handle order A1 for ana@example.com"
#: ADK's function call asking the human to confirm a call.
REQUEST_CONFIRMATION = "adk_request_confirmation"
#: The refusals that leave a call waiting for a new decision: the run ends there, as ADK's own pending confirmation.
WAITING = (ApprovalRequiredError, ApprovalMismatchError, ApprovalExpiredError)
#: What a tool that waits for its human answers the call, the first time (ADK then asks the human).
WAITING_RESPONSE = {"status": "waiting for its human"}

#: The ``ToolContext`` of the tool running in this context, for ``AdkDriver.ask``.
_tool_context: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar("adk_tool_context", default=None)


class _Asked(Exception):  # noqa: N818 - a signal, not an error: the tool waits for its human
    """Raised by ``ask`` in a tool's first run, once it asked ADK for a confirmation: the tool returns waiting."""


def given_context(function: Callable[..., Any]) -> Callable[..., Any]:
    """The kit's tool as ADK hands it its ``ToolContext``: a function of the same name, docstring and parameters,
    plus ``tool_context`` (which ADK passes, and leaves out of the declaration the model sees), that keeps it in a
    context variable for ``ask`` while the tool runs; a tool that asked returns ``WAITING_RESPONSE``."""

    @functools.wraps(function)
    def tool(*, tool_context: ToolContext, **arguments: Any) -> Any:
        token = _tool_context.set(tool_context)
        try:
            return function(**arguments)
        except _Asked:
            return dict(WAITING_RESPONSE)
        finally:
            _tool_context.reset(token)

    signature = inspect.signature(function)
    context = inspect.Parameter("tool_context", inspect.Parameter.KEYWORD_ONLY, annotation=ToolContext)
    tool.__signature__ = signature.replace(parameters=[*signature.parameters.values(), context])  # type: ignore[attr-defined]
    return tool


def told(confirmation: ToolConfirmation) -> str:
    """The human's answer in a confirmation of a tool that asked: the payload's ``"answer"``, else yes or no."""
    payload = confirmation.payload
    answer = payload.get("answer") if isinstance(payload, dict) else None
    if isinstance(answer, str):
        return answer
    return "yes" if confirmation.confirmed else "no"


def edited_args(tool_context: ToolContext, confirmation: ToolConfirmation) -> Mapping[str, Any] | None:
    """Where this application's confirmation puts the human's edit: the payload, under ``"args"``."""
    payload = confirmation.payload
    edit = payload.get("args") if isinstance(payload, dict) else None
    return edit if isinstance(edit, dict) else None


def apply_edit(tool: BaseTool, args: dict[str, Any], tool_context: ToolContext) -> dict[str, Any] | None:
    """The control's edit, the application's own way without the plugin: the agent's before-tool callback replaces
    the confirmed call's arguments with the edit in the answer's payload (ADK runs the tool with this dict)."""
    confirmation = tool_context.tool_confirmation
    edit = edited_args(tool_context, confirmation) if confirmation is not None and confirmation.confirmed else None
    if edit is not None:
        args.clear()
        args.update(edit)
    return None


def unanswered(session: Session) -> list[types.FunctionCall]:
    """ADK's confirmation requests in the session that no user's answer has answered yet."""
    answered = {
        response.id
        for event in session.events
        if event.author == "user"
        for response in event.get_function_responses()
        if response.name == REQUEST_CONFIRMATION
    }
    return [
        call
        for event in session.events
        for call in event.get_function_calls()
        if call.name == REQUEST_CONFIRMATION and call.id not in answered
    ]


def check_resumed(session: Session) -> None:
    """Every call whose tool waited for its human, answered, ran again: its latest response is not the waiting
    one (a pause kept as the call's outcome would replay it, and what the answer lets run would never run)."""
    latest = {
        response.id: response.response
        for event in session.events
        if event.author != "user"
        for response in event.get_function_responses()
        if response.name != REQUEST_CONFIRMATION
    }
    waiting = [call_id for call_id, response in latest.items() if response == WAITING_RESPONSE]
    if waiting:
        raise AssertionError(f"the calls {waiting} were answered by their human, but ADK did not run them again")


def original_tool(request: types.FunctionCall) -> str:
    """The name of the tool an ``adk_request_confirmation`` call asks about (its ``originalFunctionCall``)."""
    original = (request.args or {}).get("originalFunctionCall")
    name = original.get("name") if isinstance(original, dict) else None
    return name if isinstance(name, str) else ""


class AdkDriver:
    """Builds the agent of ``run`` and runs it to the script's end, resuming the saved invocation."""

    offers = frozenset({"approvals", "pauses"})

    #: ADK saves the model's event before its calls run and resumes an invocation under the ids it saved: a
    #: resume never asks the model again for a turn it answered, so no call is re-planned under new ids.
    not_applicable: ClassVar[dict[str, str]] = {
        "replan_args": "ADK saves the model's function calls before any runs, and a resumable app resumes them "
        "under the saved ids: the model is not asked again for that turn (tests/test_adk.py covers key='args' "
        "for a turn asked again in a new invocation)",
        "approval_args_changed": "ADK saves the model's function call (its arguments) in the session before its "
        "confirmation is asked, and the resumed invocation re-runs the confirmed call from that saved call: the "
        "model is not asked for the turn again, so the call cannot come back with other arguments after a "
        "restart (tests/test_adk_approvals.py covers a confirmed call whose arguments a plugin rewrites)",
        "approval_reused": "ADK resumes the confirmed call under the ids it saved and never asks the model again "
        "for that turn, so no call under new ids follows a restart; and ADK hands a saved confirmation only to "
        "the call its adk_request_confirmation names (originalFunctionCall.id) (tests/test_adk_approvals.py "
        "covers a second call with the same arguments in a later turn)",
        "missing_ids": "ADK runs every invocation in a session, and a session always has an id: "
        "Runner.run_async requires session_id, and create_session mints one (a uuid) when given none, so the plugin "
        "always has the conversation id; the id ADK can miss is the model event's, for a Workflow's tool node "
        "(tests/test_adk.py covers it: one UnprotectedCallWarning per tool, or MissingCallIdError)",
    }

    def ask(self, run: AgentRun, question: str) -> str:
        """A tool waits for its human with ADK's confirmation: the first time, it asks (``request_confirmation``) and
        returns without acting; ADK runs it again with the human's answer (``tool_context.tool_confirmation``)."""
        tool_context = _tool_context.get()
        if tool_context is None:
            raise RuntimeError("ask() is called outside a tool of the driver")
        confirmation = tool_context.tool_confirmation
        if confirmation is None:
            tool_context.request_confirmation(hint=question)
            raise _Asked(question)
        return told(confirmation)

    async def _drain(self, events: AsyncGenerator[Event, None]) -> bool:
        """Run the invocation to its end; ``False`` when the plugin refused the answer the call has (it waits)."""
        try:
            async for _ in events:
                pass
        except RuntimeError as error:  # ADK wraps a plugin's error: the run ends with replaysafe's own
            own = replaysafe_error(error)
            if own is None:
                raise
            if isinstance(own, WAITING):
                return False  # the call waits for a new decision
            raise own from error
        return True

    async def _run(self, run: AgentRun) -> None:
        stable_ids(f"{run.script.name}|{run.boot}")  # the same ids as an unkilled run; new ones after a restart
        service = SqliteSessionService(str(run.folder / "sessions.db"))
        options = dict(run.options)
        needs_approval = bool(options.pop("needs_approval", False))
        tools: list[Any] = [
            FunctionTool(given_context(function), require_confirmation=needs_approval)
            for function in run.tools.values()
        ]
        gated = set(run.tools) if needs_approval else set()
        plugins: list[BasePlugin] = []
        if run.protect:
            if run.approval_expires_in is not None:
                options["approval_expires_in"] = run.approval_expires_in
            plugins.append(ReplaySafePlugin(run.ledger, edited_args=edited_args, **options))
        agent = LlmAgent(
            name="support",
            model=ScriptedLlm(script=run.script),
            tools=tools,
            before_tool_callback=None if run.protect else apply_edit,
        )
        app = App(
            name=APP, root_agent=agent, plugins=plugins, resumability_config=ResumabilityConfig(is_resumable=True)
        )
        runner = Runner(app=app, session_service=service)
        try:
            session = await service.get_session(app_name=APP, user_id=USER, session_id=run.thread_id)
            if session is None:
                await service.create_session(app_name=APP, user_id=USER, session_id=run.thread_id)
                message = types.Content(role="user", parts=[types.Part(text=PROMPT)])
                events = runner.run_async(user_id=USER, session_id=run.thread_id, new_message=message)
            elif unanswered(session):  # (ADK's request is a final response: asked before that)
                events = None  # the invocation stopped for a confirmation: answered below, or left waiting
            elif session.events and session.events[-1].is_final_response():
                return
            else:
                events = runner.run_async(
                    user_id=USER, session_id=run.thread_id, invocation_id=session.events[-1].invocation_id
                )
            while True:
                if events is not None and not await self._drain(events):
                    return  # the plugin refused the answer the call has: it waits for a new decision
                session = await service.get_session(app_name=APP, user_id=USER, session_id=run.thread_id)
                asked = unanswered(session) if session is not None else []
                if not asked and session is not None:
                    check_resumed(session)
                # A tool that asked itself (a pause) is answered in every run; an approval only by an approver: with
                # nobody to answer in this run, the call waits for its human.
                asked = [call for call in asked if run.approver is not None or original_tool(call) not in gated]
                if not asked:
                    return
                message = self._answer(run, asked, gated)
                events = runner.run_async(user_id=USER, session_id=run.thread_id, new_message=message)
        finally:
            await runner.close()

    @staticmethod
    def _answer(run: AgentRun, asked: list[types.FunctionCall], gated: set[str]) -> types.Content:
        """The human's answer to each confirmation asked, as ADK documents it: a function response to its
        ``adk_request_confirmation`` call carrying a ``ToolConfirmation``. ADK's gate asked for an approval (an edit
        in the payload, under "args"); a tool that asked itself gets ``AgentRun.answer`` (in the payload, under
        "answer", and confirmed for a yes)."""
        decided = run.approval
        payload = None if decided.args is None else {"args": dict(decided.args)}
        approval = ToolConfirmation(confirmed=decided.approve, payload=payload)
        pause = ToolConfirmation(confirmed=run.answer == "yes", payload={"answer": run.answer})
        parts = [
            types.Part(
                function_response=types.FunctionResponse(
                    name=REQUEST_CONFIRMATION,
                    id=call.id,
                    response=(approval if original_tool(call) in gated else pause).model_dump(by_alias=True),
                )
            )
            for call in asked
        ]
        return types.Content(role="user", parts=parts)

    def run(self, run: AgentRun) -> None:
        asyncio.run(self._run(run))


DRIVER = AdkDriver()
