"""Replay-safe ``FunctionTool``s: each call keyed by (app thread id, model item or response id, call id)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from agents import Agent, FunctionTool
from agents.exceptions import AgentsException
from agents.models.fake_id import FAKE_RESPONSES_ID
from agents.tool import _FailureHandlingFunctionToolInvoker
from agents.tool_context import ToolContext

from replaysafe import (
    CONTROL_ERRORS,
    ApprovalRejectedError,
    CallKey,
    Ledger,
    ReplaySafeError,
    is_replay_safe,
    replay_safe,
    tool_call,
)

from ._approvals import SDK_APPROVER, ApprovalHooks, Approver, Approving, refusal_message

TContext = TypeVar("TContext")
Invoker = Callable[[ToolContext[Any], str], Awaitable[Any]]
#: The app's thread id: a fixed string, or a function of the call's ``ToolContext``.
ThreadId = str | Callable[[ToolContext[Any]], str | None]


def context_field(name: str) -> Callable[[ToolContext[Any]], str | None]:
    """A thread id read from the run's context: ``ctx.context[name]`` or ``ctx.context.<name>``.

    Works for a dict context and for a dataclass or other object; ``RunState.from_json`` hands a
    dataclass context back as a dict unless given a ``context_deserializer``, so both shapes occur.
    """

    def read(ctx: ToolContext[Any]) -> str | None:
        context = ctx.context
        value = context.get(name) if isinstance(context, Mapping) else getattr(context, name, None)
        return value if isinstance(value, str) else None

    return read


def group_id(ctx: ToolContext[Any]) -> str | None:
    """A thread id read from ``RunConfig(group_id=...)``; pass the same ``RunConfig`` on resume."""
    return ctx.run_config.group_id if ctx.run_config is not None else None


def message_id(ctx: ToolContext[Any]) -> str | None:
    """The id of the model output holding the call, or ``None`` if the call carries none.

    The Responses API gives each ``function_call`` item a globally unique id (``fc_…``). Chat
    Completions and LiteLLM models give every item the placeholder ``"__fake_id__"`` and put the
    completion id in the item's ``provider_data["response_id"]``. An item id equal to the call id
    (test models, some gateways) is not unique across turns, so it is not used either.
    """
    call = ctx.tool_call
    if call is None:
        return None
    if call.id and call.id not in (FAKE_RESPONSES_ID, call.call_id):
        return call.id
    provider_data = getattr(call, "provider_data", None)
    response_id = provider_data.get("response_id") if isinstance(provider_data, Mapping) else None
    return response_id if isinstance(response_id, str) and response_id else None


#: What the message about a call with a missing id tells the user (the adapter is in use: the cause is elsewhere).
MISSING_IDS_FIX = (
    "A message id is missing when the model's output item holding the call has no id of its own: none, the "
    'placeholder "__fake_id__" with no response id, or an id equal to the call id (as test models and some '
    'gateways give). Key the tool by its arguments (@replay_safe(key="args"), or key="args" in the adapter\'s '
    "options) or by a business key (key=function). A thread id is missing when thread_id= finds none in the "
    "context or the RunConfig."
)


def call_key(ctx: ToolContext[Any], thread_id: ThreadId) -> CallKey:
    """``(thread_id, message_id, tool_call_id)`` of the call; an id that cannot be found is ``""``."""
    thread = thread_id if isinstance(thread_id, str) else thread_id(ctx)
    return CallKey(thread or "", message_id(ctx) or "", ctx.tool_call_id or "")


def _is_replay_safe(tool: FunctionTool) -> bool:
    """Whether the tool's Python function is decorated with ``@replay_safe`` and protects itself."""
    try:
        function = tool.__wrapped__  # only tools made by @function_tool have one
    except AttributeError:
        return False
    return is_replay_safe(function)


async def _execute(ctx: ToolContext[Any], arguments: str, invoke: Invoker) -> Any:
    """The body protected for an undecorated tool: the tool's own invoker."""
    return await invoke(ctx, arguments)


def _sdk_error(kind: type[ReplaySafeError]) -> type[ReplaySafeError]:
    """``kind``, also an ``AgentsException``: named as it is, so ``except CallInDoubtError`` catches it."""
    return type(kind.__name__, (kind, AgentsException), {"__module__": __name__, "__doc__": kind.__doc__})


