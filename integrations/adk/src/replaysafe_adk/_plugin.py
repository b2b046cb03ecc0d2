"""``ReplaySafePlugin``: an ADK plugin that claims each tool call before it runs and records it after.

ADK runs a call as: plugins' ``before_tool_callback``, the agent's own before-tool callbacks, the confirmation
gate, the tool, then ``on_tool_error_callback`` (a tool that raised or was cancelled) or ``after_tool_callback``,
all in one coroutine and one ``contextvars`` context per call. The plugin splits one protected call of the core
(``@replay_safe``) across those callbacks, so that the claim, the in-doubt policy, the lease, the record and its
replay are the core's own, and ADK's gate and the agent's callbacks still run around the tool:

- ``before_tool_callback`` starts the protected call in a task of its own. Either the core answers at once (a
  finished call: its recorded response, returned so that ADK skips the tool; or one of replaysafe's refusals,
  raised), or the call's body starts, which means the claim is held: the body's context (the running call the
  core set) is copied into the call's context, so the tool sees ``current_call()`` and its ``@replay_safe``
  steps nest in the call, and ADK runs the tool.
- ``after_tool_callback`` hands the tool's response to the waiting body, which returns it: the core records it.
  A response that asks for a confirmation (or credentials) is a pause, not an outcome: the call is kept paused,
  its steps recorded, and runs again once confirmed.
- ``on_tool_error_callback`` hands the tool's error to the body: the core does not record a tool that raised
  (docs/adapters.md, section 7) unless ``record_errors=`` covers it. A cancelled call is cancelled inside the
  core too, which leaves it in doubt: the tool may have taken effect.
- A call ADK asks a human to confirm before it runs (``require_confirmation``) is not claimed then: it is kept
  paused for a decision (``replaysafe.approvals.request``). The human's answer (``ToolConfirmation``), when ADK
  hands it to the call, is recorded once as a decision bound to the call (``approvals.approve`` / ``reject``, under
  a key of the answer's own, so that a resume handing the call the same answer again does not approve it twice);
  the claim then checks the approval against the call and spends it. A tool that asks itself
  (``tool_context.request_confirmation``) pauses as above, and its confirmation is recorded the same way.
- ``after_run_callback`` / ``on_run_error_callback`` end what is left of an invocation's calls: a call whose
  after-tool or error callback never reached the plugin (a plugin listed before it answered) is left in doubt,
  not claimed for as long as the process lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import timedelta
from typing import Any, cast

from google.adk.agents.invocation_context import InvocationContext
from google.adk.platform import time as platform_time
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.adk.tools.tool_context import ToolContext

from replaysafe import (
    CONTROL_ERRORS,
    CallKey,
    Ledger,
    approvals,
    current_call_or_none,
    is_replay_safe,
    replay_safe,
    tool_call,
)

#: What the warning about a call with a missing id tells the user (the adapter is in use: the cause is elsewhere).
MISSING_IDS_FIX = (
    "ADK gives the message id as the id of the session event holding the model's function call, and none holds "
    "this call: a Workflow's tool node runs a tool under a call id ADK mints again on every run, outside any "
    'model turn. Key the tool by its arguments (ReplaySafePlugin(key="args"), or @replay_safe(key="args") '
    "on its function) or by a business key (key=function), or run it from an LlmAgent."
)


#: Who decided, in the ledger, when ``approver=`` is not given: ADK's answer does not say who gave it.
APPROVER = "adk"

#: How long the human's answer lets the call run, from when it was given (``approval_expires_in=``): 15 minutes.
APPROVAL_EXPIRES_IN = 900.0

#: ADK's function call that asks the human to confirm a call, and the name of the user's answer to it.
REQUEST_CONFIRMATION = "adk_request_confirmation"

#: What ADK's confirmation gate answers a rejected call with; the plugin answers a call whose rejection it recorded
#: the same way, so the model sees ADK's own denial.
REJECTED_RESPONSE = {"error": "This tool call is rejected."}

#: The reason recorded with a rejection given in ADK's confirmation.
REJECTED_REASON = "rejected in ADK's tool confirmation (confirmed=False)"

#: An approver's answer: who decided (``approver=``), or what the answer edits (``edited_args=``).
Approver = Callable[[ToolContext, ToolConfirmation], str]
EditedArgs = Callable[[ToolContext, ToolConfirmation], Mapping[str, Any] | None]


class _Paused(Exception):  # noqa: N818 - a signal, not an error: the call waits for a human
    """Raised inside the core's call when ADK answered it with a request for confirmation or credentials."""


