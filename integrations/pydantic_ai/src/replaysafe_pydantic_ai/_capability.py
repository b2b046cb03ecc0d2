"""The ``ReplaySafe`` capability: ``wrap_tool_execute`` keyed by the ids Pydantic AI persists."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic_ai import CallToolsNode, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.durable_exec import DurableRunContext
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDefinition, ToolDenied
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset
from pydantic_ai.toolsets.function import FunctionToolsetTool

from replaysafe import (
    ApprovalRejectedError,
    ApprovalRequiredError,
    CallKey,
    Ledger,
    ReplayMismatchError,
    ReplaySafeError,
    approvals,
    is_replay_safe,
    register_pause,
    replay_safe,
    tool_call,
)

#: Pydantic AI's deferrals: a tool (or a capability's ``before_tool_execute``) that raises one
#: pauses the call for a human or an external system. Its claim is released, never recorded.
PAUSES: tuple[type[BaseException], ...] = (CallDeferred, ApprovalRequired)
# In every protected call: the call is kept paused with its completed steps; once approved (or its
# deferred result arrives) the resumed run calls it again and those steps replay.
register_pause(*PAUSES)


def message_id(messages: Sequence[ModelMessage], tool_call_id: str) -> str | None:
    """The id of the ``ModelResponse`` that issued ``tool_call_id``, or ``None`` if none did.

    That is the provider's ``provider_response_id`` (``chatcmpl-…``, ``resp_…``, ``msg_…``). When the
    model gave none (``FunctionModel``, ``TestModel``, some providers) it is
    ``f"{response.run_id}@{response.timestamp.isoformat()}"``: both are stored with the message
    history, so the fallback is stable once the history is persisted.
    """
    for message in reversed(messages):
        if isinstance(message, ModelResponse) and any(
            isinstance(part, ToolCallPart) and part.tool_call_id == tool_call_id for part in message.parts
        ):
            if message.provider_response_id:
                return message.provider_response_id
            return f"{message.run_id}@{message.timestamp.isoformat()}"
    return None


def call_key(ctx: RunContext[Any], call: ToolCallPart) -> CallKey:
    """``(conversation_id, message_id, tool_call_id)``; an id that cannot be found is ``""``.

    Never ``run_id`` alone: a resumed run gets a new one while the message history keeps the rest.
    """
    return CallKey(
        ctx.conversation_id or "",
        message_id(ctx.messages, call.tool_call_id) or "",
        call.tool_call_id or "",
    )


def _tool_function(ctx: RunContext[Any], tool_name: str) -> object | None:
    """The Python function behind a function tool, or ``None`` (MCP, external, unknown toolsets)."""
    manager = ctx.tool_manager
    if manager is None:
        return None
    if not manager.tools:  # not prepared for this step yet (a run resumed with deferred_tool_results)
        return _declared_function(manager.toolset, tool_name)
    tool: object | None = manager.tools.get(tool_name)
    while tool is not None and not isinstance(tool, FunctionToolsetTool):
        tool = getattr(tool, "source_tool", None)  # a combined toolset's entry wraps the source tool
    if tool is None:
        return None
    schema = getattr(tool.call_func, "__self__", None)  # call_func is FunctionSchema.call
    return getattr(schema, "function", None)


def _declared_function(toolset: AbstractToolset[Any], tool_name: str) -> object | None:
    """The function a ``FunctionToolset`` among ``toolset``'s declares as ``tool_name``, or ``None``."""
    found: list[object] = []

    def visit(leaf: AbstractToolset[Any]) -> None:
        if isinstance(leaf, FunctionToolset) and tool_name in leaf.tools:
            found.append(leaf.tools[tool_name].function)

    toolset.apply(visit)
    return found[0] if len(found) == 1 else None


