"""Defaults, in one place so the docs and the code cannot drift apart."""

from __future__ import annotations

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
