"""Finishing writes the ledger refused (or an interrupt cut short), tried again in the background.

When a tool has run but its record (or the release of its claim) cannot be
written because the ledger is down, the claim would otherwise stay ``running``
under a live owner, and every replay would wait on it. So the write is kept and
tried again, with a growing pause, until the ledger answers: then the record
lands and replays return it. The queue is bounded in size and in age; what is
dropped is logged with the call's ids.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any

from ._calls import CALLS
from ._core import Complete, Release
from ._errors import describe
from ._events import logger
from ._retry import NoWriteMadeError, background_retrying

#: How many writes wait at most, and for how long, before they are given up.
MAX_PENDING = 10_000
MAX_AGE = 3600.0


@dataclasses.dataclass(slots=True)
class _Write:
    effect: Complete | Release
    ledger: Any
    tool_name: str
    since: float
    #: The ledger's count of ``close()`` calls when the write was kept (see ``_settled``).
    closes: int


class PendingWrites:
    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # Also run in a forked child: the parent's thread does not exist there, its lock
        # may have been copied held, and its queued writes are the parent's to make.
        self._writes: list[_Write] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def defer(self, effect: Complete | Release, ledger: Any, tool_name: str) -> None:
        with self._lock:
            if len(self._writes) >= MAX_PENDING:
                dropped = self._writes.pop(0)
                _give_up(dropped, "too many writes are waiting")
            self._writes.append(_Write(effect, ledger, tool_name, time.monotonic(), _closes(ledger)))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="replaysafe-pending-writes", daemon=True)
                self._thread.start()
        self._wake.set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._writes)

    def waiting_for(self, ledger: Any) -> int:
        """How many of the waiting writes are to ``ledger``."""
        with self._lock:
            return sum(1 for write in self._writes if write.ledger is ledger)

    def _run(self) -> None:
        # Rounds until every write is made or given up; the pause between two rounds
        # grows while the ledger stays down, and starts short again after progress.
        while self._has_writes():
            background_retrying(self._nap)(self._round)

    def _has_writes(self) -> bool:
        with self._lock:
            if not self._writes:
                self._thread = None
                return False
            return True

    def _nap(self, seconds: float) -> None:
        """A pause between rounds, cut short by a new write."""
        self._wake.wait(seconds)

    def _round(self) -> None:
        """Try every waiting write once; ``NoWriteMadeError`` when none of them could be made."""
        self._wake.clear()  # a write deferred from now on shortens the next pause
        with self._lock:
            writes = list(self._writes)
        progress = False
        for write in writes:
            if time.monotonic() - write.since > MAX_AGE:
                _give_up(write, f"the ledger did not take it for {MAX_AGE:g}s")
                self._settled(write)
                continue
            try:
                written = CALLS[type(write.effect)](write.ledger, write.effect)
            except Exception:
                continue  # still down: try again after a pause
            progress = True
            self._settled(write)
            logger.warning(
                "%s: a %s kept for later (it had failed or been interrupted) is written now%s",
                describe(write.tool_name, write.effect.key),
                type(write.effect).__name__.lower(),
                "" if written else " (its claim had been taken over meanwhile)",
            )
        if writes and not progress:
            raise NoWriteMadeError

    def _settled(self, write: _Write) -> None:
        """Forget a write made or given up. If its ledger was closed since the write was kept
        and no other write waits for it, close it again: the write reopened its connections
        (a ledger reopens when used), which its owner, done with it, would otherwise leave open."""
        with self._lock:
            if write in self._writes:
                self._writes.remove(write)
            reclose = _closes(write.ledger) != write.closes and not any(
                other.ledger is write.ledger for other in self._writes
            )
        if reclose:
            try:
                write.ledger.close()
            except Exception:  # closing is best effort: the write itself is made
                logger.exception(
                    "%s: the write is made, but the ledger it reopened could not be closed again "
                    "(its connections close when it is collected)",
                    describe(write.tool_name, write.effect.key),
                )


def _closes(ledger: Any) -> int:
    """How many times ``ledger`` was closed (0 for a ledger of the application's own that does not count)."""
    return getattr(ledger, "_closes", 0)


def _give_up(write: _Write, why: str) -> None:
    logger.error(
        "%s: gave up writing a %s (%s); the call stays claimed until its owner process ends or its lease runs out",
        describe(write.tool_name, write.effect.key),
        type(write.effect).__name__.lower(),
        why,
    )


pending_writes = PendingWrites()
