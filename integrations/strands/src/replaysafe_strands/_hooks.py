"""``ReplaySafeHooks``: each Strands tool call keyed by (thread, assistant message's tracking id, toolUseId).

Strands runs a tool in ``ToolExecutor._stream``: ``BeforeToolCallEvent`` hooks may swap the tool that runs
(``selected_tool``), the tool streams its events, ending with a ``ToolResultEvent``, and ``AfterToolCallEvent``
hooks see the result and the exception a failing tool raised. The hooks here:

- ``BeforeToolCallEvent``: read the call's three ids and swap ``selected_tool`` for a tool that runs the
  original inside ``replaysafe.tool_call(...)``. A tool whose function is decorated with ``@replay_safe``
  protects itself there; any other tool is run through a function protected with ``replay_safe``, which
  records its result (status and content) or, when the call finished before, returns the record without
  running it. The claim is taken inside the swapped tool, not in the hook: a call that a hook interrupts or
  cancels never holds one.
- Approvals: a ``BeforeToolCallEvent`` hook that holds the call for a human (``event.interrupt(...)``) is seen by
  the swap, which runs after every other hook. While the interrupt waits, the call is kept paused for a
  decision (``approvals.request``); once the human's answer is handed back (the agent resumed with an
  ``interruptResponse``) and the hooks ran with it, the outcome is recorded as a bound approval: the call
  cancelled (``cancel_tool``) is rejected, else approved, with an edit when a hook replaced the model's input
  (``event.tool_use``). The claim then checks the call against it and spends it.
- ``AfterToolCallEvent``: end the run when the call failed with one of replaysafe's own ``CONTROL_ERRORS``
  (a call in doubt under ``in_doubt="raise"``, a mismatch, a ledger failure...). Strands turns every tool
  exception into an error result for the model, and a model that reads one only asks for the same side
  effect again under a new toolUseId.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from strands.hooks import AfterToolCallEvent, BeforeToolCallEvent, HookOrder, HookRegistry
from strands.interrupt import Interrupt, InterruptException
from strands.types._events import ToolInterruptEvent  # the one event a paused tool yields; not re-exported
from strands.types.events import ToolResultEvent
from strands.types.exceptions import EventLoopException
from strands.types.tools import AgentTool, ToolGenerator, ToolResult, ToolSpec, ToolUse

from replaysafe import (
    CONTROL_ERRORS,
    ApprovalRejectedError,
    CallKey,
    Ledger,
    RecordedToolError,
    ReplayMismatchError,
    ReplaySafeError,
    Status,
    approvals,
    is_replay_safe,
    replay_safe,
    tool_call,
)

#: The app's thread id: a fixed string, or a function of the ``BeforeToolCallEvent``.
ThreadId = str | Callable[[BeforeToolCallEvent], str | None]

#: What the warning about a call with a missing id tells the user (the adapter is in use: the cause is elsewhere).
MISSING_IDS_FIX = (
    "A thread id is missing when the agent has no session manager and the invocation carries no "
    'invocation_state={"thread_id": ...}: give the agent a session manager (FileSessionManager, ...), pass '
    "the thread id with each invocation, or ReplaySafeHooks(thread_id=...). A message id is missing when no "
    "assistant message in agent.messages holds the call (a direct call, agent.tool.<name>(...), whose "
    'toolUseId is minted anew on every call): key such a tool by its arguments (@replay_safe(key="args"), '
    'or ReplaySafeHooks(key="args")) or by a business key (key=function).'
)


def session_thread_id(event: BeforeToolCallEvent) -> str | None:
    """The thread id of a call: ``invocation_state["thread_id"]``, else ``"<session id>/<agent id>"`` of an agent
    whose session manager has a session id, else ``None``. The session id is the manager's: the agent's own is
    random, new in every process, when it has no manager or its manager was given none."""
    given = event.invocation_state.get("thread_id")
    if isinstance(given, str) and given:
        return given
    agent = event.agent
    manager = getattr(agent, "_session_manager", None)
    if manager is None:
        return None
    session_id = getattr(manager, "session_id", None)
    agent_id = getattr(agent, "agent_id", None)
    return f"{session_id}/{agent_id}" if session_id and agent_id else None


def message_id(agent: object, tool_use_id: str) -> str | None:
    """The ``tracking_id`` of the latest assistant message in ``agent.messages`` holding the call, or ``None``.

    Strands gives every message a UUID when it enters the history and saves it with the message in the
    session, before any of the message's tools runs: a process that resumes the session runs the pending
    calls under the same id. Scanning backwards finds the message executing now, so a toolUseId that a model
    reuses on every turn (``call_1``) is still a new call on a new turn.
    """
    messages = getattr(agent, "messages", None) or []
    for message in reversed(messages):
        if message.get("role") != "assistant":
            continue
        for block in message.get("content", []):
            use = block.get("toolUse") if isinstance(block, Mapping) else None
            if isinstance(use, Mapping) and use.get("toolUseId") == tool_use_id:
                tracking_id = message.get("tracking_id")
                return tracking_id if isinstance(tracking_id, str) and tracking_id else None
    return None


def call_key(event: BeforeToolCallEvent, thread_id: ThreadId | None = None) -> CallKey:
    """``(thread_id, message_id, tool_call_id)`` of the call about to run; an id that cannot be found is ``""``."""
    if thread_id is None:
        thread = session_thread_id(event)
    else:
        thread = thread_id if isinstance(thread_id, str) else thread_id(event)
    tool_use_id = str(event.tool_use.get("toolUseId") or "")
    message = (message_id(event.agent, tool_use_id) or "") if tool_use_id else ""
    return CallKey(thread or "", message, tool_use_id)


def model_input(agent: object, tool_use_id: str) -> Mapping[str, Any] | None:
    """The input the model gave the call ``tool_use_id`` in the latest assistant message holding it, or ``None``."""
    for message in reversed(getattr(agent, "messages", None) or []):
        if message.get("role") != "assistant":
            continue
        for block in message.get("content", []):
            use = block.get("toolUse") if isinstance(block, Mapping) else None
            if isinstance(use, Mapping) and use.get("toolUseId") == tool_use_id:
                given = use.get("input")
                return given if isinstance(given, Mapping) else None
    return None


def approval_interrupts(event: BeforeToolCallEvent) -> list[Interrupt]:
    """The interrupts ``BeforeToolCallEvent`` hooks raised for this call (``event.interrupt(name)``), answered or not.

    Strands keeps them in the agent's interrupt state (restored from the session), each under the id the event
    gives its name: an interrupt of this call's hooks is one whose id is ``event._interrupt_id(its name)``.
    """
    state = getattr(event.agent, "_interrupt_state", None)
    interrupts: Mapping[str, Interrupt] = getattr(state, "interrupts", None) or {}
    return [interrupt for interrupt in interrupts.values() if interrupt.id == event._interrupt_id(interrupt.name)]


#: Who approved, when ``approver=`` is not given: the answer came through a Strands interrupt.
DEFAULT_APPROVER = "strands-interrupt"

#: The approver of a call: a fixed name, or a function of the ``BeforeToolCallEvent`` and the answered interrupts.
Approver = str | Callable[[BeforeToolCallEvent, list[Interrupt]], str]


def _is_replay_safe(tool: AgentTool) -> bool:
    """Whether the tool's Python function is decorated with ``@replay_safe`` (``@tool`` keeps it as ``__wrapped__``)."""
    return is_replay_safe(getattr(tool, "__wrapped__", None))


