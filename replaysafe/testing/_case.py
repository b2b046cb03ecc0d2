"""A crash-test case as the process running the entry point sees it: where it logs, where it dies.

``replaysafe crashtest`` runs the entry point in child processes with these environment variables.
Everything a child learns is appended, one JSON line at a time, to the case's log in the case's
directory (a line written before a SIGKILL is kept: the kernel has it once ``write`` returns), and
the parent reads the log once the child has ended.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from .._context import current_call_or_none
from .._crash_points import AFTER_RECORD, AFTER_RETURN
from .._records import CallKey

#: Where a ``run_in_child`` child writes what happened (its result, its error, or the point it died at).
OUTCOME_ENV = "REPLAYSAFE_TEST_OUTCOME"
#: The case's directory, the same for the crashed run and its resume: the entry point keeps its state there.
DIR_ENV = "REPLAYSAFE_CRASHTEST_DIR"
#: Which run of the case this process is: ``discover``, ``crash`` or ``resume``.
RUN_ENV = "REPLAYSAFE_CRASHTEST_RUN"
#: Where the crashed run dies (JSON): ``{"key": [thread, message, call], "point": ..., "at": "start"|"effect"}``
#: for a protected call, ``{"effect": name, "point": "after-return"}`` for an unprotected side effect.
KILL_ENV = "REPLAYSAFE_CRASHTEST_KILL"
#: The import path of the process running the crash test (JSON): added to each run's own.
SYS_PATH_ENV = "REPLAYSAFE_CRASHTEST_SYS_PATH"
#: The log's file name in the case's directory.
LOG_NAME = ".replaysafe-crashtest.jsonl"


def key_list(key: CallKey | None) -> list[str] | None:
    return None if key is None else [key.thread_id, key.message_id, key.tool_call_id]


class Case:
    """This process's part of a case: its run's name, the kill it was asked for, the log it writes."""

    def __init__(self, folder: str, run: str, kill: dict[str, Any] | None) -> None:
        self.run = run
        self.kill = kill
        self._log = Path(folder) / LOG_NAME
        self._lock = threading.Lock()
        #: The calls whose body runs (started, outcome not yet told), and those being paused for a decision
        #: they asked for before any body ran (an approval requested): their pause is not an outcome.
        self._running: collections.Counter[CallKey] = collections.Counter()
        self._asking: set[CallKey] = set()

    def note(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"run": self.run, "pid": os.getpid(), "kind": kind, **fields}) + "\n"
        with self._lock, self._log.open("a", encoding="utf-8") as log:
            log.write(line)  # one write of one line, appended: whole even when the process dies next

    def die(self, **where: Any) -> None:
        """SIGKILL this process, having logged where: no ``finally``, no ``atexit`` runs."""
        self.note("killed", **where)
        os.kill(os.getpid(), signal.SIGKILL)

    def _kills_call(self, point: str, key: CallKey, at: str | None = None) -> bool:
        kill = self.kill
        return (
            kill is not None
            and kill.get("point") == point
            and kill.get("key") == key_list(key)
            and (at is None or kill.get("at") == at)
        )

    def point(self, point: str, key: CallKey, tool_name: str, status: str | None) -> None:
        """A call reached ``point`` (``replaysafe._crash_points``): logged, and the process dies if asked.

        A call paused to ask for a decision before its body ever ran (``needs_approval``, a framework's request)
        reaches no ``after-return`` or ``after-record``: nothing returned, and its outcome is not written. It is
        logged as ``asked``, and no case kills there (``decided`` is the point after it)."""
        if point == AFTER_RETURN:
            with self._lock:
                if self._running[key]:
                    self._running[key] -= 1
                elif status == "paused":
                    self._asking.add(key)
        if key in self._asking and point in (AFTER_RETURN, AFTER_RECORD):
            if point == AFTER_RECORD:
                self._asking.discard(key)
            self.note("asked", key=key_list(key), tool=tool_name, written=point == AFTER_RECORD)
            return
        parent = current_call_or_none() if point == "before" else None
        parent_key = key_list(parent and parent.key)
        self.note("point", point=point, key=key_list(key), tool=tool_name, parent=parent_key, status=status)
        if self._kills_call(point, key):
            self.die(point=point, key=key_list(key), tool=tool_name)

    def started(self, key: CallKey, tool_name: str) -> None:
        """A call's body starts: its ``inside`` point when the call makes no marked side effect."""
        with self._lock:
            self._running[key] += 1
        if self._kills_call("inside", key, at="start"):
            self.die(point="inside", key=key_list(key), tool=tool_name)

    def effect(self, name: str, args: str | None = None) -> None:
        """A marked side effect ran (``side_effect``), with arguments of digest ``args``; it dies here if this
        is where it was asked to."""
        call = current_call_or_none()
        chain: list[list[str] | None] = []
        while call is not None:
            chain.append(key_list(call.key))
            call = call.parent
        self.note("effect", name=name, args=args, calls=chain)
        kill = self.kill
        if kill is None:
            return
        if kill.get("effect") == name and not chain:
            self.die(point="after-return", effect=name)
        elif kill.get("point") == "inside" and kill.get("at") == "effect" and kill.get("key") in chain:
            self.die(point="inside", key=kill["key"], effect=name)


_case: Case | None = None
_loaded = False
_load_lock = threading.Lock()


def current() -> Case | None:
    """The case this process runs in, or ``None`` outside ``replaysafe crashtest`` (read once)."""
    global _case, _loaded
    if _loaded:
        return _case
    with _load_lock:
        if not _loaded:
            folder = os.environ.get(DIR_ENV)
            run = os.environ.get(RUN_ENV)
            if folder and run:
                kill = os.environ.get(KILL_ENV)
                _case = Case(folder, run, json.loads(kill) if kill else None)
            _loaded = True
    return _case
