"""Protected 10xGraph tools, keyed by the ids the ToolNode injects into every call."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from tenxgraph.core.graph.tool_node.constants import is_injected_param
from tenxgraph.core.state import AgentState
from tenxgraph.utils.interrupt import GraphInterrupt, interrupt

from replaysafe import (
    CallInDoubtError,
    CallInProgressError,
    CallKey,
    Ledger,
    ReplaySafeError,
    is_replay_safe,
    replay_safe,
    tool_call,
)

from ._serializer import ToolResultSerializer

#: 10xGraph's pause: ``interrupt()`` inside a tool raises it to wait for a human. The claim is
#: released, never recorded, and the resumed call runs normally.
PAUSES: tuple[type[BaseException], ...] = (GraphInterrupt,)

#: Calls replaysafe refuses to run: in doubt under ``in_doubt="raise"``, or still running in another
#: worker when the wait ran out. Reported to the model as a failed tool result, either could make it
#: ask for the same side effect again under a new tool call id; so they pause the run instead.
REFUSALS: tuple[type[ReplaySafeError], ...] = (CallInDoubtError, CallInProgressError)

#: The ``reason`` of the ``interrupt()`` a refused call pauses the run with.
PAUSE_REASON = "replaysafe_refused"

#: What the ToolNode passes, by parameter name, to a tool that declares it (``LocalExecMixin``).
_IDS = ("tool_call_id", "state", "config")


def message_id(state: AgentState | None, tool_call_id: str | None) -> str | None:
    """The id of the assistant message in ``state.context`` that issued ``tool_call_id``, or ``None``.

    The latest such message wins: ids like ``call_1`` recur on every turn, and the message
    executing now is the last one that holds the call. 10xGraph persists the message with the
    thread's state before the ToolNode runs, so its id is the same when the node is replayed.
    """
    if state is None or not tool_call_id:
        return None
    for message in reversed(state.context or []):
        if message.role == "assistant" and any(
            isinstance(call, Mapping) and call.get("id") == tool_call_id for call in message.tools_calls or ()
        ):
            return str(message.message_id)
    return None


def call_key(config: Mapping[str, Any] | None, state: AgentState | None, tool_call_id: str | None) -> CallKey:
    """``(config["thread_id"], message_id(state, tool_call_id), tool_call_id)``; a missing id is ``""``."""
    thread_id = (config or {}).get("thread_id")
    return CallKey(
        "" if thread_id is None else str(thread_id),
        message_id(state, tool_call_id) or "",
        tool_call_id or "",
    )


def replay_safe_tool(
    function: Callable[..., Any],
    *,
    ledger: Ledger | None = None,
    pauses: Sequence[type[BaseException]] = (),
    pause_on_refusal: bool = True,
    **options: Any,
) -> Callable[..., Any]:
    """``function`` as a 10xGraph tool that runs at most once per ``(thread, message, tool call)``.

    Give the result to a ``ToolNode`` or ``ReactAgent(tools=...)`` in place of ``function``: the
    model sees the same name, docstring and parameters. The ToolNode then passes the wrapper the
    call's ``tool_call_id``, ``state`` and ``config`` (it does so for every parameter of these
    names); the wrapper keys the call by them and hands ``function`` only what it declared itself.

    ``options`` are ``@replay_safe`` options (``in_doubt=``, ``record_errors=``, ``lease=``...);
    the run config's ``tool_timeout`` and ``in_doubt`` override them per run. A function already
    decorated with ``@replay_safe`` keeps its own options (it should ``exclude_args`` any injected
    parameter it takes). Parameters 10xGraph injects are never part of the argument digest.
    """
    if not callable(function):
        raise TypeError(f"replay_safe_tool() takes a function, not {type(function).__name__}")
    name = getattr(function, "__name__", None)
    if not isinstance(name, str):
        raise TypeError("replay_safe_tool(): the ToolNode registers a tool under its __name__; this one has none")
    signature = inspect.signature(function)
    injected = tuple(n for n, p in signature.parameters.items() if is_injected_param(n, p))
    if is_replay_safe(function):
        protected = function
    else:
        options.setdefault("serializer", ToolResultSerializer())
        protected = replay_safe(name=name, exclude_args=injected, **options)(function)
    all_pauses = (*PAUSES, *pauses)
    # The ids the function does not take itself are added to the wrapper's signature for the
    # ToolNode to fill in, and removed again before the function is called.
    added = tuple(n for n in _IDS if n not in signature.parameters)

    def scope(kwargs: dict[str, Any]) -> tool_call:
        config = kwargs.get("config")
        call_id = kwargs.get("tool_call_id")
        state = kwargs.get("state")
        for id_name in added:
            kwargs.pop(id_name, None)
        return tool_call.from_config(
            config if isinstance(config, Mapping) else {},
            message_id=message_id(state if isinstance(state, AgentState) else None, call_id),
            tool_call_id=call_id if isinstance(call_id, str) else None,
            ledger=ledger,
            pauses=all_pauses,
        )

    def pause(error: ReplaySafeError) -> None:
        if not pause_on_refusal:
            return
        key = error.key or CallKey("", "", "")
        value = {
            "error": type(error).__name__,
            "tool_name": name,
            "thread_id": key.thread_id,
            "message_id": key.message_id,
            "tool_call_id": key.tool_call_id,
        }
        # Raises GraphInterrupt, which 10xGraph lets through its tool error handling; returns the
        # resume value when the run is resumed without the call having been settled.
        interrupt(value, message=str(error), reason=PAUSE_REASON)

    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(function):

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            try:
                async with scope(kwargs):
                    return await protected(*args, **kwargs)
            except REFUSALS as error:
                pause(error)
                raise

        wrapper = run_async
    else:

        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                with scope(kwargs):
                    return protected(*args, **kwargs)
            except REFUSALS as error:
                pause(error)
                raise

        wrapper = run

    functools.update_wrapper(wrapper, function)
    cast(Any, wrapper).__signature__ = _with_ids(signature, added)  # read by inspect.signature
    return wrapper


def replay_safe_tools(
    tools: Iterable[Callable[..., Any]],
    *,
    ledger: Ledger | None = None,
    pauses: Sequence[type[BaseException]] = (),
    pause_on_refusal: bool = True,
    **options: Any,
) -> list[Callable[..., Any]]:
    """:func:`replay_safe_tool` for each tool: ``ReactAgent(tools=replay_safe_tools([...], ledger=ledger))``."""
    return [
        replay_safe_tool(tool, ledger=ledger, pauses=pauses, pause_on_refusal=pause_on_refusal, **options)
        for tool in tools
    ]


def _with_ids(signature: inspect.Signature, added: tuple[str, ...]) -> inspect.Signature:
    """``signature`` plus keyword-only ``added`` parameters (before any ``**kwargs``)."""
    parameters = list(signature.parameters.values())
    extra = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in added]
    at = len(parameters)
    if parameters and parameters[-1].kind is inspect.Parameter.VAR_KEYWORD:
        at -= 1
    return signature.replace(parameters=[*parameters[:at], *extra, *parameters[at:]])