class _UnrecordedError(Exception):
    """The tool answered with an error result of its own (``status="error"``): not recorded, as a raise is not."""


class _Run:
    """One run of the original tool's stream, its events kept to be passed on once the call is settled."""

    def __init__(self, tool: AgentTool, tool_use: ToolUse, invocation_state: dict[str, Any], kwargs: Any) -> None:
        self.tool, self.tool_use, self.invocation_state, self.kwargs = tool, tool_use, invocation_state, kwargs
        self.events: list[Any] = []

    async def collect(self) -> None:
        """Stream the tool, keeping its events (a decorated tool protects itself while it runs)."""
        async for event in self.tool.stream(self.tool_use, self.invocation_state, **self.kwargs):
            self.events.append(event)

    async def __call__(self) -> dict[str, Any]:
        """Stream the tool; return what is recorded (its result's status and content), or raise what is not."""
        async for event in self.tool.stream(self.tool_use, self.invocation_state, **self.kwargs):
            self.events.append(event)
            if isinstance(event, ToolInterruptEvent):
                # The tool paused for a human (tool_context.interrupt): raised here, the call is kept paused
                # with its completed steps, and runs again when the agent is resumed.
                raise InterruptException(event.interrupts[0])
        if not self.events:
            raise _UnrecordedError
        last = self.events[-1]
        result = cast(ToolResult, last.tool_result if isinstance(last, ToolResultEvent) else last)
        error = last.exception if isinstance(last, ToolResultEvent) else None
        if error is not None:
            raise error  # not recorded; @replay_safe(record_errors=...) options still see its type
        if not isinstance(result, Mapping) or result.get("status") != "success":
            raise _UnrecordedError
        return {"status": result["status"], "content": result.get("content", [])}


