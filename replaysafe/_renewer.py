"""Keeping the leases of running calls alive: one daemon thread, for sync and async tools alike.

An async tool's lease is renewed by the thread too, not by a timer on its event loop: a tool
that blocks its loop (sync I/O, ``time.sleep``) past its lease would stop such a timer, and
another host would take the call over and run it again.

This module only performs renewals; ``_leases`` decides when each is due and until
when it extends the lease. A renewal never delays or fails the tool: its errors
are logged, tried again with the ledger's retry policy (``_operations``) and at the
next tick, and a lease that was lost anyway (taken over) is reported when the call
completes.
"""

from __future__ import annotations

import collections
import math
import os
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from ._clock import MACHINE, Clocks
from ._errors import LedgerError, describe
from ._events import logger
from ._leases import Lease, Schedule, first_due, renewal_interval
from ._operations import perform
from ._records import CallKey
from ._threads import ForkSafePool

#: New leases queued before the renewer thread wakes to take them in (and drop ended ones).
_MAX_INCOMING = 1024

#: The renewals themselves run in these threads, not in the renewer's: a renewal that blocks (a row
#: locked by another session, a server that stopped answering) then delays its own lease only. Made
#: in the renewer's one thread, the next lease's renewal waited behind it, ran out, and another host
#: took a live call over and ran it again. A lease is renewed by one of them at a time.
_renewals = ForkSafePool(max_workers=32, thread_name_prefix="replaysafe-lease-renewal")

#: The clocks renewals are timed and written by: the drivers' (``use_clocks``), the machine's by default.
#: Module attributes, swapped once, so that a new lease reads its clock as cheaply as ``time.monotonic``.
_now: Callable[[], datetime] = MACHINE.now
_monotonic: Callable[[], float] = MACHINE.monotonic
#: Whether ``_monotonic`` moves by itself: the thread then sleeps until its next renewal is due; under
#: a stepped clock it sleeps until woken (a step wakes it: ``Renewer.caught_up``).
_timed = True


def _reported(lease: Lease, renewed: bool | None, error: LedgerError | None = None) -> bool | None:
    """A renewal's outcome, logged when it failed or found the lease lost while the tool still runs
    (a renewal in flight when the tool ended finds the call settled: nothing to say)."""
    if not lease.active:
        return renewed
    if error is not None:
        logger.warning(
            "%s: its lease could not be renewed (%s); trying again in %gs. If it runs out, another host may "
            "take the call over",
            describe(lease.tool_name, lease.key),
            type(error.__cause__ or error).__name__,
            renewal_interval(lease.length),
        )
    elif renewed is False:
        logger.warning(
            "%s: its lease is no longer held by %s (taken over or settled by hand); its completion will report it",
            describe(lease.tool_name, lease.key),
            lease.owner,
        )
    return renewed


def renew_now(lease: Lease) -> bool | None:
    """Renew one lease: ``True`` done, ``False`` no longer ours, ``None`` the ledger failed."""
    try:
        return _reported(lease, bool(perform(lease.renewal(_now()), lease)))
    except LedgerError as exc:
        return _reported(lease, None, exc)


def new_lease(
    ledger: Any, tool_name: str, key: CallKey, owner: str | None, length: timedelta, until: datetime | None = None
) -> Lease | None:
    """The lease of a call about to run, renewed to ``until`` at most; ``None`` when there is
    none to keep (an unprotected run)."""
    if owner is None or not hasattr(ledger, "renew"):
        return None
    return Lease(key, owner, tool_name, length, ledger, first_due(length, _monotonic()), until=until)


