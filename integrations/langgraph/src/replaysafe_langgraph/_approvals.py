"""Approvals: LangChain's ``HumanInTheLoopMiddleware`` answers, recorded as bound approvals.

``ReplaySafeHumanInTheLoopMiddleware`` is ``HumanInTheLoopMiddleware`` (same options, same interrupts, same
decisions) that also records, in the ledger, each tool call it holds back for its human
(``replaysafe.approvals.request``, under the call's key and with the digest of the arguments the human is
shown) and the human's decision on it (``approve``, with the edit as ``args=``, or ``reject``). The
``ReplaySafeMiddleware`` after it then checks the call it is about to run against that approval and spends
it: other arguments, an expired approval, a call under other ids, or a second run after a crash inside the
approved tool do not run; they ask the human again, with LangGraph's ``interrupt()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from langchain.agents.middleware import AgentState, HumanInTheLoopMiddleware, InterruptOnConfig
from langchain_core.messages import AIMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command

from replaysafe import (
    ApprovalExpiredError,
    ApprovalMismatchError,
    ApprovalRejectedError,
    ApprovalRequiredError,
    CallKey,
    Ledger,
    ReplayMismatchError,
    Status,
    approvals,
)

from ._keys import MessageIdFallback

#: Who approved, when the adapter is not told (``approver=``): HITL decisions carry no identity.
DEFAULT_APPROVER = "human-in-the-loop"
#: How long an approval holds when ``approval_expires_in`` / ``expires_in`` is left out: replaysafe's default.
DEFAULT_EXPIRES_IN: float | timedelta = approvals.DEFAULT_EXPIRY
#: ``approver=``: a name, or a function of the run's config that returns one (the user id of the run...).
Approver = str | Callable[[RunnableConfig], str]

#: The refusals the adapter answers by asking the human again (a rejection answers the model instead).
ASK_AGAIN = (ApprovalRequiredError, ApprovalExpiredError, ApprovalMismatchError)
REFUSALS = (*ASK_AGAIN, ApprovalRejectedError)

ToolResult = ToolMessage | Command[Any]

#: The reason recorded for a rejection given without one (the model then gets HumanInTheLoopMiddleware's
#: own words for it).
NO_REASON = "rejected by the reviewer, with no reason given"
_REASON = re.compile(r"User rejected the tool call for `[^`]*` with reason: (?P<reason>.*)", re.DOTALL)

# Set by ReplaySafeHumanInTheLoopMiddleware around the handler of a call it reviews: the interceptor then
# protects the call itself, even when its tool is decorated, so that the approval, recorded for the
# interceptor's protection of the tool, is the one its claim checks.
_REVIEWED: ContextVar[bool] = ContextVar("replaysafe_langgraph_reviewed", default=False)


def reviewed() -> bool:
    """Whether the call about to run was held back by ``ReplaySafeHumanInTheLoopMiddleware``."""
    return _REVIEWED.get()


@contextlib.contextmanager
def _reviewing() -> Iterator[None]:
    token = _REVIEWED.set(True)
    try:
        yield
    finally:
        _REVIEWED.reset(token)


def approver_of(approver: Approver) -> str:
    """The approver's name for the run being executed."""
    if isinstance(approver, str):
        return approver
    try:
        config: RunnableConfig = get_config()
    except RuntimeError:
        config = {}
    return approver(config)


def rejection(request: ToolCallRequest, reason: str | None) -> ToolMessage:
    """What the model gets for a call its human rejected: the same answer ``HumanInTheLoopMiddleware`` gives."""
    call = request.tool_call
    if reason and reason != NO_REASON:
        content = f"User rejected the tool call for `{call['name']}` with reason: {reason}"
    else:
        content = (
            f"User rejected the tool call for `{call['name']}` with id {call['id']}. The tool was not executed. "
            "Do not retry this tool call unless the user explicitly requests it."
        )
    return ToolMessage(content=content, name=call["name"], tool_call_id=call["id"], status="error")