async def _execute(arguments: Any, run: _Run) -> dict[str, Any]:
    """The body protected for an undecorated tool: the tool's own stream. ``arguments`` is the digested input."""
    return await run()


class _ReplaySafeTool(AgentTool):
    """The tool a ``BeforeToolCallEvent`` swapped in: the original, run once per call key."""

    def __init__(self, tool: AgentTool, key: CallKey, hooks: ReplaySafeHooks) -> None:
        super().__init__()
        self._tool, self._key, self._hooks = tool, key, hooks

    @property
    def tool_name(self) -> str:
        return self._tool.tool_name

    @property
    def tool_spec(self) -> ToolSpec:
        return self._tool.tool_spec

    @property
    def tool_type(self) -> str:
        return self._tool.tool_type

    async def stream(self, tool_use: ToolUse, invocation_state: dict[str, Any], **kwargs: Any) -> ToolGenerator:
        # The events are yielded after the call is settled, outside tool_call(...): its context variable is set
        # and reset in this task, never across a yield.
        run = _Run(self._tool, tool_use, invocation_state, kwargs)
        for event in await self._hooks._run(self._tool, self._key, run):
            yield event


def _strands_error(kind: type[ReplaySafeError]) -> type[ReplaySafeError]:
    """``kind``, also an ``EventLoopException``: named as it is, so ``except CallInDoubtError`` catches it."""
    return type(kind.__name__, (kind, EventLoopException), {"__module__": __name__, "__doc__": kind.__doc__})


#: Each of replaysafe's ``CONTROL_ERRORS`` as an ``EventLoopException`` too. Strands' event loop lets an
#: ``EventLoopException`` out as it is and wraps any other error in one: an agent stopped by a call in doubt
#: would raise ``EventLoopException``, which an app's ``except CallInDoubtError`` (and ``replaysafe crashtest
#: --policy raise``) does not catch.
_STRANDS_ERRORS: dict[type[ReplaySafeError], type[ReplaySafeError]] = {
    kind: _strands_error(kind) for kind in CONTROL_ERRORS
}


def _surfacing(error: ReplaySafeError) -> ReplaySafeError:
    """``error`` made an ``EventLoopException`` too (its class swapped for the subclass above)."""
    if isinstance(error, EventLoopException):
        return error
    kind = next((pair for plain, pair in _STRANDS_ERRORS.items() if type(error) is plain), None)
    if kind is None:  # a subclass of one of them: its own pair, made once
        kind = _STRANDS_ERRORS.setdefault(type(error), _strands_error(type(error)))
    error.__class__ = kind
    error.original_exception = error  # type: ignore[attr-defined]  # what EventLoopException.__init__ sets
    error.request_state = {}  # type: ignore[attr-defined]
    return error


