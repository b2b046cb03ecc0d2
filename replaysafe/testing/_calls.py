"""Count what happened to each protected tool while a block ran."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from .._decorator import tool_of
from .._events import Event, EventKind, on_event


def _tool_name(tool: object) -> str:
    if isinstance(tool, str):
        return tool
    protected = tool_of(tool)
    if protected is None:
        raise TypeError(
            f"{tool!r} is not a @replay_safe tool: pass the decorated function or its tool name "
            "(adapters name a tool as the framework does)."
        )
    return protected.spec.name


class CallLog:
    """The events of protected calls, in order, as ``record_calls()`` collected them.

    A tool is given as the decorated function or as its tool name (a string). ``starts``
    counts the times its body began (``started`` events): every execution, including one that
    raised, paused or was interrupted. ``runs`` counts the calls whose body returned
    (``executed`` events, whether or not the result could be recorded: ``Event.recorded``
    says); ``replays`` the calls answered from the ledger without running. To prove a side
    effect happened once, assert on ``starts``: a body that raised after its side effect and
    ran again is two starts and one run. Calls that ran plainly (no ledger, no ids, protection
    disabled) leave no trace here.
    """

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def _add(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def count(self, tool: object, kind: EventKind) -> int:
        """How many ``kind`` events ``tool`` had."""
        name = _tool_name(tool)
        with self._lock:
            return sum(1 for event in self.events if event.tool_name == name and event.kind is kind)

    def starts(self, tool: object) -> int:
        """How many times the tool's body began, however it ended (returned, raised, paused, interrupted)."""
        return self.count(tool, EventKind.STARTED)

    def runs(self, tool: object) -> int:
        """How many times the tool's body returned (its result recorded or not)."""
        return self.count(tool, EventKind.EXECUTED)

    def replays(self, tool: object) -> int:
        """How many calls of the tool were answered with a recorded result, the body not run."""
        return self.count(tool, EventKind.REPLAYED)

    def ran_once(self, tool: object) -> bool:
        """Whether the tool's body ran exactly once (however many replays followed)."""
        return self.runs(tool) == 1

    def assert_ran_once(self, tool: object) -> None:
        """Fail with the counts unless the tool's body ran exactly once."""
        self.assert_runs(tool, 1)

    def assert_runs(self, tool: object, times: int) -> None:
        """Fail with the counts unless the tool's body ran (returned) exactly ``times`` times."""
        runs, replays = self.runs(tool), self.replays(tool)
        if runs != times:
            raise AssertionError(
                f"{_tool_name(tool)}: its body ran {runs} time(s), expected {times} "
                f"({self.starts(tool)} start(s), {replays} replay(s) recorded)"
            )

    def assert_starts(self, tool: object, times: int) -> None:
        """Fail with the counts unless the tool's body began exactly ``times`` times (however each ended)."""
        starts = self.starts(tool)
        if starts != times:
            raise AssertionError(
                f"{_tool_name(tool)}: its body began {starts} time(s), expected {times} "
                f"({self.runs(tool)} returned, {self.replays(tool)} replay(s) recorded)"
            )


@contextlib.contextmanager
def record_calls() -> Iterator[CallLog]:
    """Collect the events of every protected call made inside the block (all threads)."""
    log = CallLog()
    unsubscribe = on_event(log._add)
    try:
        yield log
    finally:
        unsubscribe()
