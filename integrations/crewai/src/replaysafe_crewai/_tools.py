"""Replay-safe CrewAI tools: each call keyed by (Flow id or app thread id, assistant message digest, call id)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

from crewai.tools import BaseTool
from crewai.tools.base_tool import Tool

from replaysafe import CONTROL_ERRORS, Ledger, is_replay_safe, replay_safe, tool_call

from ._calls import MISSING_IDS_FIX, Refused, current_native_call, install, surfacing

#: The app's thread id: a fixed string (inside a ``@persist`` Flow: ``self.state.id``), or a function of the crew
#: running the call (``None`` for an agent run alone) that returns it.
ThreadId = str | Callable[[Any], str | None]

TTool = TypeVar("TTool", bound=BaseTool)

#: Marks a tool this adapter made, so that wrapping a crew twice does not wrap its tools twice.
_MARK = "__replaysafe_crewai__"


def _thread(thread_id: ThreadId | None, crew: Any) -> str | None:
    if thread_id is None:
        return None
    return thread_id if isinstance(thread_id, str) else thread_id(crew)


def _guarded(
    function: Callable[..., Any],
    *,
    ledger: Ledger | None,
    thread_id: ThreadId | None,
    pauses: tuple[type[BaseException], ...],
) -> Callable[..., Any]:
    """``function`` (protected already) run under its call's key, its refusals carried past CrewAI."""

    def key() -> tuple[str | None, str | None, str | None]:
        call = current_native_call()
        if call is None:  # not run by CrewAI's native tool calling: no ids (the core warns, or raises)
            return _thread(thread_id, None), None, None
        return _thread(thread_id, call.crew), call.message_id, call.tool_call_id

    def refuse(error: BaseException) -> BaseException:
        assert isinstance(error, CONTROL_ERRORS)
        # Inside the adapter's hook, the carrier passes CrewAI's ``except Exception`` and the hook re-raises the
        # error; anywhere else the error itself, made a ``HookAborted`` (CrewAI's own "stop the run").
        return Refused(error) if current_native_call() is not None else surfacing(error)

    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def arun(*args: Any, **kwargs: Any) -> Any:
            try:
                async with tool_call(*key(), ledger=ledger, pauses=pauses, missing_ids_fix=MISSING_IDS_FIX):
                    return await function(*args, **kwargs)
            except CONTROL_ERRORS as error:
                raise refuse(error) from None

        return arun

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            with tool_call(*key(), ledger=ledger, pauses=pauses, missing_ids_fix=MISSING_IDS_FIX):
                return function(*args, **kwargs)
        except CONTROL_ERRORS as error:
            raise refuse(error) from None

    return run


def _protected(
    function: Callable[..., Any], name: str, ledger: Ledger | None, options: Mapping[str, Any]
) -> Callable[..., Any]:
    """``function`` as a ``@replay_safe`` tool named after the CrewAI tool, unless it protects itself."""
    if is_replay_safe(function):
        return function
    return replay_safe(name=name, ledger=ledger, **options)(function)


def replay_safe_tool(
    tool: TTool,
    ledger: Ledger | None = None,
    *,
    thread_id: ThreadId | None = None,
    pauses: Sequence[type[BaseException]] = (),
    **options: Any,
) -> TTool:
    """A copy of ``tool`` whose calls run at most once per (thread, model turn, call).

    A ``Tool`` (what ``@tool`` makes) gets its function protected, sync or ``async def``; any other ``BaseTool``
    its ``_run`` and ``_arun``. A function already decorated with ``@replay_safe`` keeps its own options. The
    result is recorded under the tool's name; ``options`` are ``@replay_safe`` options (``key="args"``,
    ``in_doubt=``, ``lease=``, ``on_missing_ids=``...). ``thread_id``: a string or a function of the crew;
    without one a call has no thread id, and runs unprotected with a warning (``on_missing_ids="raise"``: refused).
    """
    install()
    if getattr(tool, _MARK, False):
        return tool
    settings: dict[str, Any] = {"ledger": ledger, "thread_id": thread_id, "pauses": tuple(pauses)}
    copy: TTool
    if isinstance(tool, Tool):
        func = _guarded(_protected(tool.func, tool.name, ledger, options), **settings)
        copy = cast(TTool, tool.model_copy(update={"func": func}))
    else:
        copy = tool.model_copy()
        run = _guarded(_protected(tool._run, tool.name, ledger, options), **settings)
        object.__setattr__(copy, "_run", run)  # an instance attribute: BaseTool.run calls self._run
        if type(tool)._arun is not BaseTool._arun:  # the tool has an async implementation of its own
            arun = _guarded(_protected(tool._arun, tool.name, ledger, options), **settings)
            object.__setattr__(copy, "_arun", arun)
    object.__setattr__(copy, _MARK, True)
    return copy


def replay_safe_tools(
    tools: Iterable[BaseTool],
    ledger: Ledger | None = None,
    *,
    thread_id: ThreadId | None = None,
    pauses: Sequence[type[BaseException]] = (),
    **options: Any,
) -> list[BaseTool]:
    """Each of ``tools`` wrapped by :func:`replay_safe_tool`, for ``Agent(tools=...)`` or ``Task(tools=...)``."""
    return [replay_safe_tool(tool, ledger, thread_id=thread_id, pauses=pauses, **options) for tool in tools]


def replay_safe_crew(
    crew: Any,
    *,
    ledger: Ledger | None = None,
    thread_id: ThreadId | None = None,
    pauses: Sequence[type[BaseException]] = (),
    **options: Any,
) -> Any:
    """``crew`` with the tools of its agents (its manager agent included) and of its tasks wrapped by
    :func:`replay_safe_tool`; the same ``Crew`` object, changed in place, is returned.

    Build the crew, wrap it, then ``kickoff``. Inside a ``Flow`` with ``@persist``, ``thread_id=self.state.id``
    (the id ``kickoff(inputs={"id": ...})`` resumes it by); for a crew restored from a CrewAI checkpoint,
    ``thread_id=lambda crew: str(crew.id)``.
    """
    settings: dict[str, Any] = {"thread_id": thread_id, "pauses": pauses, **options}
    agents = [*getattr(crew, "agents", ()), getattr(crew, "manager_agent", None)]
    for agent in agents:
        if agent is not None and agent.tools:
            agent.tools = replay_safe_tools(agent.tools, ledger, **settings)
    for task in getattr(crew, "tasks", ()):
        if task.tools:
            task.tools = replay_safe_tools(task.tools, ledger, **settings)
    install()
    return crew