#: Who the ledger names as the approver of an answer given through Pydantic AI (``DeferredToolResults``),
#: unless ``ReplaySafe(approver=...)`` says.
APPROVER = "pydantic-ai"
#: What the marker of a recorded answer adds to its call's message id (see ``ReplaySafe._record_answer``).
_ANSWER = ">pydantic-ai-answer"

#: The calls of the node being run that Pydantic AI was handed an answer for (``deferred_tool_results``): the
#: call as the model asked for it (Pydantic AI hands an approved call its ``override_args`` instead), and
#: whether the answer is on record (a request was recorded for the call).
_answers: ContextVar[dict[CallKey, tuple[ToolCallPart, bool]] | None] = ContextVar(
    "replaysafe_pydantic_ai_answers", default=None
)
#: Pydantic AI's handler of the call the capability is running: an edit recorded with ``approvals.approve``
#: (``replaysafe ledger approve --args``) runs through it.
_handler: ContextVar[Callable[[dict[str, Any]], Awaitable[Any]] | None] = ContextVar(
    "replaysafe_pydantic_ai_handler", default=None
)


async def _execute(arguments: dict[str, Any], run: Callable[[], Awaitable[Any]] | None = None) -> Any:
    """The body the capability protects for an undecorated tool: the rest of the tool lifecycle.

    Called without ``run`` when the call runs an edit an approver recorded (``approve(args=...)``) in place of
    the arguments it was asked with: Pydantic AI's handler then runs the tool with the edit.
    """
    if run is not None:
        return await run()
    handler = _handler.get()
    if handler is None:
        raise RuntimeError("replaysafe_pydantic_ai: an edited call ran outside the ReplaySafe capability")
    return await handler(dict(arguments))


async def _decide(decide: Callable[[], Awaitable[bool]]) -> bool:
    """The body of an answer's marker: records the answer, once (its replays record nothing)."""
    return await decide()


#: The marker of a Pydantic AI answer recorded as a call's decision: a protected call under the call's key
#: (its message id + ``_ANSWER``), so a run handed the same ``deferred_tool_results`` again (a retry, a resume
#: after a crash) replays it instead of approving the call once more.
_answer_marker = replay_safe(name="pydantic_ai_approval_answer", exclude_args=("decide",))(_decide)


def _by_name(function: Callable[..., Any], arguments: dict[str, Any], ctx: RunContext[Any]) -> dict[str, Any]:
    """A decorated tool's arguments by parameter name: Pydantic AI's, and the ``RunContext`` (left out of
    its digest) for a parameter they do not name."""
    named = dict(arguments)
    for name, parameter in inspect.signature(function).parameters.items():
        if (
            name not in named
            and parameter.default is inspect.Parameter.empty
            and parameter.kind
            not in (
                inspect.Parameter.VAR_POSITIONAL,
                inspect.Parameter.VAR_KEYWORD,
            )
        ):
            named[name] = ctx
    return named