class ReplaySafeHooks:
    """A Strands ``HookProvider``: ``Agent(hooks=[ReplaySafeHooks(ledger)])`` runs each tool call at most once
    per ``(thread, assistant message, toolUseId)``, however often a resumed session asks for it.

    ``ledger``: where calls are recorded (default: replaysafe's default ledger). ``thread_id``: the
    conversation's id, a string or a function of the ``BeforeToolCallEvent``; by default
    ``invocation_state["thread_id"]``, else ``"<session id>/<agent id>"`` of an agent with a session manager.
    ``pauses``: exceptions that pause a call besides Strands' ``InterruptException``. ``approver``: who decided a
    call a ``BeforeToolCallEvent`` hook held for a human (a name, or a function of the event and its answered
    interrupts; default ``"strands-interrupt"``), and ``approval_expires_in``: for how many seconds such an
    approval may be spent (15 minutes). Any other keyword is a
    ``@replay_safe`` option for the tools this provider protects (``key="args"``, ``in_doubt="raise"``,
    ``record_errors=...``, ``lease=...``); a tool whose function is decorated with ``@replay_safe`` keeps its own.
    """

    def __init__(
        self,
        ledger: Ledger | None = None,
        *,
        thread_id: ThreadId | None = None,
        pauses: tuple[type[BaseException], ...] = (),
        approver: Approver = DEFAULT_APPROVER,
        approval_expires_in: float = 900,
        **options: Any,
    ) -> None:
        self.ledger = ledger
        self.thread_id = thread_id
        self.approver = approver
        self.approval_expires_in = approval_expires_in
        self.pauses: tuple[type[BaseException], ...] = (InterruptException, *pauses)
        self.options: Mapping[str, Any] = dict(options)
        # One protected function per tool name, so that a warning the core says once per tool (a missing id,
        # no ledger) is said once per tool, not once per call.
        self._protected: dict[str, Callable[..., Any]] = {}

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Strands' ``HookProvider`` protocol. The swap runs last, so it keys the call other hooks settled on."""
        registry.add_callback(BeforeToolCallEvent, self.before_tool_call, order=HookOrder.SDK_LAST)
        registry.add_callback(AfterToolCallEvent, self.after_tool_call)

    async def before_tool_call(self, event: BeforeToolCallEvent) -> None:
        """Record a hook's approval interrupt and its answer; swap ``selected_tool`` for one that runs it once per
        call key (left alone: no tool, a cancelled call)."""
        tool = event.selected_tool
        if tool is None or isinstance(tool, _ReplaySafeTool):
            return
        key = call_key(event, self.thread_id)
        asked = approval_interrupts(event)
        if asked and all(key):
            await self._approval(event, tool, key, asked)
        if not event.cancel_tool:
            event.selected_tool = _ReplaySafeTool(tool, key, self)

    async def _approval(
        self, event: BeforeToolCallEvent, tool: AgentTool, key: CallKey, asked: list[Interrupt]
    ) -> None:
        """The call is held for a human (an interrupt unanswered): keep it paused for a decision. Answered: record
        the outcome the hooks settled on as the decision, once, on the call as it was requested.

        ``approvals.request`` returns the call's record: its first attempt is the request itself. A record that
        moved on (decided already, run, in doubt after a run on an approval) is never decided again from the
        same answer: an answer handed back again (a process killed in the approved tool, resumed with it) does
        not approve a second run; the claim then asks for a new decision (``ApprovalRequiredError``).
        """
        tool_use_id = key.tool_call_id
        requested = model_input(event.agent, tool_use_id)
        current = event.tool_use.get("input")
        if requested is None:
            requested = current if isinstance(current, Mapping) else {}
        protected, arguments = self._approval_target(tool, requested)
        try:
            record = await approvals.arequest(key, tool=protected, args=arguments, ledger=self.ledger)
        except (ValueError, TypeError, ReplayMismatchError):
            # Finished already (it replays), or requested for other arguments (the claim refuses them), or a
            # tool whose parameters are not its input alone: nothing to decide here.
            return
        if any(interrupt.response is None for interrupt in asked):
            return  # still waiting: the request is kept
        if record.status is not Status.PAUSED or record.attempt != 1:
            return
        by = self.approver if isinstance(self.approver, str) else self.approver(event, asked)
        if event.cancel_tool:
            reason = event.cancel_tool if isinstance(event.cancel_tool, str) else "tool cancelled by user"
            await approvals.areject(key, by=by, reason=reason, ledger=self.ledger)
            return
        edit = None
        if isinstance(current, Mapping) and dict(current) != dict(requested):
            _, edit = self._approval_target(tool, current)  # the hook applied an edit from the answer
        await approvals.aapprove(key, by=by, expires_in=self.approval_expires_in, args=edit, ledger=self.ledger)

    def _approval_target(self, tool: AgentTool, given: Mapping[str, Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
        """The ``@replay_safe`` function a call of ``tool`` runs, and its arguments by parameter name for ``given``."""
        if _is_replay_safe(tool):
            return cast(Callable[..., Any], getattr(tool, "__wrapped__", None)), dict(given)
        return self._protect(tool.tool_name), {"arguments": dict(given), "run": None}

    def after_tool_call(self, event: AfterToolCallEvent) -> None:
        """End the run on replaysafe's own refusals, which must never reach the model as a tool's error."""
        error = event.exception
        if isinstance(error, CONTROL_ERRORS):
            raise _surfacing(error)

    def _protect(self, tool_name: str) -> Callable[..., Any]:
        protected = self._protected.get(tool_name)
        if protected is None:
            options = {"ledger": self.ledger, **self.options}
            protected = replay_safe(name=tool_name, exclude_args=("run",), **options)(_execute)
            self._protected[tool_name] = protected
        return protected

    async def _run(self, tool: AgentTool, key: CallKey, run: _Run) -> list[Any]:
        """The events of one call: the tool's own, or its recorded result."""
        try:
            async with tool_call(*key, ledger=self.ledger, pauses=self.pauses, missing_ids_fix=MISSING_IDS_FIX):
                if _is_replay_safe(tool):
                    await run.collect()
                    return run.events
                outcome = await self._protect(tool.tool_name)(run.tool_use.get("input", {}), run)
        except InterruptException:
            if run.events and isinstance(run.events[-1], ToolInterruptEvent):
                return run.events
            raise
        except _UnrecordedError:
            return run.events
        except ApprovalRejectedError as error:
            # Rejected (by an operator, replaysafe ledger reject): the model reads the rejection as it reads a
            # call a hook cancelled, its reason as the cancel message.
            text = error.reason or "tool cancelled by user"
            rejected: ToolResult = {
                "toolUseId": str(run.tool_use.get("toolUseId")),
                "status": "error",
                "content": [{"text": text}],
            }
            return [ToolResultEvent(rejected)]
        except RecordedToolError as error:  # a failure recorded under record_errors: the tool's outcome
            # The text Strands' @tool gave the model when the tool raised, rebuilt from the record: a ValueError's
            # message alone (its validation errors' form), any other error's type name and message.
            kind = error.error_type.rpartition(".")[2]
            text = f"Error: {error.error_message}" if kind == "ValueError" else f"Error: {kind} - {error.error_message}"
            tool_use_id = str(run.tool_use.get("toolUseId"))
            result: ToolResult = {"toolUseId": tool_use_id, "status": "error", "content": [{"text": text}]}
            return [ToolResultEvent(result, exception=error)]
        except Exception as error:
            last = run.events[-1] if run.events else None
            if isinstance(last, ToolResultEvent) and last.exception is error:
                return run.events  # the tool's own error result, not recorded: the model reads it
            raise  # replaysafe's refusals: Strands makes them an error result, after_tool_call ends the run
        if run.events:
            return run.events  # the call ran now
        replayed: ToolResult = {"toolUseId": str(run.tool_use.get("toolUseId")), **outcome}  # type: ignore[typeddict-item]
        return [ToolResultEvent(replayed)]