class Renewer:
    """One daemon thread renewing the leases of running calls, sync and async, earliest due first.

    It never holds a call's thread. Adding a lease is an append and ending one a flag
    (the protected call's hot path); the thread takes new leases in when it wakes: at
    the next renewal due, when a new lease is due sooner, or when many have queued.
    It hands each renewal due to a renewal thread and takes the lease back in once it is
    done, so that one slow renewal never holds up another lease's.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # Also run in a forked child: the parent's thread does not exist there and
        # its lock or event may have been copied mid-use.
        self._incoming: collections.deque[Lease] = collections.deque()
        self._wake = threading.Event()
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: When the thread next wakes by itself; -inf while it is awake (it sees new leases then).
        self._wakes_at = -math.inf
        #: The passes the thread has begun and ended (a pass takes new leases in and renews those due):
        #: ``caught_up`` waits for the end of one begun after it was called.
        self._passes = threading.Condition()
        self._begun = 0
        self._ended = 0
        #: Renewals handed to a renewal thread and not yet done (guarded by ``_passes``).
        self._renewing = 0

    def add(self, lease: Lease | None) -> None:
        if lease is None:
            return
        self._incoming.append(lease)
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    thread = threading.Thread(target=self._run, name="replaysafe-lease-renewer", daemon=True)
                    thread.start()
                    self._thread = thread
                    return  # the new thread takes every queued lease in before it first sleeps
            # Another caller started the thread while this lease was queued: it may already sleep
            # past this lease's due time, so wake it as any later add would.
        if lease.due < self._wakes_at or len(self._incoming) > _MAX_INCOMING:
            self._wake.set()

    @staticmethod
    def remove(lease: Lease | None) -> None:
        if lease is not None:
            lease.end()

    def wake(self) -> None:
        """Have the thread look at its clock again (it was swapped, or stepped)."""
        self._wake.set()

    def caught_up(self, timeout: float) -> bool:
        """Wake the thread and wait until it has made every renewal due by now on its clock (a stepped
        clock's step calls it); ``False`` if it has not within ``timeout`` seconds. At once when there is
        no thread (no lease was ever kept) or when asked by the thread itself, or a renewal thread."""
        thread = self._thread
        if thread is None or thread is threading.current_thread() or getattr(_in_renewal, "active", False):
            return True
        with self._passes:
            wanted = self._begun + 1  # a pass begun from now on reads the clock as it is now
        self._wake.set()
        with self._passes:
            return self._passes.wait_for(lambda: self._ended >= wanted and not self._renewing, timeout)

    def _renew(self, lease: Lease) -> None:
        """In a renewal thread: renew ``lease``, then hand it back to the renewer thread."""
        _in_renewal.active = True
        try:
            lease.after_renewal(renew_now(lease), _monotonic())
        finally:
            _in_renewal.active = False
            self._incoming.append(lease)  # taken back in (or dropped, if it ended) at the next pass
            with self._passes:
                self._renewing -= 1
                self._passes.notify_all()
            self._wake.set()

    def _run(self) -> None:
        schedule = Schedule()
        timeout: float | None = 0.0  # the lease that started the thread is already queued
        while True:
            self._wake.wait(timeout)
            self._wake.clear()
            with self._passes:
                self._begun += 1
                this_pass = self._begun
            self._wakes_at = -math.inf  # awake: a lease added from now on is seen below or wakes us again
            while self._incoming:
                lease = self._incoming.popleft()
                if lease.active:  # most calls end before their first renewal is due
                    schedule.add(lease)
            due = schedule.due(_monotonic())
            if due:
                with self._passes:
                    self._renewing += len(due)
                pool = _renewals.get()
                for lease in due:  # out of the schedule until its renewal is done: one at a time per lease
                    pool.submit(self._renew, lease)
            earliest = schedule.next_due()
            timeout = None if earliest is None else max(earliest - _monotonic(), 0.0)
            if timeout and not _timed:
                timeout = None  # a stepped clock does not move while we sleep: its step wakes us
            self._wakes_at = math.inf if earliest is None else earliest
            # A lease queued after the loop above, while _wakes_at was still -inf, did not wake us:
            # look again now that it is set (add() appends before it reads _wakes_at, so one of the
            # two sees the other: the lease is taken in either way).
            if self._incoming:
                timeout = 0.0
            with self._passes:
                self._ended = this_pass
                self._passes.notify_all()


renewer = Renewer()
#: Whether this thread is a renewal thread (a renewal that steps a stepped clock must not wait for itself).
_in_renewal = threading.local()


def use_clocks(clocks: Clocks) -> None:
    """Time and write renewals by ``clocks`` from now on (``_drivers.use_clocks`` hands them in)."""
    global _now, _monotonic, _timed
    _now, _monotonic, _timed = clocks.now, clocks.monotonic, clocks.step is None
    renewer.wake()  # asleep until a renewal due on the clocks it had


def _reset_in_child() -> None:
    renewer._reset()


os.register_at_fork(after_in_child=_reset_in_child)
