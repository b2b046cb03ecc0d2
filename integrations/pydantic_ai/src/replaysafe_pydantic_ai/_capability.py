"""The ``ReplaySafe`` capability: ``wrap_tool_execute`` keyed by the ids Pydantic AI persists."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.durable_exec import DurableRunContext
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets.function import FunctionToolsetTool

from replaysafe import CallKey, Ledger, is_replay_safe, register_pause, replay_safe, tool_call

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
    tool: object | None = manager.tools.get(tool_name) if manager is not None and manager.tools else None
    while tool is not None and not isinstance(tool, FunctionToolsetTool):
        tool = getattr(tool, "source_tool", None)  # a combined toolset's entry wraps the source tool
    if tool is None:
        return None
    schema = getattr(tool.call_func, "__self__", None)  # call_func is FunctionSchema.call
    return getattr(schema, "function", None)


async def _execute(arguments: dict[str, Any], run: Callable[[], Awaitable[Any]]) -> Any:
    """The body the capability protects for an undecorated tool: the rest of the tool lifecycle."""
    return await run()


@dataclass(init=False)
class ReplaySafe(AbstractCapability[Any]):
    """Run each tool call at most once per ``(conversation, model response, tool call)``.

    A tool decorated with ``@replay_safe`` protects itself with its own options; the capability
    only tells it its call's ids. Any other tool is protected by the capability: its return value
    is recorded (as JSON data) and a replayed call returns it without running the tool. ``options``
    are ``@replay_safe`` options for those tools (``record_errors=``, ``serializer=``, ``lease=``,
    ``on_missing_ids=``…). ``pauses`` adds exception types to :data:`PAUSES`.

    Put it last in ``capabilities=[...]`` so that it wraps the tool most closely. Under Pydantic
    AI's durable execution (Temporal, DBOS, Prefect) it steps aside: the engine replays there.
    """

    ledger: Ledger | None
    pauses: tuple[type[BaseException], ...]
    options: dict[str, Any]

    def __init__(
        self, ledger: Ledger | None = None, *, pauses: Sequence[type[BaseException]] = (), **options: Any
    ) -> None:
        self.ledger = ledger
        self.pauses = (*PAUSES, *pauses)
        self.options = options

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
        async with tool_call(*call_key(ctx, call), ledger=self.ledger, pauses=self.pauses):
            if is_replay_safe(_tool_function(ctx, call.tool_name)):
                return await handler(args)
            protected = replay_safe(name=call.tool_name, exclude_args=("run",), **self.options)(_execute)
            return await protected(call.args_as_dict(), lambda: handler(args))