# --- asking again, from the tools step --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Answer:
    """The human's answer to the adapter's ``interrupt()``: a ``HumanInTheLoopMiddleware`` decision."""

    kind: str  # "approve", "edit" or "reject"
    args: dict[str, Any] | None = None
    reason: str | None = None
    #: The call the human named (``"tool_call_id"`` in the decision), if any.
    call_id: str | None = None
    #: The attempt the human was shown (``"attempt"`` in the decision), if any.
    attempt: int | None = None


def approval_request(request: ToolCallRequest, refused: BaseException, *, name_the_call: bool) -> dict[str, Any]:
    """The value of the adapter's ``interrupt()`` for a call refused for want of a (valid) approval.

    Shaped as ``HumanInTheLoopMiddleware``'s per-call ``ToolApprovalRequest`` (``type="tool_approval"``),
    answered the same way (``{"type": "approve"}``, ``{"type": "edit", "edited_action": {...}}``,
    ``{"type": "reject", "message": ...}``), with why it is asked again: ``reason`` (``may_have_run``,
    ``expired``, ``mismatch``, ``required``), the call's ``idempotency_key`` and the ``attempt`` of its paused
    record. ``name_the_call``: other calls of the same task may ask too, and LangGraph hands a task's answers
    back by their order alone, so only an answer that names this call (``"tool_call_id"``) is taken for it.
    After an attempt that may have taken effect, only an approval that names the attempt it was shown
    (``"attempt"``) is taken: LangGraph may hand an earlier answer back to this question.
    """
    call = request.tool_call
    may_have_run = bool(getattr(refused, "may_have_run", False))
    if may_have_run:
        reason = "may_have_run"
    elif isinstance(refused, ApprovalExpiredError):
        reason = "expired"
    elif isinstance(refused, ApprovalMismatchError):
        reason = "mismatch"
    else:
        reason = "required"
    attempt = getattr(refused, "attempt", None)
    naming = (
        f' This step runs several tool calls: name this one in your answer ("tool_call_id": {call["id"]!r}); '
        "an answer that names no call is not taken for it."
        if name_the_call
        else ""
    )
    if may_have_run:
        naming += (
            f' To run it again, approve naming the attempt you were shown ("attempt": {attempt}) once you checked '
            "the provider; an approval that names no attempt, or another, is not taken."
        )
    return {
        "type": "tool_approval",
        "tool_call_id": call["id"],
        "name": call["name"],
        "args": call["args"],
        "description": f"replaysafe asks again: {refused}{naming}",
        "reason": reason,
        "may_have_run": may_have_run,
        "idempotency_key": getattr(refused, "idempotency_key", None),
        "attempt": attempt,
        "name_the_call": name_the_call,
    }


def answer_of(value: Any, request: ToolCallRequest) -> Answer:
    """The human's answer, checked: a decision of ``HumanInTheLoopMiddleware``'s (``respond`` is a rejection),
    which may name the call it answers (``"tool_call_id"``)."""
    kind = value.get("type") if isinstance(value, Mapping) else None
    named = value.get("tool_call_id") if isinstance(value, Mapping) else None
    if named is not None and not isinstance(named, str):
        raise ValueError(
            f"a decision's tool_call_id names the call it answers: a str, such as {request.tool_call['id']!r}"
        )
    attempt = value.get("attempt") if isinstance(value, Mapping) else None
    if attempt is not None and (not isinstance(attempt, int) or isinstance(attempt, bool)):
        raise ValueError(
            f"a decision's attempt names the attempt of {request.tool_call['name']} (tool call "
            f'{request.tool_call["id"]}) it was shown: an int, the question\'s "attempt"'
        )
    answer = _decision_of(value, kind, request)
    return dataclasses.replace(answer, call_id=named, attempt=attempt)


