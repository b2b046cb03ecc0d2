"""A stepped clock: replaysafe's time, moved by the test alone."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from types import TracebackType

from .. import _drivers, _renewer
from .._clock import Clocks

#: How long ``advance`` waits for the lease renewer to make the renewals due (a hung ledger fails the step).
RENEWALS_TIMEOUT = 60.0


class SteppedClock:
    """A wall clock and a monotonic clock that move only when they are stepped.

    Inside ``with SteppedClock() as clock:`` (or the pytest fixture ``replaysafe_clock``), replaysafe
    reads this clock where it reads the machine's: the time a claim is made at and its lease runs to,
    whether a lease has run out (the call is then in doubt and taken over), when each running call's
    lease is renewed and until when, how long a tool ran (a late report), how long a replay has waited
    for a live owner, and the time SQL ledgers hide records whose ttl ran out at. ``advance`` moves
    both clocks and returns once every lease renewal due by the new time is made. A replay that waits
    for a live owner steps the clock by each pause between its looks instead of sleeping: its wait
    gives up after ``wait_timeout`` of this clock, at once in real time.

    The machine's time still runs the timers that interrupt a tool at a deadline you gave it
    (SIGALRM, a worker thread's wait, ``asyncio.timeout``), node deadlines (``node(node_timeout=...)``)
    and Redis's ttl (the server expires the key by its own clock). The clock is process-wide: calls in
    every thread read it, and only one process does.

    ``start`` is where the wall clock starts (timezone-aware; by default, the time replaysafe reads when
    the clock is made: the machine's): a clock started in the past writes records that look old to a
    reader on the real clock (a CLI run in another process). The monotonic clock starts where
    replaysafe's reads then.
    """

    def __init__(self, start: datetime | None = None) -> None:
        if start is not None and start.utcoffset() is None:
            raise ValueError(f"SteppedClock(start=...) needs a timezone-aware datetime, got {start!r}")
        #: Both clocks, in one attribute: a reader sees both before a step, or both after it. Each step is
        #: added to the values before it (replaysafe adds its renewal intervals to a reading the same way).
        self._times = ((start or _renewer._now()).astimezone(timezone.utc), _renewer._monotonic())
        self._stepped = 0.0
        self._lock = threading.Lock()
        self._before: Clocks | None = None

    def now(self) -> datetime:
        """The wall clock: timezone-aware UTC."""
        return self._times[0]

    def monotonic(self) -> float:
        """The monotonic clock, in seconds."""
        return self._times[1]

    def advance(self, seconds: float | timedelta) -> None:
        """Move both clocks forward by ``seconds``, then wait for the lease renewals due by the new time.

        When it returns, every running call whose lease was due for renewal has had it renewed (or the
        renewal tried and failed, and logged) at the new time. A step larger than a renewal interval
        renews a lease once, from the new time, as a renewer running late would.
        """
        step = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
        if not step >= 0:  # NaN too
            raise ValueError(f"a clock only moves forward: advance({seconds!r})")
        with self._lock:
            wall, monotonic = self._times
            self._times = (wall + timedelta(seconds=step), monotonic + step)
            self._stepped += step
        if self._before is not None and not _renewer.renewer.caught_up(RENEWALS_TIMEOUT):
            raise TimeoutError(
                f"the lease renewer did not make the renewals due within {RENEWALS_TIMEOUT:g}s of the step "
                "(a ledger that hangs?)"
            )

    def __enter__(self) -> SteppedClock:
        """Hand this clock to replaysafe until the block ends (the clocks it had are put back then)."""
        if self._before is not None:
            raise RuntimeError("this SteppedClock is already in use: make another one for a nested block")
        self._before = _drivers.use_clocks(Clocks(self.now, self.monotonic, self.advance))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        before, self._before = self._before, None
        if before is not None:
            _drivers.use_clocks(before)

    def __repr__(self) -> str:
        return f"<SteppedClock at {self.now().isoformat()} (stepped {self._stepped:g}s)>"
