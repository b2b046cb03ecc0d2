"""Real faults the tests cause in real ledgers while a protected call is under way."""

from __future__ import annotations

import datetime as dt
import sqlite3
from contextlib import closing
from pathlib import Path

from replaysafe import CallKey, Ledger

#: The owner token of the other worker that ``take_over_as_another_worker`` plays.
OTHER_WORKER = "other-host:1:1#1"


def drop_ledger_table(path: Path) -> None:
    """The SQLite ledger at ``path`` loses its table: its next write fails with SQLite's own error."""
    with closing(sqlite3.connect(path)) as connection, connection:
        connection.execute("DROP TABLE tool_executions")


def take_over_as_another_worker(
    ledger: Ledger, key: CallKey, *, tool_name: str = "refund_order", args_digest: str = "other", lease: float = 0
) -> None:
    """An operator clears the call and another worker (``OTHER_WORKER``) claims it, with a lease of
    ``lease`` seconds: a write this worker makes for the call afterwards is fenced off."""
    assert ledger.delete(key)
    now = dt.datetime.now(dt.timezone.utc)
    until = now + dt.timedelta(seconds=lease)
    claimed = ledger.claim(
        key, tool_name=tool_name, args_digest=args_digest, owner=OTHER_WORKER, now=now, lease_expires_at=until
    )
    assert claimed.claimed