def _decision_of(value: Any, kind: object, request: ToolCallRequest) -> Answer:
    if kind == "approve":
        return Answer("approve")
    if kind == "edit":
        action = value.get("edited_action")
        args = action.get("args") if isinstance(action, Mapping) else None
        name = action.get("name", request.tool_call["name"]) if isinstance(action, Mapping) else None
        if not isinstance(args, Mapping) or name != request.tool_call["name"]:
            raise ValueError(
                f"an edit of {request.tool_call['name']} takes edited_action={{'name': "
                f"{request.tool_call['name']!r}, 'args': {{...}}}}: the same tool, its complete arguments"
            )
        return Answer("edit", dict(args))
    if kind in ("reject", "respond"):
        message = value.get("message")
        return Answer("reject", reason=str(message) if message else None)
    name = request.tool_call["name"]
    raise ValueError(
        f"the answer LangGraph handed to the approval of {name} (tool call {request.tool_call['id']}) is not a "
        "decision: answer it with {'type': 'approve'}, {'type': 'edit', 'edited_action': {'name': ..., 'args': "
        "{...}}} or {'type': 'reject', 'message': ...}. If the answer was for a question of the tool's own (it "
        f"calls interrupt()): LangGraph hands a task's answers back by their order alone, so the answers to {name}'s "
        "own questions reach the approval's questions, which its pauses ask again. A tool that needs approval "
        "must not call interrupt() itself: ask before it (a review node, or HumanInTheLoopMiddleware), or run it "
        "without approvals"
    )


# --- ReplaySafeHumanInTheLoopMiddleware -------------------------------------------------------------


@dataclasses.dataclass
class _Asked:
    """A call held back for its human: its key, and whether the answer now given is the answer to it."""

    key: CallKey
    call: ToolCall
    # The human's answer delivered now is for this call: it was asked for in an earlier run (so the human saw
    # these arguments under this key), has never run, and waits for its first decision.
    binds: bool


