"""The Agents SDK's approvals (``needs_approval``, ``RunState.approve`` / ``reject``) as bound replaysafe approvals.

- When the model asks for a call of a tool that needs approval (the SDK is about to hold it back for a
  human), the agent's hooks record ``approvals.request`` for it, with the arguments the human is shown.
- When a run resumed with the human's answer invokes the call, the SDK's approval is recorded
  (``approvals.approve``) onto that request, once, and the claim that runs the tool checks and spends it.
- When a run resumed with a rejection calls the model again, the rejection is recorded (``approvals.reject``).

The SDK's approval is recorded only onto a fresh request (nothing decided, nothing run). A call whose record
has moved on (decided with replaysafe or the CLI, run, killed inside the tool) is decided by the ledger alone:
an SDK approval read again from a stored ``RunState`` never runs a call twice. A rejection is recorded onto any
paused call: it revokes an approval not yet spent.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

from agents import Agent, AgentHooks, FunctionTool, ModelResponse, RunContextWrapper, TResponseInputItem
from agents.tool import DEFAULT_APPROVAL_REJECTION_MESSAGE
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall

from replaysafe import CallKey, Ledger, ReplaySafeError, Status, approvals

#: Who the SDK's answers are recorded as approved or rejected by, unless ``approver=`` says otherwise.
SDK_APPROVER = "openai-agents"
#: The reason a rejection made with ``RunState.reject(item)`` (no ``rejection_message``) is recorded with.
SDK_REJECTION = "rejected in the OpenAI Agents SDK"
#: Who approves: a name, or a function of the call's ``ToolContext`` (e.g. ``context_field("user_id")``).
Approver = str | Callable[[ToolContext[Any]], str | None]


class Approving:
    """What a wrapped tool that needs approval records, and where."""

    def __init__(
        self,
        tool: FunctionTool,
        ledger: Ledger | None,
        key_of: Callable[[ToolContext[Any]], CallKey],
        target: Callable[..., Any],
        args_of: Callable[[str], Mapping[str, Any]],
        approver: Approver,
        expires_in: float,
    ) -> None:
        self.tool = tool
        self.ledger = ledger
        self.key_of = key_of
        self.target = target  # the @replay_safe function the call runs as (its digest binds the arguments)
        self.args_of = args_of
        self.approver = approver
        self.expires_in = expires_in

    def by(self, ctx: ToolContext[Any]) -> str:
        name = self.approver if isinstance(self.approver, str) else self.approver(ctx)
        return name or SDK_APPROVER

    async def needs_approval(self, context: RunContextWrapper[Any], call: ResponseFunctionToolCall) -> bool:
        policy = self.tool.needs_approval
        if not callable(policy):
            return bool(policy)
        try:
            params = json.loads(call.arguments or "{}")
        except ValueError:
            return True
        decided = policy(context, params if isinstance(params, dict) else {}, call.call_id)
        return bool(await decided if inspect.isawaitable(decided) else decided)

    def _key(self, ctx: ToolContext[Any]) -> CallKey | None:
        key = self.key_of(ctx)
        return key if all(key) else None  # a call that cannot be keyed is not protected (the claim says so)

    async def request(self, ctx: ToolContext[Any], arguments: str) -> CallKey | None:
        """Keep the call paused for a decision under its key, bound to ``arguments``; ``None``: not keyed,
        or the call has already run (the claim replays it, waits for it, or asks for a new decision)."""
        key = self._key(ctx)
        if key is None:
            return None
        try:
            record = await approvals.arequest(key, tool=self.target, args=self.args_of(arguments), ledger=self.ledger)
        except ValueError:  # running, in doubt or finished: not a call waiting for its first decision
            return None
        # Fresh: paused by the request and nothing since (a decision or a run takes the record over: attempt 2+).
        return key if record.status is Status.PAUSED and record.attempt == 1 else None

    async def asked(self, context: RunContextWrapper[Any], agent: Agent[Any], call: ResponseFunctionToolCall) -> None:
        """The model asked for the call and the SDK will hold it back for a human: record the request."""
        if await self.needs_approval(context, call):
            await self.request(_tool_context(context, agent, call), call.arguments)

    async def approved(self, ctx: ToolContext[Any], arguments: str) -> None:
        """The SDK invokes the call on its human's approval: record it onto a fresh request, once."""
        if ctx.is_tool_approved(self.tool.name, ctx.tool_call_id) is not True:
            return  # no approval was needed (a needs_approval function said so): nothing to record
        key = await self.request(ctx, arguments)
        if key is None:
            return
        try:
            await approvals.aapprove(key, by=self.by(ctx), expires_in=self.expires_in, ledger=self.ledger)
        except (ValueError, RuntimeError):  # decided or run meanwhile, elsewhere: the claim decides
            return

    async def rejected(
        self, context: RunContextWrapper[Any], agent: Agent[Any], call: ResponseFunctionToolCall
    ) -> None:
        """The SDK answered the call with its human's rejection: record it onto the paused call, whatever was
        decided before. The human's no revokes an approval not yet spent (one recorded before a crash), which a
        stale copy of the state would otherwise run on; a call that ran, runs or is in doubt is left to its
        claim."""
        if context.is_tool_approved(self.tool.name, call.call_id) is not False:
            return
        ctx = _tool_context(context, agent, call)
        key = self._key(ctx)
        if key is None:
            return
        reason = context.get_rejection_message(self.tool.name, call.call_id) or SDK_REJECTION
        try:
            await approvals.arequest(key, tool=self.target, args=self.args_of(call.arguments), ledger=self.ledger)
            found = await asyncio.to_thread(approvals.state, key, ledger=self.ledger)
            if found is not None and found.decision is not None and found.decision.decision == "rejected":
                return  # recorded already: every later model call of the run sees the rejected call again
            await approvals.areject(key, by=self.by(ctx), reason=reason, ledger=self.ledger)
        except (ValueError, RuntimeError):  # run, running or in doubt; or decided meanwhile: the claim decides
            return


