"""Replay-safe LlamaIndex agents: the ``call_tool`` step runs each call under ``(thread, message, tool_id)``."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar, cast

from llama_index.core.agent.workflow import AgentWorkflow, BaseWorkflowAgent, ReActAgent
from llama_index.core.agent.workflow.workflow_events import AgentInput, AgentOutput, ToolCall, ToolCallResult
from llama_index.core.tools import AsyncBaseTool, FunctionTool, ToolOutput
from llama_index.core.workflow import Context, StopEvent, step
from workflows.runtime.types.results import WaitingForEvent

from replaysafe import CONTROL_ERRORS, Ledger, is_replay_safe, replay_safe, tool_call

AgentT = TypeVar("AgentT", bound=BaseWorkflowAgent | AgentWorkflow)
#: The app's thread id: a fixed string, or a function of the run's ``Context`` (``None``: the id the adapter keeps
#: in the context's state store, minted once per context).
ThreadId = str | Callable[[Context], str | None] | None

#: The state store key of what the adapter keeps in the ``Context`` (saved by ``to_dict``, read back by
#: ``from_dict``): the context's thread id and, for the turn being run, each tool id's message id.
STORE_KEY = "replaysafe"
#: LlamaIndex's own tool for handing off between agents: it only changes the context's state, and a replay of
#: a recorded handoff would leave that state unchanged, so it is never protected.
HANDOFF_TOOL = "handoff"

#: What the warning about a call with a missing id tells the user (the adapter is in use: the cause is elsewhere).
MISSING_IDS_FIX = (
    "A tool call id is missing when the model gave the call no id (LlamaIndex then passes an empty tool_id): use "
    'a model that gives ids, or key the tool by its arguments (@replay_safe(key="args"), or key="args" in '
    "replay_safe_agent's options) or by a business key (key=function). A message id is missing when the call "
    "was not planned by this wrapped agent's parse_agent_output step (a Context saved before the agent was "
    "wrapped): resume it with the agent wrapped from the start. A thread id is missing when thread_id= returns "
    "none for the Context."
)

#: The ``ToolCall`` event the ``call_tool`` step is running in this task (``_call_tool`` is not handed it).
_CURRENT: ContextVar[ToolCall | None] = ContextVar("replaysafe_llamaindex_call", default=None)


@dataclasses.dataclass
class _Settings:
    ledger: Ledger | None
    thread_id: ThreadId
    pauses: tuple[type[BaseException], ...]
    options: Mapping[str, Any]
    #: The function protecting each undecorated tool, made once per tool name (so a warning is said once per tool).
    protected: dict[tuple[str, bool], Callable[..., Any]] = dataclasses.field(default_factory=dict)

    def protect(self, tool_name: str, react: bool) -> Callable[..., Any]:
        found = self.protected.get((tool_name, react))
        if found is None:
            options = dict(self.options)
            if react:
                options.setdefault("key", "args")  # ReActAgent mints a new tool_id each time it parses an answer
            found = replay_safe(name=tool_name, ledger=self.ledger, exclude_args=("ctx", "tool", "run"), **options)(
                _execute
            )
            self.protected[(tool_name, react)] = found
        return found


#: Each wrapped agent's settings, by the agent (a copy ``replay_safe_agent`` made), for as long as it lives.
_SETTINGS: weakref.WeakKeyDictionary[Any, _Settings] = weakref.WeakKeyDictionary()
#: The wrapping class of each LlamaIndex class, made once.
_CLASSES: dict[type, type] = {}


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr, ensure_ascii=False)


def message_id(output: AgentOutput, position: int = 0) -> str:
    """The id of the model answer that asked for ``output``'s tool calls.

    LlamaIndex's ``ChatMessage`` has no id. The provider's response id, where the LLM integration left it in
    ``output.raw`` (``chatcmpl-…``, ``msg_…``, ``resp_…``), is best; otherwise a digest of the answer: its role,
    text and tool calls (ids, names, arguments), with ``position`` (where the answer stands in the conversation),
    so that the same answer at another point of the conversation is another message.
    """
    raw = output.raw
    raw_id = raw.get("id") if isinstance(raw, Mapping) else getattr(raw, "id", None)
    if isinstance(raw_id, str) and raw_id:
        return raw_id
    response = output.response
    answer = {
        "role": str(response.role.value if hasattr(response.role, "value") else response.role),
        "content": response.content or "",
        "calls": [[c.tool_id, c.tool_name, c.tool_kwargs] for c in output.tool_calls],
        "position": position,
    }
    return "llamaindex-" + hashlib.sha256(_json(answer).encode()).hexdigest()[:40]


async def _position(ctx: Context) -> int:
    """Where the conversation stands: the messages in memory and the agent's steps in this run."""
    store = ctx.store
    memory = await store.get("memory", default=None)
    messages = len(await memory.aget_all()) if memory is not None else 0
    iterations = await store.get("num_iterations", default=0)
    return messages * 1000 + int(iterations)