@dataclasses.dataclass
class _Pending:
    """One running call between its callbacks: the body's task and what it waits for."""

    task: asyncio.Future[Any] | None
    started: asyncio.Future[contextvars.Context]
    outcome: asyncio.Future[Any]
    tool_context: ToolContext
    #: The arguments the core handed the body: the call's, or an approver's edit, which ADK then runs.
    arguments: dict[str, Any] | None = None
    tokens: list[tuple[contextvars.ContextVar[Any], contextvars.Token[Any]]] = dataclasses.field(default_factory=list)
    scope: tool_call | None = None


#: The call running in this context. ADK runs each call (its callbacks and its tool) in a context of its own,
#: so parallel calls of one turn each see their own.
_running: contextvars.ContextVar[_Pending | None] = contextvars.ContextVar("replaysafe_adk_running", default=None)


#: The call the plugin is claiming, for the body below (the tool's arguments are the body's, so that an approver's
#: edit, the complete arguments by the tool's parameter names, binds to them).
_claiming: contextvars.ContextVar[_Pending] = contextvars.ContextVar("replaysafe_adk_claiming")


async def _wait_for_adk(**arguments: Any) -> Any:
    """The body the core protects for a tool: it runs while ADK runs the tool, and returns ADK's response. It is
    handed the arguments the call runs with: the call's, or an approver's edit."""
    pending = _claiming.get()
    pending.arguments = dict(arguments)
    pending.started.set_result(contextvars.copy_context())
    return await pending.outcome


def message_id(tool_context: ToolContext) -> str | None:
    """The id of the session event that holds the call (the model's response), or ``None`` if none does.

    ADK gives every event an id when it is made and saves the model's event in the session before any of its
    calls runs, so a resumed invocation runs the call under the same event id. The latest matching event is
    the one executing.
    """
    call_id = tool_context.function_call_id
    if not call_id:
        return None
    for event in reversed(tool_context.session.events):
        if any(call.id == call_id for call in event.get_function_calls()):
            return event.id or None
    return None


def call_key(tool_context: ToolContext) -> CallKey:
    """``(session id, model event id, function call id)``; an id that cannot be found is ``""``."""
    return CallKey(tool_context.session.id or "", message_id(tool_context) or "", tool_context.function_call_id or "")


def confirmation_answer(tool_context: ToolContext) -> tuple[str, str, float] | None:
    """The user's latest answer to ADK's request to confirm this call: ``(id of the user's event holding it, id of
    the answered confirmation request, when it was given)``, or ``None`` if the session holds none.

    ADK re-runs a confirmed call from that answer, on every resume of the invocation until the call has a
    response: the plugin records each answer once, under that identity."""
    call_id = tool_context.function_call_id
    if not call_id:
        return None
    events = tool_context.session.events
    requests = set()
    for event in events:
        for call in event.get_function_calls():
            original = (call.args or {}).get("originalFunctionCall") if call.name == REQUEST_CONFIRMATION else None
            if call.id and isinstance(original, dict) and original.get("id") == call_id:
                requests.add(call.id)
    for event in reversed(events):
        if event.author != "user":
            continue
        for response in event.get_function_responses():
            if response.name == REQUEST_CONFIRMATION and response.id in requests and event.id:
                return event.id, response.id, event.timestamp
    return None


def _decorated(tool: BaseTool) -> bool:
    """Whether the tool's function is decorated with ``@replay_safe`` and protects itself."""
    return isinstance(tool, FunctionTool) and is_replay_safe(tool.func)


def _is_pause(tool_context: ToolContext) -> bool:
    """Whether ADK answered the call with a request for a human's confirmation or for credentials."""
    call_id = tool_context.function_call_id or ""
    actions = tool_context.actions
    return call_id in actions.requested_tool_confirmations or call_id in actions.requested_auth_configs


