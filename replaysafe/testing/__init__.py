"""Helpers for testing code that uses replaysafe (the pytest plugin builds on them).

- ``reset()`` puts replaysafe's process-wide state back as a fresh import has it.
- ``disabled()`` makes every protected tool run plainly inside a block, as
  ``REPLAYSAFE_DISABLED=1`` does for a whole process: for unit tests of tool bodies.
- ``record_calls()`` counts, per tool, how often its body ran and how often a recorded
  result was replayed instead.
- ``run_in_child()`` runs a function in a new Python process and, with ``kill_at=``,
  SIGKILLs it when it reaches ``kill_point(name)``: a crash-and-resume test in a few lines.
- ``SteppedClock`` is a clock that moves only when the test steps it: leases run out,
  are renewed and are taken over when ``advance()`` says, not after real sleeps.
- ``crashtest()`` is ``replaysafe crashtest`` from Python: it SIGKILLs an agent at every point
  of every tool call, resumes it and counts side effects (``CrashReport``); ``side_effect``
  marks a function whose executions it counts.

The pytest plugin (loaded automatically once replaysafe is installed) adds the fixtures
``replaysafe_ledger`` (a fresh ``MemoryLedger`` as the default ledger for one test),
``replaysafe_calls`` (``record_calls()`` around one test) and ``replaysafe_clock`` (a
``SteppedClock`` in use for one test).
"""

from __future__ import annotations

from ._calls import CallLog, record_calls
from ._child import ChildError, ChildRun, kill_point, run_in_child
from ._clock import SteppedClock
from ._crashtest import CrashReport, CrashTestError, crashtest
from ._effects import side_effect
from ._script import IdStyle, Script, ScriptedCall, Turn, provider_id
from ._state import disabled, reset

__all__ = [
    "CallLog",
    "ChildError",
    "ChildRun",
    "CrashReport",
    "CrashTestError",
    "IdStyle",
    "Script",
    "ScriptedCall",
    "SteppedClock",
    "crashtest",
    "disabled",
    "kill_point",
    "provider_id",
    "record_calls",
    "reset",
    "run_in_child",
    "side_effect",
    "Turn",
]
