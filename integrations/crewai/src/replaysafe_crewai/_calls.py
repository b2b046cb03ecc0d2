"""Which native tool call is running: the ids CrewAI's executor has in hand, set where it executes the call.

CrewAI passes a tool only its arguments: neither the tool, nor ``before_tool_call`` hooks
(``ToolCallHookContext``), nor ``ToolUsageStartedEvent`` see the model's tool call id. The one place that
has it is ``AgentExecutor._execute_single_native_tool_call(tool_call)``, which runs each call of a model
turn (side by side in threads, each under ``contextvars.copy_context()``). ``install()`` wraps that method
once per process: around each call it sets the call's ids in a context variable, which the tools
``replay_safe_tools`` wrapped read, and turns replaysafe's refusals into an error that ends the run.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from crewai.agents.agent_executor import AgentExecutor
from crewai.hooks.dispatch import HookAborted
from crewai.utilities.agent_utils import extract_tool_call_info

from replaysafe import CONTROL_ERRORS, ReplaySafeError, ReplaySafeWarning


class NativeCall(NamedTuple):
    """The call CrewAI's executor is running: its ids and where it runs (the thread is the app's)."""

    #: A digest of the assistant message holding the call (see ``message_id``).
    message_id: str
    #: The provider's tool call id, or ``args-<digest>`` where the provider gave none.
    tool_call_id: str
    #: The executor's crew (``None`` for an agent run alone): what a ``thread_id=`` function is handed.
    crew: Any
    #: The tool's name as the model called it.
    tool_name: str


_current: contextvars.ContextVar[NativeCall | None] = contextvars.ContextVar("replaysafe_crewai_call", default=None)


def current_native_call() -> NativeCall | None:
    """The native tool call running in this context, as the adapter keys it (``None`` outside one)."""
    return _current.get()


#: What the message about a call with a missing id tells the user (the adapter is in use: the cause is elsewhere).
MISSING_IDS_FIX = (
    "CrewAI gives a call its ids only on its native tool-calling path (an LLM whose supports_function_calling() "
    "is true): a ReAct (text) tool call, a planning step or a tool run outside an agent has none. A thread id "
    "is missing when no thread_id= was given: inside a Flow with @persist, pass replay_safe_crew(crew, "
    "thread_id=self.state.id) (the persisted id the Flow is resumed by). Or key the tool by its "
    'arguments (key="args" in the adapter\'s options) or by a business key (key=function).'
)


def _canonical(arguments: Any) -> Any:
    """The call's arguments as JSON values: a JSON string is parsed, so ``'{"a": 1}'`` and ``{"a": 1}`` agree."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _assistant_message(messages: Sequence[Any], call_id: str) -> tuple[int, Mapping[str, Any] | None]:
    """The latest assistant message whose ``tool_calls`` hold ``call_id``, and its place in the conversation."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls") or ()
        if any(isinstance(call, Mapping) and call.get("id") == call_id for call in calls):
            return index, message
    return -1, None


def message_id(
    messages: Sequence[Any], call_id: str, *, stable_ids: bool, task_key: str = "", agent_key: str = ""
) -> str:
    """A message id for the call: a digest of the assistant message that holds it.

    CrewAI keeps no id of the model's response: the executor appends the turn to its conversation as
    ``{"role": "assistant", "tool_calls": [...]}``. The digest covers that message's calls (their ids, names
    and arguments; without the ids where the provider gave none), its place in the conversation, and the
    task and agent keys (md5 digests CrewAI derives from their text), so the same answer at another turn, or
    in another task of the thread, is another message. A resume that asks the model again and gets the same
    answer (a persisted Flow re-running its crew, a task retry) gets the same id.
    """
    index, message = _assistant_message(messages, call_id)
    calls = []
    for call in (message or {}).get("tool_calls") or ():
        function = call.get("function") or {}
        entry = {"name": function.get("name"), "arguments": _canonical(function.get("arguments"))}
        if stable_ids:
            entry["id"] = call.get("id")
        calls.append(entry)
    if message is None:  # not in the conversation (an executor of another shape): the call alone
        calls = [{"id": call_id}]
    seed = {"task": task_key, "agent": agent_key, "at": index, "calls": calls}
    return "crewai-msg-" + _digest(seed)[:40]


def fallback_call_id(messages: Sequence[Any], call_id: str, name: str, arguments: Any) -> str:
    """A tool call id for a call whose provider gave none: the digest of its name and arguments, numbered
    when the message holds the same call more than once (``args-<digest>``, ``args-<digest>-2``)."""
    own = _digest({"name": name, "arguments": _canonical(arguments)})
    _, message = _assistant_message(messages, call_id)
    before = 0
    for call in (message or {}).get("tool_calls") or ():
        if call.get("id") == call_id:
            break
        function = call.get("function") or {}
        if _digest({"name": function.get("name"), "arguments": _canonical(function.get("arguments"))}) == own:
            before += 1
    return f"args-{own[:32]}" + (f"-{before + 1}" if before else "")


#: Tools already told that their calls are keyed by a digest (once per tool name and process).
_warned_fallback: set[str] = set()
_warned_lock = threading.Lock()


def _warn_fallback(tool_name: str) -> None:
    with _warned_lock:
        if tool_name in _warned_fallback:
            return
        _warned_fallback.add(tool_name)
    warnings.warn(
        f"{tool_name}: the model's tool calls carry no id of the provider's (CrewAI numbers them call_<id(obj)>, "
        "new in every process), so the adapter keys them by a digest of the assistant message and of the call's "
        "arguments: two calls with the same arguments in one message are told apart by their order, and the same "
        "answer on another turn is another call. Use a provider that gives tool call ids, or key the tool by a "
        "business key (key=function in the adapter's options).",
        ReplaySafeWarning,
        stacklevel=2,
    )


def native_call(executor: AgentExecutor, raw_call: Any) -> NativeCall | None:
    """The key of ``raw_call`` as the executor runs it, or ``None`` for a call CrewAI cannot read."""
    info = extract_tool_call_info(raw_call)
    if info is None:
        return None
    call_id, name, arguments = info
    stable = bool(call_id) and call_id != f"call_{id(raw_call)}"
    messages = list(getattr(getattr(executor, "state", None), "messages", None) or ())
    task, agent = getattr(executor, "task", None), getattr(executor, "agent", None)
    message = message_id(
        messages,
        call_id,
        stable_ids=stable,
        task_key=str(getattr(task, "key", "") or ""),
        agent_key=str(getattr(agent, "key", "") or ""),
    )
    if not stable:
        _warn_fallback(name)
    call = call_id if stable else fallback_call_id(messages, call_id, name, arguments)
    return NativeCall(message, call, getattr(executor, "crew", None), name)


# --- replaysafe's refusals end the run -------------------------------------------------------------------


def _crewai_error(kind: type[ReplaySafeError]) -> type[ReplaySafeError]:
    """``kind``, also a CrewAI ``HookAborted``: named as it is, so ``except CallInDoubtError`` catches it."""
    return type(kind.__name__, (kind, HookAborted), {"__module__": __name__, "__doc__": kind.__doc__})


#: Each of replaysafe's ``CONTROL_ERRORS`` as a ``HookAborted`` too. CrewAI turns a tool's exception into a
#: message for the model ("Error executing tool: ..."), and an agent retries a task that raised; a
#: ``HookAborted`` is its "deliberate stop": let out of a parallel batch, never retried, never shown to the model.
_CREWAI_ERRORS: dict[type[ReplaySafeError], type[ReplaySafeError]] = {
    kind: _crewai_error(kind) for kind in CONTROL_ERRORS
}


def surfacing(error: ReplaySafeError) -> ReplaySafeError:
    """``error`` made a ``HookAborted`` too (its class swapped for the subclass above), so CrewAI ends the run."""
    if isinstance(error, HookAborted):
        return error
    kind = next((crewai for plain, crewai in _CREWAI_ERRORS.items() if type(error) is plain), None)
    if kind is None:  # a subclass of one of them: its own pair, made once
        kind = _CREWAI_ERRORS.setdefault(type(error), _crewai_error(type(error)))
    error.__class__ = kind
    error.reason = str(error)  # type: ignore[attr-defined]  # what HookAborted.__init__ sets
    error.source = "replaysafe"  # type: ignore[attr-defined]
    return error


class Refused(BaseException):
    """Carries one of replaysafe's ``CONTROL_ERRORS`` past CrewAI's ``except Exception`` around a tool."""

    def __init__(self, error: ReplaySafeError) -> None:
        super().__init__(type(error).__name__)
        self.error = error


# --- the hook -------------------------------------------------------------------------------------------

_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Wrap ``AgentExecutor._execute_single_native_tool_call`` (once per process; idempotent).

    The wrapper only sets the call's key around CrewAI's own method and re-raises replaysafe's refusals: a
    crew whose tools are not wrapped runs as before.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        original: Callable[[AgentExecutor, Any], dict[str, Any]] = AgentExecutor._execute_single_native_tool_call

        @functools.wraps(original)
        def execute_single_native_tool_call(self: AgentExecutor, raw_call: Any) -> dict[str, Any]:
            call = native_call(self, raw_call)
            if call is None:
                return original(self, raw_call)
            token = _current.set(call)
            try:
                return original(self, raw_call)
            except Refused as refused:
                raise surfacing(refused.error) from None
            finally:
                _current.reset(token)

        AgentExecutor._execute_single_native_tool_call = execute_single_native_tool_call  # type: ignore[method-assign,assignment]
        _installed = True