#: Each of replaysafe's ``CONTROL_ERRORS`` as an ``AgentsException`` too. The SDK lets an ``AgentsException``
#: out of a tool as it is, and wraps any other error in its ``UserError``: a run ending on a call in doubt
#: would raise ``UserError``, which an app's ``except CallInDoubtError`` (and ``replaysafe crashtest
#: --policy raise``) does not catch.
_SDK_ERRORS: dict[type[ReplaySafeError], type[ReplaySafeError]] = {kind: _sdk_error(kind) for kind in CONTROL_ERRORS}


def _surfacing(error: ReplaySafeError) -> ReplaySafeError:
    """``error`` made an ``AgentsException`` too (its class swapped for the subclass above), so that the SDK
    ends the run with it rather than with its ``UserError``."""
    if isinstance(error, AgentsException):
        return error
    kind = next((sdk for plain, sdk in _SDK_ERRORS.items() if type(error) is plain), None)
    if kind is None:  # a subclass of one of them: its own pair, made once
        kind = _SDK_ERRORS.setdefault(type(error), _sdk_error(type(error)))
    error.__class__ = kind
    error.run_data = None  # type: ignore[attr-defined]  # what AgentsException.__init__ sets
    return error


class _Refused(BaseException):
    """Carries one of replaysafe's ``CONTROL_ERRORS`` past the SDK's failure handler (which catches ``Exception``)."""

    def __init__(self, error: ReplaySafeError) -> None:
        super().__init__(type(error).__name__)
        self.error = error


def _refusing(invoke: Invoker) -> Invoker:
    @functools.wraps(invoke)  # keeps the SDK's markers
    async def refusing(ctx: ToolContext[Any], arguments: str) -> Any:
        try:
            return await invoke(ctx, arguments)
        except CONTROL_ERRORS as error:
            raise _Refused(error) from None

    return refusing


class _StopsOnRefusal(_FailureHandlingFunctionToolInvoker):
    """The SDK's failure handler, except that replaysafe's ``CONTROL_ERRORS`` end the run.

    A call in doubt, in progress elsewhere, or refused for a mismatch is not the tool's failure:
    shown to the model, it would only be asked for again under a new call id.
    """

    async def __call__(self, ctx: ToolContext[Any], input: str) -> Any:
        try:
            return await super().__call__(ctx, input)
        except _Refused as refused:
            raise _surfacing(refused.error) from None

    def __agents_bind_function_tool__(self, function_tool: FunctionTool) -> _FailureHandlingFunctionToolInvoker:
        bound = super().__agents_bind_function_tool__(function_tool)
        bound.__class__ = _StopsOnRefusal  # the SDK builds the bound copy as its own class
        return bound


def replay_safe_tool(
    tool: FunctionTool,
    ledger: Ledger | None = None,
    *,
    thread_id: ThreadId,
    pauses: Sequence[type[BaseException]] = (),
    approver: Approver = SDK_APPROVER,
    approval_expires_in: float = 900,
    **options: Any,
) -> FunctionTool:
    """A copy of ``tool`` whose calls run at most once per ``(thread, model output, call id)``.

    ``thread_id`` is the app's conversation id: a string, :func:`context_field` or :func:`group_id`,
    or any function of the ``ToolContext``. A tool whose function is decorated with
    ``@replay_safe`` protects itself with its own options; any other tool's output is recorded,
    with ``options`` as ``@replay_safe`` options (``lease=``, ``serializer=``, ``on_missing_ids=``…).
    A tool that raises is not recorded, so the SDK's failure handler still turns the error into a
    message for the model and a replay runs the tool again. replaysafe's own ``CONTROL_ERRORS``
    (a call in doubt under ``in_doubt="raise"``, a mismatch...) are never turned into a message:
    they end the run.

    A tool that needs approval (``needs_approval``) has the SDK's approval of each call recorded as a
    bound replaysafe approval, by ``approver`` (a name, or a function of the ``ToolContext``), valid for
    ``approval_expires_in`` seconds, and spent by the claim that runs the call (README: Approvals).
    :func:`replay_safe_agent` also records the request when the model asks, and the SDK's rejections.
    """
    return _wrap(tool, ledger, thread_id, tuple(pauses), approver, approval_expires_in, options)[0]