async def _remember(ctx: Context, output: AgentOutput, settings: _Settings) -> None:
    """Keep, in the context's state, the thread id (minted once) and this turn's message id of each tool id."""
    kept = dict(await ctx.store.get(STORE_KEY, default=None) or {})
    if settings.thread_id is None and not kept.get("thread_id"):
        kept["thread_id"] = f"llamaindex-{uuid.uuid4().hex}"
    message = message_id(output, await _position(ctx))
    kept["message"] = message  # for calls the model gave no id (LlamaIndex's tool_id is then empty)
    kept["messages"] = {call.tool_id: message for call in output.tool_calls if call.tool_id}
    await ctx.store.set(STORE_KEY, kept)


async def _call_ids(ctx: Context, ev: ToolCall, settings: _Settings) -> tuple[str, str, str]:
    kept = await ctx.store.get(STORE_KEY, default=None) or {}
    thread = settings.thread_id
    if thread is None:
        thread = kept.get("thread_id")
    elif not isinstance(thread, str):
        thread = thread(ctx)
    message = (kept.get("messages") or {}).get(ev.tool_id) if ev.tool_id else kept.get("message")
    return thread or "", message or "", ev.tool_id or ""


def _decorated(tool: AsyncBaseTool) -> bool:
    """Whether the tool's Python function is decorated with ``@replay_safe`` and protects itself."""
    if not isinstance(tool, FunctionTool):
        return False
    return any(is_replay_safe(function) for function in (tool.fn, tool.async_fn))


def _control_error(output: ToolOutput) -> BaseException | None:
    error = output.exception
    return error if isinstance(error, CONTROL_ERRORS) else None


async def _execute(arguments: Mapping[str, Any], ctx: Context, tool: AsyncBaseTool, run: Any) -> ToolOutput:
    """The body protected for an undecorated tool: LlamaIndex's own ``_call_tool``.

    It answers a tool's exception with an error ``ToolOutput``; that answer is raised again here, so that the
    call is not recorded (its claim is released and a resume runs the tool again), as for a decorated tool.
    """
    output = cast(ToolOutput, await run(ctx, tool, dict(arguments)))
    if output.is_error and output.exception is not None:
        raise output.exception
    return output


def _error_output(tool: AsyncBaseTool, arguments: Mapping[str, Any], error: Exception) -> ToolOutput:
    """The error ``ToolOutput`` LlamaIndex gives the model for a tool that raised (as its ``_call_tool`` does)."""
    return ToolOutput(
        content=str(error),
        tool_name=tool.metadata.get_name(),
        raw_input=dict(arguments),
        raw_output=str(error),
        is_error=True,
        exception=error,
    )