class ReplaySafeHumanInTheLoopMiddleware(HumanInTheLoopMiddleware[Any, Any, Any]):
    """``HumanInTheLoopMiddleware`` whose decisions are recorded as replaysafe approvals, bound to the call.

    Use it where you had ``HumanInTheLoopMiddleware``, with ``ReplaySafeMiddleware`` after it (last)::

        middleware=[
            ReplaySafeHumanInTheLoopMiddleware({"refund_order": True}, ledger=ledger),
            ReplaySafeMiddleware(ledger),
        ]

    It asks and is answered exactly as ``HumanInTheLoopMiddleware`` (``interrupt_mode`` "batched" or
    "per_call", ``Command(resume=...)`` with its decisions). In addition, each call it holds back is kept
    paused in the ledger under its key with the digest of the arguments the human is shown, and the
    decision is written into that record: approve (an ``edit``: approved with the edited arguments, as
    ``args=``) for ``expires_in`` (seconds; replaysafe's 15 minutes by default), or reject (``respond``
    too: the tool does not run). ``approver``: the name kept with each decision, or a function of the
    run's config that returns it (``DEFAULT_APPROVER`` when left out).

    A decision is recorded only for a call that was asked for in an earlier run of the graph and waits for
    its first decision: an answer LangGraph hands to a call the human was never shown (a re-planned call
    under other ids at the same graph position, langgraph#8026) is not recorded, and the call is asked for
    again when it is about to run.
    """

    def __init__(
        self,
        interrupt_on: dict[str, bool | InterruptOnConfig],
        *,
        ledger: Ledger,
        approver: Approver = DEFAULT_APPROVER,
        expires_in: float | timedelta = DEFAULT_EXPIRES_IN,
        messages_key: str = "messages",
        fallback_message_id: MessageIdFallback | None = None,
        **options: Any,
    ) -> None:
        """``options`` are ``HumanInTheLoopMiddleware``'s (``description_prefix``, ``edit_notice``,
        ``interrupt_mode``). ``ledger``, ``messages_key`` and ``fallback_message_id`` must be
        ``ReplaySafeMiddleware``'s."""
        if ledger is None:
            raise TypeError("ReplaySafeHumanInTheLoopMiddleware(ledger=...) takes the ledger ReplaySafeMiddleware uses")
        super().__init__(interrupt_on, **options)
        from ._interceptor import ReplaySafeInterceptor  # the protection whose digest the approval binds

        self.ledger = ledger
        self.approver = approver
        self.expires_in = expires_in
        self._interceptor = ReplaySafeInterceptor(
            ledger, messages_key=messages_key, fallback_message_id=fallback_message_id
        )

    # --- batched: one interrupt per model turn, in after_model ---------------------------------------

    def after_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        if self.interrupt_mode == "per_call":
            return None
        asked = [self._ask(key, call) for key, call in self._gated_calls(state, runtime)]
        result = super().after_model(state, runtime)  # GraphInterrupt the first time; the decisions on resume
        if result is not None:
            self._decide_batched([a for a in asked if a.binds], result)
        return result

    async def aafter_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self.after_model(state, runtime)

    def _gated_calls(self, state: AgentState[Any], runtime: Runtime[Any]) -> list[tuple[CallKey, ToolCall]]:
        """The calls of the last ``AIMessage`` that ``HumanInTheLoopMiddleware`` holds back, with their keys."""
        messages: list[Any] = list(state.get(self._interceptor.messages_key) or [])  # type: ignore[call-overload]
        message = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        if message is None or not message.tool_calls:
            return []
        thread_id = _thread_id(runtime)
        message_id = message.id
        gated: list[tuple[CallKey, ToolCall]] = []
        for call in message.tool_calls:
            config = self.interrupt_on.get(call["name"])
            if config is None or not self._should_interrupt(call, config, state, runtime):
                continue
            if not message_id and self._interceptor.fallback_message_id is not None:
                stand_in = ToolCallRequest(tool_call=call, tool=None, state=state, runtime=None)  # type: ignore[arg-type]
                message_id = self._interceptor.fallback_message_id(stand_in, message)
            key = CallKey(thread_id or "", message_id or "", str(call.get("id") or ""))
            if all(key):  # a call the interceptor cannot key runs unprotected, as it says then
                gated.append((key, call))
        return gated

    def _decide_batched(self, asked: list[_Asked], result: Mapping[str, Any]) -> None:
        answered = {m.tool_call_id: m for m in list(result.get("messages") or [])[1:] if isinstance(m, ToolMessage)}
        # HumanInTheLoopMiddleware's own state key: the reviewer's replacement of each edited call.
        edits: Mapping[str, Any] = result.get("hitl_edited_tool_calls") or {}
        for one in asked:
            call_id = one.call.get("id") or ""
            if call_id in answered:
                self._reject(one.key, _reason(answered[call_id]))
            elif call_id in edits:
                action = edits[call_id]
                if action.get("name") == one.call["name"]:
                    self._approve(one.key, dict(action.get("args") or {}))
                # Another tool: not approved; that tool's run under this key is refused (ReplayMismatchError).
            else:
                self._approve(one.key, None)

    # --- per_call: one interrupt per call, in wrap_tool_call ------------------------------------------

    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]) -> ToolResult:
        if not self._gated(request):
            return super().wrap_tool_call(request, handler)
        key = self._interceptor.key(request)
        if not all(key):
            return super().wrap_tool_call(request, handler)
        if self.interrupt_mode != "per_call":
            # Decided in after_model (edits applied by HumanInTheLoopMiddleware). A call it never asked about
            # (the thread changed since) is asked for now: it then runs only on a decision of its own.
            self._ask(key, request.tool_call)
            with _reviewing():
                return super().wrap_tool_call(request, handler)
        asked = self._ask(key, request.tool_call)
        # Asked as HumanInTheLoopMiddleware asks, every time (its interrupt comes first in the task, so an answer
        # LangGraph kept is handed to it, never to the interceptor's own question); recorded only when it binds.
        ran: list[bool] = []

        def run(to_run: ToolCallRequest) -> ToolResult:
            ran.append(True)
            if asked.binds:
                self._approve(key, _edit(request, to_run))
            return handler(to_run)

        with _reviewing():
            result = super().wrap_tool_call(request, run)
        if not ran and asked.binds and isinstance(result, ToolMessage):
            self._reject(key, _reason(result))
        return result

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolResult]]
    ) -> ToolResult:
        if not self._gated(request):
            return await super().awrap_tool_call(request, handler)
        key = self._interceptor.key(request)
        if not all(key):
            return await super().awrap_tool_call(request, handler)
        if self.interrupt_mode != "per_call":
            self._ask(key, request.tool_call)
            with _reviewing():
                return await super().awrap_tool_call(request, handler)
        asked = self._ask(key, request.tool_call)
        # Asked as HumanInTheLoopMiddleware asks, every time (its interrupt comes first in the task, so an answer
        # LangGraph kept is handed to it, never to the interceptor's own question); recorded only when it binds.
        ran: list[bool] = []

        async def run(to_run: ToolCallRequest) -> ToolResult:
            ran.append(True)
            if asked.binds:
                await self._aapprove(key, _edit(request, to_run))
            return await handler(to_run)

        with _reviewing():
            result = await super().awrap_tool_call(request, run)
        if not ran and asked.binds and isinstance(result, ToolMessage):
            await approvals.areject(key, by=approver_of(self.approver), reason=_reason(result), ledger=self.ledger)
        return result

    def _gated(self, request: ToolCallRequest) -> bool:
        config = self.interrupt_on.get(request.tool_call["name"])
        if config is None:
            return False
        when = config.get("when")
        return when is None or bool(when(request))

    # --- the ledger -----------------------------------------------------------------------------------

    def _ask(self, key: CallKey, call: ToolCall) -> _Asked:
        """Keep the call paused for its human's decision (``approvals.request``), once; say what an answer binds."""
        ledger = self._ledger()
        before = ledger.get(key)
        try:
            record = approvals.request(
                key, tool=self._interceptor.digest_tool(call["name"]), args={"args": call["args"]}, ledger=ledger
            )
        except ReplayMismatchError:
            # The key was asked for with other arguments (or another tool): what the human answered is not for
            # this call. Not recorded; the claim refuses it and asks again.
            return _Asked(key, call, binds=False)
        except ValueError:  # it ran, or runs: the claim replays it, or asks again
            return _Asked(key, call, binds=False)
        binds = before is not None and record.status is Status.PAUSED and record.attempt == 1
        return _Asked(key, call, binds=binds)

    def _approve(self, key: CallKey, edit: dict[str, Any] | None) -> None:
        approvals.approve(
            key,
            by=approver_of(self.approver),
            expires_in=self.expires_in,
            args=None if edit is None else {"args": edit},
            ledger=self._ledger(),
        )

    async def _aapprove(self, key: CallKey, edit: dict[str, Any] | None) -> None:
        await approvals.aapprove(
            key,
            by=approver_of(self.approver),
            expires_in=self.expires_in,
            args=None if edit is None else {"args": edit},
            ledger=self._ledger(),
        )

    def _reject(self, key: CallKey, reason: str) -> None:
        approvals.reject(key, by=approver_of(self.approver), reason=reason, ledger=self._ledger())

    def _ledger(self) -> Ledger:
        return self.ledger


def _thread_id(runtime: Runtime[Any]) -> str | None:
    try:
        value = (get_config().get("configurable") or {}).get("thread_id")
    except RuntimeError:
        value = None
    if value is None:
        value = getattr(getattr(runtime, "execution_info", None), "thread_id", None)
    return None if value is None or value == "" else str(value)


def _edit(request: ToolCallRequest, to_run: ToolCallRequest) -> dict[str, Any] | None:
    """The reviewer's edit: the arguments ``HumanInTheLoopMiddleware`` runs instead of the model's, if other."""
    args = to_run.tool_call["args"]
    return None if args == request.tool_call["args"] else dict(args)


def _reason(message: ToolMessage) -> str:
    """A rejection's reason, from the answer HumanInTheLoopMiddleware gave the model in place of the tool's
    result: the reviewer's message (a ``respond`` decision's whole message), or ``NO_REASON``."""
    content = message.content if isinstance(message.content, str) else str(message.content)
    if message.status != "error":  # respond: the reviewer answered for the tool
        return content.strip() or NO_REASON
    found = _REASON.fullmatch(content)
    return (found.group("reason").strip() or NO_REASON) if found else NO_REASON