@dataclass(init=False)
class ReplaySafe(AbstractCapability[Any]):
    """Run each tool call at most once per ``(conversation, model response, tool call)``.

    A tool decorated with ``@replay_safe`` protects itself with its own options; the capability
    only tells it its call's ids. Any other tool is protected by the capability: its return value
    is recorded (as JSON data) and a replayed call returns it without running the tool. ``options``
    are ``@replay_safe`` options for those tools (``record_errors=``, ``serializer=``, ``lease=``,
    ``on_missing_ids=``…). ``pauses`` adds exception types to :data:`PAUSES`.

    Approvals (deferred tools): a call Pydantic AI holds back for a human (``requires_approval=True``, or
    ``ApprovalRequired``) is recorded as waiting for a decision, and the answer handed to the next run
    (``deferred_tool_results``: ``True``, ``ToolApproved(override_args=...)``, ``ToolDenied``) as a bound,
    one-use approval (``replaysafe.approvals``), by ``approver`` (a name, or a function of the run context
    and the call), valid for ``approval_expires_in`` (seconds or a ``timedelta``). Each answer is recorded
    once: handed again, it approves nothing more.

    Put it last in ``capabilities=[...]`` so that it wraps the tool most closely. Under Pydantic
    AI's durable execution (Temporal, DBOS, Prefect) it steps aside: the engine replays there.
    """

    ledger: Ledger | None
    pauses: tuple[type[BaseException], ...]
    options: dict[str, Any]
    approver: str | Callable[[RunContext[Any], ToolCallPart], str]
    approval_expires_in: float | timedelta

    def __init__(
        self,
        ledger: Ledger | None = None,
        *,
        pauses: Sequence[type[BaseException]] = (),
        approver: str | Callable[[RunContext[Any], ToolCallPart], str] = APPROVER,
        approval_expires_in: float | timedelta = 900,
        **options: Any,
    ) -> None:
        self.ledger = ledger
        self.pauses = (*PAUSES, *pauses)
        self.options = options
        self.approver = approver
        self.approval_expires_in = approval_expires_in

    def _protected(self, tool_name: str) -> Callable[..., Awaitable[Any]]:
        """The ``@replay_safe`` body the capability runs an undecorated tool's call in."""
        protected: Callable[..., Awaitable[Any]] = replay_safe(name=tool_name, exclude_args=("run",), **self.options)(
            _execute
        )
        return protected

    def _asked(self, ctx: RunContext[Any], call: ToolCallPart) -> tuple[Callable[..., Any], dict[str, Any]]:
        """The ``@replay_safe`` tool ``call`` runs in, and its arguments by parameter name (``approvals.request``)."""
        function = _tool_function(ctx, call.tool_name)
        if callable(function) and is_replay_safe(function):
            return function, _by_name(function, call.args_as_dict(), ctx)
        return self._protected(call.tool_name), {"arguments": call.args_as_dict()}

    def _edit(self, ctx: RunContext[Any], call: ToolCallPart, override: dict[str, Any]) -> dict[str, Any]:
        """``ToolApproved.override_args`` as ``approvals.approve(args=...)``: the complete arguments by name."""
        function = _tool_function(ctx, call.tool_name)
        if callable(function) and is_replay_safe(function):
            return dict(override)
        return {"arguments": dict(override)}

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[Any], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        """Each call held back for approval is recorded as waiting for a decision (``approvals.request``)
        before the human sees it; the call is left for the human (``None``)."""
        if isinstance(ctx, DurableRunContext):
            return None
        for call in requests.approvals:
            key = call_key(ctx, call)
            if all(key):
                tool, arguments = self._asked(ctx, call)
                try:
                    await approvals.arequest(key, tool=tool, args=arguments, ledger=self.ledger)
                except ReplayMismatchError:
                    pass  # asked for with other arguments before (a re-plan under the same ids): its claim refuses
                except ReplaySafeError:
                    raise
                except ValueError:
                    pass  # it ran, runs or is in doubt (a resume asked the model again): its claim says what happens
        return None

    async def wrap_node_run(self, ctx: RunContext[Any], *, node: Any, handler: Any) -> Any:
        """Record the answers a run is handed (``deferred_tool_results``) before its tools run."""
        results = node.tool_call_results if isinstance(node, CallToolsNode) else None
        if isinstance(ctx, DurableRunContext) or not results:
            return await handler(node)
        answers: dict[CallKey, tuple[ToolCallPart, bool]] = {}
        for call in node.model_response.tool_calls:
            answer = results.get(call.tool_call_id)
            if isinstance(answer, (ToolApproved, ToolDenied)):
                key = CallKey(
                    ctx.conversation_id or "",
                    message_id([node.model_response], call.tool_call_id) or "",
                    call.tool_call_id,
                )
                if not all(key):
                    continue
                answers[key] = (call, await self._record_answer(ctx, key, call, answer))
        token = _answers.set(answers)
        try:
            return await handler(node)
        finally:
            _answers.reset(token)

    async def _record_answer(
        self, ctx: RunContext[Any], key: CallKey, call: ToolCallPart, answer: ToolApproved | ToolDenied
    ) -> bool:
        """Record ``answer`` as the decision on ``key``, once; whether an answer is on record for it.

        ``False`` when no request was recorded for the call (no human was asked about this call: it asks).
        A denial is written onto the paused call whatever it was decided before: the human's no revokes an
        approval not yet spent (one recorded before a crash, which a stale retry would otherwise run on).
        """
        by = self.approver if isinstance(self.approver, str) else self.approver(ctx, call)
        if isinstance(answer, ToolDenied):
            try:
                found = await asyncio.to_thread(approvals.state, key, ledger=self.ledger)
                if found is not None and found.decision is not None and found.decision.decision == "rejected":
                    return True  # recorded already (the same results handed to a retry)
                await approvals.areject(key, by=by, reason=answer.message or "denied", ledger=self.ledger)
            except LookupError:
                return False  # no request on record for this call: it asks
            except ValueError:
                pass  # not paused: the call ran, runs or is in doubt; its claim says what happens
            return True

        async def decide() -> bool:
            found = await asyncio.to_thread(approvals.state, key, ledger=self.ledger)
            if found is not None and not found.waiting:
                # Decided already (this answer, recorded before a crash left its marker in doubt; or a decision
                # made in replaysafe), or run on one: recorded again, it would renew a decision or its expiry.
                return True
            try:
                edit = None if answer.override_args is None else self._edit(ctx, call, answer.override_args)
                await approvals.aapprove(key, by=by, expires_in=self.approval_expires_in, args=edit, ledger=self.ledger)
            except ReplaySafeError:
                raise
            except ValueError:
                pass  # not paused: the call ran, runs or is in doubt; the answer decides nothing more
            return True

        try:
            async with tool_call(key.thread_id, key.message_id + _ANSWER, key.tool_call_id, ledger=self.ledger):
                return bool(await _answer_marker(decide))
        except LookupError:
            return False  # no request on record for this call: nothing approved (its marker is not kept)

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: Callable[[dict[str, Any]], Awaitable[Any]],
    ) -> Any:
        if isinstance(ctx, DurableRunContext):
            return await handler(args)
        key = call_key(ctx, call)
        answers = _answers.get() if ctx.tool_call_approved else None
        answer = answers.get(key) if answers else None
        try:
            async with tool_call(*key, ledger=self.ledger, pauses=self.pauses):
                if answer is not None:
                    await self._gate(ctx, key, answer[0])
                if is_replay_safe(_tool_function(ctx, call.tool_name)):
                    return await handler(args)
                token = _handler.set(handler)
                try:
                    return await self._protected(call.tool_name)(call.args_as_dict(), lambda: handler(args))
                finally:
                    _handler.reset(token)
        except ApprovalRejectedError as rejected:
            return ToolDenied(rejected.reason or "The tool call was denied.")  # the model is told, as Pydantic AI does
        except ApprovalRequiredError as asked:
            if asked.may_have_run or (answer is not None and answer[1]):
                raise  # decided in replaysafe: the answer Pydantic AI was handed is already spent or on record
            raise ApprovalRequired(metadata={"replaysafe": "approval_required"}) from asked

    async def _gate(self, ctx: RunContext[Any], key: CallKey, asked: ToolCallPart) -> None:
        """An approved call runs only on the approval recorded for it: asked for (as the model ``asked``),
        if no one asked yet."""
        tool, arguments = self._asked(ctx, asked)
        try:
            await approvals.arequest(key, tool=tool, args=arguments, ledger=self.ledger)
        except ReplayMismatchError:
            pass  # recorded with the edit it ran (or for another call): its claim says what happens
        except ReplaySafeError:
            raise
        except ValueError:
            pass  # it ran, runs or is in doubt: its claim says what happens
