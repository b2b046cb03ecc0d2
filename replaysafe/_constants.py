"""Defaults, in one place so the docs and the code cannot drift apart; and the "not given" sentinel the
settings that take them share (the lowest module: settings and scopes both read it)."""

from __future__ import annotations

from typing import Any


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: "Not given here": look further (``None`` and ``0`` mean "no timeout").
UNSET: Any = _Unset()


def timeout_setting(value: float | None, what: str) -> float | None:
    """``None`` and ``0`` disable a timeout; a negative one is a mistake."""
    if value is UNSET:
        return value  # type: ignore[no-any-return]
    if value is None or value == 0:
        return None
    if value < 0:
        raise ValueError(f"{what} must be a positive number of seconds, or None/0 to disable; got {value!r}")
    return float(value)


#: Seconds a protected tool may run (used by timeouts and to size the lease).
TOOL_TIMEOUT = 300.0
#: Seconds a whole node (all protected calls in one ``node()`` block) may run.
NODE_TIMEOUT = 900.0
#: Seconds a claim outlives the tool timeout, so a slow owner is not taken over early.
LEASE_MARGIN = 30.0
#: Seconds a ``running`` record is owned before it is considered in doubt.
LEASE = TOOL_TIMEOUT + LEASE_MARGIN
#: Seconds a replay waits for a live owner to finish the same call.
WAIT_TIMEOUT = 30.0
#: First and largest pause between two looks at a call that another worker runs.
WAIT_BACKOFF_FIRST = 0.02
WAIT_BACKOFF_MAX = 1.0
#: Ledger operations that fail with a transient error are tried this often in all ...
LEDGER_RETRY_ATTEMPTS = 3
#: ... and for at most this many seconds, backoff included.
LEDGER_RETRY_MAX_SECONDS = 0.5
#: The environment variable naming the default ledger.
LEDGER_URL_ENV = "REPLAYSAFE_LEDGER_URL"
#: The environment variable that, set to 1, makes every protected tool run plainly (unit tests of tool bodies).
DISABLED_ENV = "REPLAYSAFE_DISABLED"
#: The table every SQL ledger uses unless told otherwise.
TABLE_NAME = "tool_executions"
#: The largest encoded result a call records; a larger one is a record failure.
MAX_RESULT_BYTES = 16 * 1024 * 1024
#: Seconds a server ledger waits to open a connection ...
LEDGER_CONNECT_TIMEOUT = 5.0
#: ... and for any one answer (a read, a statement), so a stalled server cannot hang a call.
LEDGER_IO_TIMEOUT = 15.0