def _wrap(
    tool: FunctionTool,
    ledger: Ledger | None,
    thread_id: ThreadId,
    pauses: tuple[type[BaseException], ...],
    approver: Approver,
    expires_in: float,
    options: Mapping[str, Any],
) -> tuple[FunctionTool, Approving | None]:
    decorated = _is_replay_safe(tool)
    # Decorated once per tool, not per call: its once-per-tool warnings (missing ids, no ledger) stay once.
    protected = None if decorated else replay_safe(name=tool.name, exclude_args=("ctx", "invoke"), **options)(_execute)
    approving = None
    # A tool keyed by its arguments or a business key is claimed under a key of its own, which the core derives
    # and does not hand out: its approvals are left to the SDK (README: Approvals, limits).
    if tool.needs_approval is not False and options.get("key", "call") == "call":
        target: Callable[..., Any] = tool.__wrapped__ if protected is None else protected
        args_of = _decorated_args(target) if protected is None else _wrapped_args
        approving = Approving(
            tool, ledger, functools.partial(call_key, thread_id=thread_id), target, args_of, approver, expires_in
        )
    settings = (ledger, thread_id, pauses, protected, approving)
    invoker = tool.on_invoke_tool
    if isinstance(invoker, _FailureHandlingFunctionToolInvoker):
        # Protect what runs inside the SDK's failure handler, so errors are not recorded as outputs.
        handler = _StopsOnRefusal(_refusing(_protect(invoker._invoke_tool_impl, *settings)), invoker._on_handled_error)
        for marker, value in vars(invoker).items():
            if marker.startswith("__agents_"):  # e.g. the sync-tool marker
                setattr(handler, marker, value)
        return dataclasses.replace(tool, on_invoke_tool=handler), approving
    return dataclasses.replace(tool, on_invoke_tool=_protect(invoker, *settings)), approving


def _wrapped_args(arguments: str) -> Mapping[str, Any]:
    """The arguments of ``_execute`` by name, for the digest of an undecorated tool's call (its raw JSON)."""
    return {"ctx": None, "arguments": arguments, "invoke": None}


def _decorated_args(function: Callable[..., Any]) -> Callable[[str], Mapping[str, Any]]:
    """The arguments of a ``@replay_safe`` tool function by name, from the call's JSON arguments; a parameter
    the JSON does not hold (the ``ToolContext``, left out of its digest) is given as ``None``."""
    parameters = inspect.signature(function).parameters

    def args_of(arguments: str) -> Mapping[str, Any]:
        try:
            parsed = json.loads(arguments or "{}")
        except ValueError:
            parsed = {}
        given = dict(parsed) if isinstance(parsed, dict) else {}
        for name, parameter in parameters.items():
            plain = parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
            if plain and name not in given and parameter.default is parameter.empty:
                given[name] = None
        return given

    return args_of


def _protect(
    invoke: Invoker,
    ledger: Ledger | None,
    thread_id: ThreadId,
    pauses: tuple[type[BaseException], ...],
    protected: Callable[..., Awaitable[Any]] | None,
    approving: Approving | None,
) -> Invoker:
    @functools.wraps(invoke)  # keeps the SDK's markers (argument preparation, wrapped callable)
    async def invoke_once(ctx: ToolContext[Any], arguments: str) -> Any:
        try:
            if approving is not None:
                await approving.approved(ctx, arguments)
            async with tool_call(
                *call_key(ctx, thread_id), ledger=ledger, pauses=pauses, missing_ids_fix=MISSING_IDS_FIX
            ):
                if protected is None:
                    return await invoke(ctx, arguments)
                return await protected(ctx, arguments, invoke)
        except ApprovalRejectedError as rejected:
            return refusal_message(rejected)  # a rejected call: the model is told, as the SDK tells it
        except CONTROL_ERRORS as error:
            _surfacing(error)
            raise

    return invoke_once


def replay_safe_agent(
    agent: Agent[TContext],
    ledger: Ledger | None = None,
    *,
    thread_id: ThreadId,
    pauses: Sequence[type[BaseException]] = (),
    approver: Approver = SDK_APPROVER,
    approval_expires_in: float = 900,
    **options: Any,
) -> Agent[TContext]:
    """A copy of ``agent`` with every ``FunctionTool`` wrapped by :func:`replay_safe_tool`.

    Handoff targets are other agents: wrap them too. Hosted tools (web search, …) run at the
    provider and are left as they are. When a tool needs approval, the copy's hooks (the agent's own,
    plus the adapter's) record the request as the model asks for a call, and the SDK's rejections.
    """
    tools: list[Any] = []
    approving: dict[str, Approving] = {}
    for tool in agent.tools:
        if not isinstance(tool, FunctionTool):
            tools.append(tool)
            continue
        wrapped, asks = _wrap(tool, ledger, thread_id, tuple(pauses), approver, approval_expires_in, options)
        tools.append(wrapped)
        if asks is not None:
            approving[tool.name] = asks
    if not approving:
        return agent.clone(tools=tools)
    inner = agent.hooks.inner if isinstance(agent.hooks, ApprovalHooks) else agent.hooks
    return agent.clone(tools=tools, hooks=ApprovalHooks(inner, approving))
