"""The ``ToolNode`` interceptors: set the call's ids, and protect tools that are not decorated."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp, GraphInterrupt
from langgraph.prebuilt import ToolNode

# ToolNode's own reading of its handle_tool_errors setting: tool_error_handler(flag) keeps its meaning.
from langgraph.prebuilt.tool_node import ToolCallRequest, _handle_tool_error, _infer_handled_types
from langgraph.types import Command, interrupt

from replaysafe import (
    CONTROL_ERRORS,
    ApprovalMismatchError,
    ApprovalRejectedError,
    CallKey,
    InDoubt,
    Ledger,
    Serializer,
    approvals,
    is_replay_safe,
    register_pause,
    replay_safe,
    tool_call,
)

from ._approvals import (
    ASK_AGAIN,
    DEFAULT_APPROVER,
    DEFAULT_EXPIRES_IN,
    NO_REASON,
    REFUSALS,
    Answer,
    Approver,
    answer_of,
    approval_request,
    approver_of,
    rejection,
    reviewed,
)
from ._keys import MessageIdFallback, call_key, find_ai_message
from ._serializer import MessageSerializer

if TYPE_CHECKING:
    from typing_extensions import Unpack

ToolResult = ToolMessage | Command[Any]
Execute = Callable[[ToolCallRequest], ToolResult]
AsyncExecute = Callable[[ToolCallRequest], Awaitable[ToolResult]]

#: Exceptions that pause a tool for a human: LangGraph's ``interrupt()`` raises ``GraphInterrupt``.
PAUSES: tuple[type[BaseException], ...] = (GraphBubbleUp,)
#: What LangGraph's task metadata names a ``Send`` task by (``langgraph_triggers``).
_PUSH = "__pregel_push"
# Every protected call pauses on interrupt(), in a ToolNode or not (a step called from any node): the call
# is kept paused with its completed steps, and Command(resume=...) runs it again with those steps replaying.
register_pause(GraphInterrupt)


class _DefaultTimeout:
    def __repr__(self) -> str:
        return "DEFAULT_TIMEOUT"


#: ``timeout=`` left out: replaysafe's own default applies (``None`` means no timeout at all).
DEFAULT_TIMEOUT: Any = _DefaultTimeout()
#: The adapter's own fix for a call it cannot key, named by replaysafe's missing-ids warning and error.
MISSING_IDS_FIX = (
    "A message id is missing when the state's AIMessage has no id (a reducer other than add_messages): pass "
    "fallback_message_id= (replaysafe_langgraph.ai_message_digest) to replay_safe_tool_node, "
    "ReplaySafeMiddleware or ReplaySafeInterceptor. A thread id is missing when the graph has no checkpointer "
    'or the run config no "thread_id".'
)
#: What ``ToolNode(handle_tool_errors=...)`` accepts.
ToolErrors = bool | str | Callable[..., str] | type[Exception] | tuple[type[Exception], ...]


class InterceptorOptions(TypedDict, total=False):
    """The options ``ReplaySafeInterceptor``, ``replay_safe_tool_node`` and ``ReplaySafeMiddleware`` all take."""

    messages_key: str
    fallback_message_id: MessageIdFallback | None
    on_missing_ids: Literal["warn", "raise"]
    on_ledger_error: Literal["warn", "raise"]
    timeout: float | None
    in_doubt: InDoubt | None
    lease: float | None
    wait_timeout: float | None
    serializer: Serializer | None
    approver: Approver
    approval_expires_in: float | timedelta


class _ToolFailedError(Exception):
    """The tool raised and ToolNode answered with an error ``ToolMessage``.

    Raised through the protected call so that its claim is released, not recorded: the call
    runs again on resume, exactly as a tool decorated with ``@replay_safe`` that raises.
    """

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(f"{message.name} failed; ToolNode answered with an error message")
        self.message = message


def tool_error_handler(flag: ToolErrors = True) -> Callable[[Exception], str]:
    """A ``ToolNode(handle_tool_errors=...)`` value that handles errors as ``flag`` does, except replaysafe's.

    replaysafe's ``CONTROL_ERRORS`` (a call in doubt, in progress elsewhere, a mismatch, a tampered
    record, a ledger failure under ``on_ledger_error="raise"``...) are never turned into a message for
    the model: the run stops with the error, for an operator. ``replay_safe_tool_node`` applies it
    to its ``handle_tool_errors`` itself; pass it when you build the ``ToolNode`` yourself.
    """
    if isinstance(flag, type) and issubclass(flag, Exception):
        handled: tuple[type[Exception], ...] = (flag,)
    elif isinstance(flag, tuple):
        handled = flag
    elif callable(flag) and not isinstance(flag, type):
        handled = _infer_handled_types(flag)
    else:
        handled = (Exception,)

    def handle(error: Exception) -> str:
        if not flag or isinstance(error, CONTROL_ERRORS) or not isinstance(error, handled):
            raise error
        return _handle_tool_error(error, flag=flag)

    return handle


class ReplaySafeInterceptor:
    """The ``wrap_tool_call`` / ``awrap_tool_call`` pair that makes a ``ToolNode`` replay-safe.

    For each tool call it sets ``replaysafe.tool_call(thread_id, message_id, tool_call_id)``.
    A tool decorated with ``@replay_safe`` then claims and records itself under that key.
    Any other tool is protected here: the ``ToolMessage`` or ``Command`` it produced is
    recorded (with ``MessageSerializer``) and returned on replay without running the tool.

    Install both methods: ``ToolNode(tools, wrap_tool_call=i.wrap, awrap_tool_call=i.awrap)``.

    ``timeout`` (seconds; ``None`` or ``0`` disables; left out, replaysafe's default) and
    ``in_doubt`` apply to every call, decorated tools included; a run overrides them with
    ``config["configurable"]["tool_timeout"]`` (``None`` there disables too) / ``["in_doubt"]``.
    A timeout given here is a hard deadline, as a decorator's ``timeout=`` is. For an
    undecorated tool, an ``in_doubt`` reconciler finds the model's arguments in
    ``call.args[0]`` and returns the call's result (a string becomes its ``ToolMessage``).
    """

    def __init__(
        self,
        ledger: Ledger | None,
        *,
        messages_key: str = "messages",
        fallback_message_id: MessageIdFallback | None = None,
        on_missing_ids: Literal["warn", "raise"] = "warn",
        on_ledger_error: Literal["warn", "raise"] = "warn",
        timeout: float | None = DEFAULT_TIMEOUT,
        in_doubt: InDoubt | None = None,
        lease: float | None = None,
        wait_timeout: float | None = None,
        serializer: Serializer | None = None,
        approver: Approver = DEFAULT_APPROVER,
        approval_expires_in: float | timedelta = DEFAULT_EXPIRES_IN,
    ) -> None:
        """``ledger=None`` uses replaysafe's default ledger; ``None`` options keep replaysafe's defaults.

        ``approver`` (a name, or a function of the run's config) and ``approval_expires_in`` apply to the
        decisions the human gives when the adapter asks again for a call refused for want of a valid approval
        (see ``ReplaySafeHumanInTheLoopMiddleware``)."""
        self.ledger = ledger
        self.approver = approver
        self.approval_expires_in = approval_expires_in
        self.messages_key = messages_key
        self.fallback_message_id = fallback_message_id
        self.timeout = timeout
        self.in_doubt = in_doubt
        self._options: dict[str, Any] = {
            "on_missing_ids": on_missing_ids,
            "on_ledger_error": on_ledger_error,
            "serializer": serializer or MessageSerializer(),
            # Only the executor is left out: the digest covers the model's arguments.
            "exclude_args": ("request", "execute"),
        }
        if lease is not None:
            self._options["lease"] = lease
        if wait_timeout is not None:
            self._options["wait_timeout"] = wait_timeout
        self._sync: dict[str, Callable[..., ToolResult]] = {}
        self._async: dict[str, Callable[..., Awaitable[ToolResult]]] = {}

    def key(self, request: ToolCallRequest) -> CallKey:
        """The ledger key of a request; an id that cannot be found is ``""``."""
        return call_key(request, messages_key=self.messages_key, fallback_message_id=self.fallback_message_id)

    def _scope(self, request: ToolCallRequest) -> tool_call:
        configurable = (getattr(request.runtime, "config", None) or {}).get("configurable") or {}
        given: dict[str, Any] = {}
        # A tool_timeout of None is a setting (no timeout), as everywhere in replaysafe.
        timeout = configurable.get("tool_timeout", self.timeout)
        if timeout is not DEFAULT_TIMEOUT:
            given["tool_timeout"] = timeout
        in_doubt = configurable.get("in_doubt", self.in_doubt)
        if in_doubt is not None:
            given["in_doubt"] = in_doubt
        return tool_call(
            *self.key(request), ledger=self.ledger, pauses=PAUSES, missing_ids_fix=MISSING_IDS_FIX, **given
        )

    def wrap(self, request: ToolCallRequest, execute: Execute) -> ToolResult:
        """The sync interceptor (``ToolNode(wrap_tool_call=...)``)."""
        tool = request.tool
        if tool is None:  # not a registered tool: ToolNode answers with an error, nothing runs
            return execute(request)
        if getattr(tool, "func", True) is None and getattr(tool, "coroutine", None) is not None:
            raise TypeError(
                f"{tool.name} is an async tool, and ToolNode called the sync interceptor: LangChain cannot run it "
                "this way. Run the graph with ainvoke/astream, and install both interceptors: "
                "ToolNode(tools, wrap_tool_call=interceptor.wrap, awrap_tool_call=interceptor.awrap), as "
                "replay_safe_tool_node() and ReplaySafeMiddleware do."
            )
        with self._scope(request):
            protect = not _decorated(tool, asynchronous=False) or reviewed()
            asked = 0  # the interceptor's questions about this call in its task, so far
            while True:
                try:
                    if not protect:
                        return execute(request)
                    token = _RUNNING.set((request, execute))
                    try:
                        result = self._protected(tool.name)(request.tool_call["args"], request, execute)
                    finally:
                        _RUNNING.reset(token)
                except _ToolFailedError as failed:
                    return failed.message
                except REFUSALS as refused:
                    answered = self._ask_again(request, refused)
                    if isinstance(answered, ToolMessage):
                        return answered
                    asked += 1
                    if answered is None:  # an answer for another call of the task: asked again, below
                        continue
                    approved = self._decide(request, answered, refused, protect, asked)
                    if answered.kind == "reject":
                        return rejection(request, answered.reason)
                    if approved is not None:  # asked with what was approved: the call runs it
                        request = request.override(tool_call={**request.tool_call, "args": approved})
                    continue
                return _as_result(result, request)

    async def awrap(self, request: ToolCallRequest, execute: AsyncExecute) -> ToolResult:
        """The async interceptor (``ToolNode(awrap_tool_call=...)``)."""
        tool = request.tool
        if tool is None:
            return await execute(request)
        async with self._scope(request):
            protect = not _decorated(tool, asynchronous=True) or reviewed()
            asked = 0  # the interceptor's questions about this call in its task, so far
            while True:
                try:
                    if not protect:
                        return await execute(request)
                    token = _RUNNING.set((request, execute))
                    try:
                        result = await self._aprotected(tool.name)(request.tool_call["args"], request, execute)
                    finally:
                        _RUNNING.reset(token)
                except _ToolFailedError as failed:
                    return failed.message
                except REFUSALS as refused:
                    answered = self._ask_again(request, refused)
                    if isinstance(answered, ToolMessage):
                        return answered
                    asked += 1
                    if answered is None:  # an answer for another call of the task: asked again, below
                        continue
                    approved = await self._adecide(request, answered, refused, protect, asked)
                    if answered.kind == "reject":
                        return rejection(request, answered.reason)
                    if approved is not None:  # asked with what was approved: the call runs it
                        request = request.override(tool_call={**request.tool_call, "args": approved})
                    continue
                return _as_result(result, request)

    # --- approvals: a call refused for want of a valid approval asks its human again -------------------

    def _ask_again(self, request: ToolCallRequest, refused: BaseException) -> Answer | ToolMessage | None:
        """A rejected call answers the model as ``HumanInTheLoopMiddleware`` does; any other refusal asks the
        human again with ``interrupt()`` (the graph pauses; ``Command(resume=<decision>)`` answers). ``None``:
        the answer LangGraph handed back is not this call's (it names another, or names none where other calls
        of the task may ask too)."""
        if isinstance(refused, ApprovalRejectedError):
            return rejection(request, refused.reason)
        if not isinstance(refused, ASK_AGAIN):  # pragma: no cover - REFUSALS is both
            raise refused
        alone = self._alone_in_task(request)
        answer = answer_of(interrupt(approval_request(request, refused, name_the_call=not alone)), request)
        # LangGraph may hand an answer it kept for an earlier question (one the call ran on, then raised) to this
        # one: after an attempt that may have taken effect, only an approval naming the attempt shown is taken.
        shown = getattr(refused, "attempt", None)
        if answer.kind != "reject" and getattr(refused, "may_have_run", False) and answer.attempt != shown:
            return None
        if answer.call_id is None:
            return answer if alone else None
        return answer if answer.call_id == request.tool_call["id"] else None

    def _alone_in_task(self, request: ToolCallRequest) -> bool:
        """Whether no other call can ask in this call's task. LangGraph hands the answers to a task's
        ``interrupt()`` calls back by their order in the task alone: where several calls run in one task (a
        ``ToolNode`` given a message with several calls), a call that replays or is refused no more shifts
        the answers of the others, so there an answer is taken only for the call it names."""
        config = getattr(request.runtime, "config", None) or {}
        if _PUSH in ((config.get("metadata") or {}).get("langgraph_triggers") or ()):
            return True  # a Send task: one call (create_agent's tools step)
        message = find_ai_message(request, messages_key=self.messages_key)
        return message is not None and len(message.tool_calls) == 1

    def _decision(
        self, request: ToolCallRequest, answer: Answer, refused: BaseException, protect: bool, asked: int
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``approvals.approve`` / ``reject`` keywords for the human's answer, bound to what the human was shown,
        and the arguments the call is then asked with (``None``: its own)."""
        by = approver_of(self.approver)
        # LangGraph keeps the answers to a task's interrupts and hands them back, in order, each time the task
        # runs again (a resume after a crash): this one answers the ``asked``-th question of this call in its
        # task, recorded under that id once, so one handed back cannot renew an approval that expired or was
        # spent since.
        namespace = ((getattr(request.runtime, "config", None) or {}).get("configurable") or {}).get("checkpoint_ns")
        answer_id = None if not namespace else f"langgraph:{namespace}:{asked}"
        if answer.kind == "reject":
            reason = answer.reason or NO_REASON
            return {"by": by, "reason": reason, "ledger": self.ledger, "answer": answer_id}, None
        args = answer.args
        if args is None and isinstance(refused, ApprovalMismatchError):
            args = dict(request.tool_call["args"])  # the arguments the human was shown, not the record's
        edit = None if args is None else ({"args": args} if protect else args)
        expires_in = self.approval_expires_in
        return {"by": by, "expires_in": expires_in, "args": edit, "ledger": self.ledger, "answer": answer_id}, args

    def _decide(
        self, request: ToolCallRequest, answer: Answer, refused: BaseException, protect: bool, asked: int
    ) -> dict[str, Any] | None:
        decided, args = self._decision(request, answer, refused, protect, asked)
        key = self.key(request)
        if answer.kind == "reject":
            approvals.reject(key, **decided)
        else:
            approvals.approve(key, **decided)
        return args

    async def _adecide(
        self, request: ToolCallRequest, answer: Answer, refused: BaseException, protect: bool, asked: int
    ) -> dict[str, Any] | None:
        decided, args = self._decision(request, answer, refused, protect, asked)
        key = self.key(request)
        if answer.kind == "reject":
            await approvals.areject(key, **decided)
        else:
            await approvals.aapprove(key, **decided)
        return args

    def digest_tool(self, name: str) -> Callable[..., Any]:
        """The ``@replay_safe`` protection the interceptor gives the tool ``name``: what an approval of one of
        its calls is recorded for (``approvals.request(key, tool=..., args={"args": <the call's args>})``)."""
        return self._protected(name)

    def _protected(self, name: str) -> Callable[..., ToolResult]:
        protected = self._sync.get(name)
        if protected is None:

            def run(args: dict[str, Any], request: ToolCallRequest | None = None, execute: Any = None) -> ToolResult:
                request, execute = _running(args, request, execute)
                return _unless_failed(execute(request))

            protected = self._sync.setdefault(name, replay_safe(name=name, **self._options)(run))
        return protected

    def _aprotected(self, name: str) -> Callable[..., Awaitable[ToolResult]]:
        protected = self._async.get(name)
        if protected is None:

            async def run(
                args: dict[str, Any], request: ToolCallRequest | None = None, execute: Any = None
            ) -> ToolResult:
                request, execute = _running(args, request, execute)
                return _unless_failed(await execute(request))

            protected = self._async.setdefault(name, replay_safe(name=name, **self._options)(run))
        return protected


def replay_safe_tool_node(
    tools: Sequence[BaseTool | Callable[..., Any]],
    *,
    ledger: Ledger | None,
    name: str = "tools",
    tags: list[str] | None = None,
    handle_tool_errors: ToolErrors | None = None,
    **options: Unpack[InterceptorOptions],
) -> ToolNode:
    """A ``langgraph.prebuilt.ToolNode`` with both ``ReplaySafeInterceptor`` methods installed.

    ``options`` are ``ReplaySafeInterceptor``'s (``messages_key`` is ToolNode's too);
    ``name``, ``tags`` and ``handle_tool_errors`` are ToolNode's. Whatever
    ``handle_tool_errors`` says, replaysafe's own errors stop the run (see :func:`tool_error_handler`).
    """
    given: dict[str, Any] = dict(options)
    if "wrap_tool_call" in given or "awrap_tool_call" in given:
        raise TypeError(
            "replay_safe_tool_node() installs its own wrap_tool_call and awrap_tool_call. To combine them with "
            "yours, build ToolNode(...) yourself and call ReplaySafeInterceptor(ledger).wrap / .awrap as the "
            "innermost step of your interceptors."
        )
    interceptor = ReplaySafeInterceptor(ledger, **options)
    # ToolNode's default handles bad arguments only, and lets every other error through.
    errors = {} if handle_tool_errors is None else {"handle_tool_errors": tool_error_handler(handle_tool_errors)}
    return ToolNode(
        tools,
        name=name,
        tags=tags,
        messages_key=interceptor.messages_key,
        wrap_tool_call=interceptor.wrap,
        awrap_tool_call=interceptor.awrap,
        **errors,
    )


# The request and executor of the call the interceptor is running: an approver's edit is handed to the
# protected function as its complete arguments (``args`` alone), and it runs the request with them.
_RUNNING: ContextVar[tuple[ToolCallRequest, Any] | None] = ContextVar("replaysafe_langgraph_running", default=None)


def _running(args: dict[str, Any], request: ToolCallRequest | None, execute: Any) -> tuple[ToolCallRequest, Any]:
    if request is None or execute is None:
        held = _RUNNING.get()
        if held is None:
            raise RuntimeError("replaysafe_langgraph: a protected tool call ran outside its interceptor")
        request, execute = held
    if args != request.tool_call["args"]:  # an approved edit: run it, not the model's arguments
        request = request.override(tool_call={**request.tool_call, "args": dict(args)})
    return request, execute


def _unless_failed(result: ToolResult) -> ToolResult:
    if isinstance(result, ToolMessage) and result.status == "error":
        raise _ToolFailedError(result)
    return result


def _as_result(value: Any, request: ToolCallRequest) -> ToolResult:
    """What ToolNode expects back. A plain value comes from a record settled by hand
    (``ledger.resolve(key, result=...)``) or an ``in_doubt`` reconciler: it becomes the
    call's ``ToolMessage``."""
    if isinstance(value, (ToolMessage, Command)) or (
        isinstance(value, list) and all(isinstance(item, (ToolMessage, Command)) for item in value)
    ):
        return value  # type: ignore[return-value]  # ToolNode also accepts a list of them
    content = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return ToolMessage(content=content, name=request.tool_call["name"], tool_call_id=request.tool_call["id"])


# --- is the tool decorated with @replay_safe? -----------------------------------------


def _decorated(tool: BaseTool, *, asynchronous: bool) -> bool:
    """Whether the function this call will run is decorated with ``@replay_safe``.

    A wrong "no" stays safe: the interceptor then protects the call, and the decorated
    function, finding a protected call already running, runs plainly inside it.
    """
    function = getattr(tool, "func", None)
    if asynchronous:
        function = getattr(tool, "coroutine", None) or function
    if function is None:  # a BaseTool subclass: its _run / _arun
        function = getattr(type(tool), "_arun" if asynchronous else "_run", None)
        if asynchronous and function is BaseTool._arun:
            function = getattr(type(tool), "_run", None)
    return function is not None and is_replay_safe(function)