def _replayed(tool: BaseTool, recorded: Any) -> dict[str, Any]:
    """What ``before_tool_callback`` answers for a finished call: what the tool returned, as ADK passes any value
    through as the tool's. ``None`` would let the tool run: ADK's own answer for it instead (a long-running tool's
    ``None`` means its response comes later, which an empty dict says too)."""
    if recorded is None:
        return {} if tool.is_long_running else {"result": None}
    return cast("dict[str, Any]", recorded)


class ReplaySafePlugin(BasePlugin):
    """Runs each tool call of the runner at most once per ``(session, model event, function call id)``.

    Pass it as ``Runner(..., plugins=[ReplaySafePlugin(ledger)])`` or ``App(..., plugins=[...])``. A tool whose
    function is decorated with ``@replay_safe`` protects itself with its own options; the plugin hands it its
    call's ids. Any other tool's response is recorded, with ``options`` as ``@replay_safe`` options (``key=``,
    ``in_doubt=``, ``record_errors=``, ``lease=``, ``on_missing_ids=``...). ``pauses`` adds exceptions that pause
    a call (``replaysafe.register_pause``).

    ADK wraps an error raised in a plugin callback in a ``RuntimeError``: a call replaysafe refuses (in doubt
    under ``in_doubt="raise"``, a mismatch) ends the run with that ``RuntimeError``, whose ``__cause__`` is
    replaysafe's error (:func:`replaysafe_error` finds it). It never reaches the model.

    ADK's confirmations are recorded as approvals bound to the call (docs/integrations/adk.md, "Approvals"):
    ``approver`` names who decided (a str, or a function of the call's ``ToolContext`` and the
    ``ToolConfirmation``; ``"adk"`` by default), ``approval_expires_in`` how long an answer lets the call run
    (seconds or a ``timedelta`` from the answer; 15 minutes by default), and ``edited_args``, for an application
    whose confirmation lets the human edit the call, where the answer holds the edit (a function of the same two,
    returning the complete arguments by parameter name, or ``None``): ADK's answer holds no edit of its own.

    List it first in ``plugins=[...]``: ADK stops at the first plugin whose callback returns a value, so a plugin
    before it that answers a call, replaces its response or handles its error would keep it from recording the call.
    """

    def __init__(
        self,
        ledger: Ledger | None = None,
        *,
        name: str = "replaysafe",
        pauses: Sequence[type[BaseException]] = (),
        approver: str | Approver = APPROVER,
        approval_expires_in: float | timedelta = APPROVAL_EXPIRES_IN,
        edited_args: EditedArgs | None = None,
        **options: Any,
    ) -> None:
        super().__init__(name=name)
        self.ledger = ledger
        self.options = dict(options)
        self.approver = approver
        self.approval_expires_in = (
            approval_expires_in.total_seconds()
            if isinstance(approval_expires_in, timedelta)
            else float(approval_expires_in)
        )
        if not self.approval_expires_in > 0:
            raise ValueError("approval_expires_in= must be positive: an approval always expires")
        self.edited_args = edited_args
        # Records one answer of ADK's confirmation in the ledger, once: a protected call of its own, keyed by the
        # answer (session, the user's event, the answered request), so a resume that hands ADK's call the same
        # answer again finds it recorded and does not approve again what an attempt already spent.
        self._record_answer = replay_safe(name=REQUEST_CONFIRMATION, exclude_args=("by",))(self._decide)
        self._pauses: tuple[type[BaseException], ...] = (_Paused, *pauses)
        # One protected function per tool name: the core's "once per tool" warnings are per function.
        self._protected: dict[str, Callable[..., Coroutine[Any, Any, Any]]] = {}
        # The calls claimed and not yet ended, by (invocation id, function call id): see ``after_run_callback``.
        self._open: dict[tuple[str, str], _Pending] = {}

    def _scope(self, key: CallKey) -> tool_call:
        return tool_call(*key, ledger=self.ledger, pauses=self._pauses, missing_ids_fix=MISSING_IDS_FIX)

    def _protect(self, tool_name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        protected = self._protected.get(tool_name)
        if protected is None:
            protected = replay_safe(name=tool_name, **self.options)(_wait_for_adk)
            self._protected[tool_name] = protected
        return protected

    async def _decide(
        self, call: list[str], decision: str, by: str, edit: dict[str, Any] | None, answered_at: float
    ) -> str:
        """Record the human's decision in the paused call's record: what the call then runs on, once."""
        key = CallKey(*call)
        recording = current_call_or_none()
        if recording is not None and recording.attempt > 1:
            # An earlier attempt to record this answer was cut off (a crash), maybe once it had written the decision:
            # the call keeps what it has. Recorded again, the answer would be a fresh decision (an approval spent,
            # or expired by replaysafe's clock, approved anew). Only a call still undecided records it.
            known = approvals.state(key, ledger=self.ledger)
            if known is not None and (known.decision is not None or known.spent is not None or known.may_have_run):
                return known.decision.decision if known.decision is not None else decision
        try:
            if decision == "rejected":
                await approvals.areject(key, by=by, reason=REJECTED_REASON, ledger=self.ledger)
                return decision
            # The approval lives from when the human answered, however late the answer is recorded.
            left = self.approval_expires_in - max(0.0, platform_time.get_time() - answered_at)
            if left <= 0:
                return "expired"  # too old to approve anything: the call asks for a new decision
            await approvals.aapprove(key, by=by, expires_in=left, args=edit, ledger=self.ledger)
        except LookupError:
            return "unrecorded"  # no record of the call waits (the plugin came later): ADK's answer stands
        except ValueError:
            return "unrecorded"  # the call is not paused (it ran, or runs): the claim settles it
        return decision

    def _answers_recorded(self, key: CallKey) -> bool:
        """Whether the plugin records ADK's confirmations of this call as approvals: keyed by ADK's ids (a call
        keyed by its arguments or a business key is not one the approval can name before it runs)."""
        return all(key) and "key" not in self.options

    async def _take_answer(
        self, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext, key: CallKey
    ) -> dict[str, Any] | bool | None:
        """ADK's confirmation of the call, as the ledger's: ``True`` when the call waits for a human (ADK's gate
        is about to ask: nothing is claimed), a response (a rejected call: ADK's own denial), else ``None``."""
        confirmation = tool_context.tool_confirmation
        gated = await tool.check_require_confirmation(tool_args, tool_context) is True
        if confirmation is None:
            if not gated:
                return None  # no confirmation asked before the tool runs (a tool that asks itself pauses)
            guarded = cast("FunctionTool", tool).func if _decorated(tool) else self._protect(tool.name)
            try:
                await approvals.arequest(key, tool=guarded, args=tool_args, ledger=self.ledger)
            except (ValueError, TypeError):
                return None  # it ran already (the claim replays it), or its arguments do not bind
            return True
        if not confirmation.confirmed and not gated:
            return None  # the tool asked itself: ADK runs it with the rejection, for its own code to handle
        answer = confirmation_answer(tool_context)
        if answer is None:
            return None
        event_id, request_id, answered_at = answer
        decision = "approved" if confirmation.confirmed else "rejected"
        by = self.approver if isinstance(self.approver, str) else self.approver(tool_context, confirmation)
        edit = None
        if decision == "approved" and self.edited_args is not None:
            edited = self.edited_args(tool_context, confirmation)
            edit = None if edited is None else dict(edited)
        with tool_call(key.thread_id, event_id, request_id, ledger=self.ledger):
            recorded = await self._record_answer(list(key), decision, by, edit, answered_at)
        if recorded == "rejected":
            return dict(REJECTED_RESPONSE)
        return None

    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        """Claim the call: its recorded response if it finished (ADK then skips the tool), else ``None``.

        A call ADK asks a human to confirm first (``require_confirmation``) is kept paused for that decision
        instead, without a claim; the human's answer, when ADK hands it to the call, is recorded as a decision
        bound to the call (``replaysafe.approvals``), which the claim checks and spends."""
        key = call_key(tool_context)
        if self._answers_recorded(key):
            answered = await self._take_answer(tool, tool_args, tool_context, key)
            if answered is True:
                return None  # ADK's gate asks the human; the call is not claimed until the answer
            if isinstance(answered, dict):
                return answered
        loop = asyncio.get_running_loop()
        pending = _Pending(None, loop.create_future(), loop.create_future(), tool_context)
        if _decorated(tool):
            pending.scope = self._scope(key)
            pending.scope.__enter__()  # the tool claims itself, in this context, when ADK calls it
            pending.tokens.append((_running, _running.set(pending)))
            return None
        protected, scope = self._protect(tool.name), self._scope(key)

        async def claim() -> Any:
            _claiming.set(pending)
            with scope:
                return await protected(**tool_args)

        task = pending.task = asyncio.ensure_future(claim())
        await asyncio.wait({task, pending.started}, return_when=asyncio.FIRST_COMPLETED)
        if not pending.started.done():  # answered without running: a record, or a refusal (raised here)
            pending.started.cancel()
            return _replayed(tool, task.result())
        # The claim is held and the body waits: the tool runs in this context, as the body's, with the arguments
        # the core ran it with (ADK hands the tool this very dict): an approver's edit replaces the model's.
        if pending.arguments is not None and pending.arguments != tool_args:
            tool_args.clear()
            tool_args.update(pending.arguments)
        running = pending.started.result()
        current = contextvars.copy_context()
        for var, value in running.items():
            if var not in current or current[var] is not value:
                pending.tokens.append((var, var.set(value)))
        pending.tokens.append((_running, _running.set(pending)))
        self._open[_where(tool_context)] = pending
        return None

    def _leave(self, tool_context: ToolContext) -> _Pending | None:
        """The call's pending state, its context back as before the claim."""
        pending = _running.get()
        if pending is None or pending.tool_context is not tool_context:
            return None
        self._open.pop(_where(tool_context), None)
        for var, token in reversed(pending.tokens):
            var.reset(token)
        if pending.scope is not None:
            pending.scope.__exit__(None, None, None)
        return pending

    async def after_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext, result: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Record the call's response (a request for confirmation keeps the call paused instead)."""
        pending = self._leave(tool_context)
        if pending is None or pending.task is None:
            return None
        if _is_pause(tool_context):
            pending.outcome.set_exception(_Paused())
            with contextlib.suppress(_Paused):
                await pending.task
            return None
        pending.outcome.set_result(result)
        await pending.task  # recorded; replaysafe's refusals (a ledger failure...) end the run
        return None

    async def on_tool_error_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext, error: Exception
    ) -> dict[str, Any] | None:
        """A tool that raised is not recorded (unless ``record_errors=`` covers it); a cancelled one is in doubt."""
        pending = self._leave(tool_context)
        if pending is None or pending.task is None:
            return None
        if isinstance(error, asyncio.CancelledError):
            pending.task.cancel()  # the tool may have taken effect: the call stays in doubt
            await asyncio.wait({pending.task})
            return None
        pending.outcome.set_exception(error)
        try:
            await pending.task
        except CONTROL_ERRORS:
            raise
        except Exception:  # the tool's own error (or its record): ADK raises it, or another plugin answers it
            pass
        return None

    async def _settle_open(self, invocation_id: str) -> None:
        """End the calls of an invocation whose after-tool or error callback never reached this plugin (a plugin
        listed before it answered, or the run stopped): paused if ADK asked for a confirmation, else in doubt (the
        tool may have run), rather than claimed for as long as the process lives."""
        for where in [where for where in self._open if where[0] == invocation_id]:
            pending = self._open.pop(where)
            if pending.task is None or pending.task.done():
                continue
            if _is_pause(pending.tool_context):
                pending.outcome.set_exception(_Paused())
            else:
                pending.task.cancel()
            await asyncio.wait({pending.task})
            if not pending.task.cancelled():
                pending.task.exception()  # read: the pause, or a refusal nobody is left to see

    async def after_run_callback(self, *, invocation_context: InvocationContext) -> None:
        await self._settle_open(invocation_context.invocation_id)

    async def on_run_error_callback(self, *, invocation_context: InvocationContext, error: Exception) -> None:
        await self._settle_open(invocation_context.invocation_id)


def _where(tool_context: ToolContext) -> tuple[str, str]:
    return (tool_context.invocation_id, tool_context.function_call_id or str(id(tool_context)))


def replaysafe_error(error: BaseException) -> BaseException | None:
    """replaysafe's own error behind ``error`` (ADK wraps a plugin's error in a ``RuntimeError``), or ``None``."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, CONTROL_ERRORS):
            return seen
        seen = seen.__cause__
    return None