class _ReplaySafeSteps:
    """Overrides of the agents' (and ``AgentWorkflow``'s) steps; mixed in before the framework's class."""

    @step
    async def parse_agent_output(self, ctx: Context, ev: AgentOutput) -> StopEvent | AgentInput | ToolCall | None:
        """Note the answer's message id for each tool id before the ``ToolCall`` events are sent."""
        if ev.tool_calls and not ev.retry_messages:
            await _remember(ctx, ev, _SETTINGS[self])
        return cast(StopEvent | AgentInput | ToolCall | None, await cast(Any, super()).parse_agent_output(ctx, ev))

    @step
    async def call_tool(self, ctx: Context, ev: ToolCall) -> ToolCallResult:
        """LlamaIndex's ``call_tool``, with the call's event at hand for ``_call_tool``."""
        token = _CURRENT.set(ev)
        try:
            return cast(ToolCallResult, await cast(Any, super()).call_tool(ctx, ev))
        finally:
            _CURRENT.reset(token)

    async def _is_react(self, ctx: Context) -> bool:
        if isinstance(self, AgentWorkflow):
            name = await ctx.store.get("current_agent_name", default=None)
            return isinstance(self.agents.get(name), ReActAgent)
        return isinstance(self, ReActAgent)

    async def _call_tool(self, ctx: Context, tool: AsyncBaseTool, tool_input: dict[str, Any]) -> ToolOutput:
        run = cast(Any, super())._call_tool
        ev = _CURRENT.get()
        if ev is None or tool.metadata.get_name() == HANDOFF_TOOL:
            return cast(ToolOutput, await run(ctx, tool, tool_input))
        settings = _SETTINGS[self]
        thread, message, call = await _call_ids(ctx, ev, settings)
        pauses: tuple[type[BaseException], ...] = (WaitingForEvent, *settings.pauses)
        async with tool_call(
            thread, message, call, ledger=settings.ledger, pauses=pauses, missing_ids_fix=MISSING_IDS_FIX
        ):
            if _decorated(tool):
                output = cast(ToolOutput, await run(ctx, tool, tool_input))
                error = _control_error(output)
                if error is not None:
                    raise error  # replaysafe's refusal ends the run: shown to the model, it would be asked again
                return output
            protected = settings.protect(tool.metadata.get_name(), await self._is_react(ctx))
            try:
                return cast(ToolOutput, await protected(tool_input, ctx, tool, run))
            except CONTROL_ERRORS:
                raise
            except WaitingForEvent:
                raise
            except Exception as error:  # the tool's own (or its recorded) failure: an answer for the model
                return _error_output(tool, tool_input, error)


def _wrapped_class(cls: type[Any]) -> type[Any]:
    """``cls`` with the adapter's steps, a subclass: LlamaIndex finds a workflow's steps on its class."""
    wrapped = _CLASSES.get(cls)
    if wrapped is None:
        wrapped = type(f"ReplaySafe{cls.__name__}", (_ReplaySafeSteps, cls), {"__module__": cls.__module__})
        _CLASSES[cls] = wrapped
    return wrapped


def replay_safe_agent(
    agent: AgentT,
    *,
    ledger: Ledger | None = None,
    thread_id: ThreadId = None,
    pauses: Sequence[type[BaseException]] = (),
    **options: Any,
) -> AgentT:
    """A copy of ``agent`` (a ``FunctionAgent``, ``ReActAgent`` or ``AgentWorkflow``) whose tool calls run at
    most once per ``(thread, model answer, tool_id)``.

    The copy's ``call_tool`` step runs each call inside ``replaysafe.tool_call(...)``: a tool whose function is
    decorated with ``@replay_safe`` protects itself with its own options; any other tool's ``ToolOutput`` is
    recorded, with ``options`` as ``@replay_safe`` options (``in_doubt=``, ``lease=``, ``key=``...). Under a
    ``ReActAgent``, which mints a new ``tool_id`` each time it parses the model's answer, undecorated tools are
    keyed by their arguments (``key="args"``) unless ``key=`` says otherwise.

    ``thread_id``: the conversation's id, a string or a function of the ``Context``; by default an id the
    adapter mints once per ``Context`` and keeps in its state store, so ``Context.to_dict()`` /
    ``Context.from_dict()`` carry it to the run that resumes. ``pauses``: exceptions that pause a call for a
    human, besides LlamaIndex's own wait for an event (``ctx.wait_for_event``), which is one already.
    """
    if not isinstance(agent, (BaseWorkflowAgent, AgentWorkflow)):
        raise TypeError(
            f"replay_safe_agent() takes a LlamaIndex FunctionAgent, ReActAgent or AgentWorkflow, not "
            f"{type(agent).__name__}"
        )
    base = type(agent).__mro__[2] if isinstance(agent, _ReplaySafeSteps) else type(agent)  # wrapped again: anew
    wrapped = copy.copy(agent)
    object.__setattr__(wrapped, "__class__", _wrapped_class(base))
    _SETTINGS[wrapped] = _Settings(ledger, thread_id, tuple(pauses), dict(options))
    return wrapped