def refusal_message(error: ReplaySafeError) -> str:
    """What the model is told of a call whose approval was rejected, as the SDK tells it of a rejection."""
    reason = getattr(error, "reason", None)
    return (
        reason if isinstance(reason, str) and reason and reason != SDK_REJECTION else DEFAULT_APPROVAL_REJECTION_MESSAGE
    )


def _tool_context(
    context: RunContextWrapper[Any], agent: Agent[Any], call: ResponseFunctionToolCall
) -> ToolContext[Any]:
    """The ``ToolContext`` the SDK will hand the call (its ids, the run's context), built ahead of it."""
    return ToolContext.from_agent_context(context, call.call_id, tool_call=call, agent=agent)


def _function_call(item: Any) -> ResponseFunctionToolCall | None:
    if isinstance(item, ResponseFunctionToolCall):
        return item
    if isinstance(item, Mapping) and item.get("type") == "function_call":
        try:
            return ResponseFunctionToolCall.model_validate(item)
        except ValueError:
            return None
    return None


class ApprovalHooks(AgentHooks[Any]):
    """The agent's hooks, plus the recording of its approval-needing tools' requests and rejections."""

    def __init__(self, inner: AgentHooks[Any] | None, tools: Mapping[str, Approving]) -> None:
        self.inner = inner
        self.tools = dict(tools)

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse) -> None:
        for item in response.output:
            call = _function_call(item)
            approving = self.tools.get(call.name) if call is not None else None
            if call is not None and approving is not None:
                await approving.asked(context, agent, call)
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[TResponseInputItem],
    ) -> None:
        for item in input_items:
            call = _function_call(item)
            approving = self.tools.get(call.name) if call is not None else None
            if call is not None and approving is not None:
                await approving.rejected(context, agent, call)
        if self.inner is not None:
            await self.inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_start(self, context: Any, agent: Any) -> None:
        if self.inner is not None:
            await self.inner.on_start(context, agent)

    async def on_end(self, context: Any, agent: Any, output: Any) -> None:
        if self.inner is not None:
            await self.inner.on_end(context, agent, output)

    async def on_handoff(self, context: Any, agent: Any, source: Any) -> None:
        if self.inner is not None:
            await self.inner.on_handoff(context, agent, source)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        if self.inner is not None:
            await self.inner.on_tool_start(context, agent, tool)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        if self.inner is not None:
            await self.inner.on_tool_end(context, agent, tool, result)
