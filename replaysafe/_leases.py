"""Lease renewal decisions, with no I/O: when a running call's lease is due, and until when.

A claim's lease tells other hosts how long its owner is presumed alive. While the
tool runs, its owner renews the lease every third of it, so a tool that outlives
its lease is not taken over while it still runs. The renewer (``_renewer``) only
performs what this module decides.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from datetime import datetime, timedelta
from typing import Any

from ._core import Renew
from ._records import CallKey

#: A lease is renewed this many times over its length: two renewals may fail in a
#: row (a slow or restarting ledger) before it runs out.
RENEWALS_PER_LEASE = 3
#: A renewal due this close (seconds) is made now: a clock a test steps to the due time by
#: sums of steps must not miss it by a float's rounding (and a microsecond early is no matter).
DUE_SLACK = 1e-6


def renewal_interval(lease: timedelta) -> float:
    """Seconds between two renewals of a lease of length ``lease``."""
    return lease.total_seconds() / RENEWALS_PER_LEASE


@dataclasses.dataclass(eq=False, slots=True)
class Lease:
    """One running call whose lease is kept alive; ``due`` is on the monotonic clock."""

    key: CallKey
    owner: str
    tool_name: str
    length: timedelta
    ledger: Any
    due: float
    active: bool = True
    #: The latest the lease is renewed to (wall clock), ``None`` for as long as the tool runs.
    until: datetime | None = None

    def end(self) -> None:
        """The tool ended: renew no more (a renewal in flight is fenced by the record's status)."""
        self.active = False

    def renewal(self, now: datetime) -> Renew:
        """The renewal to write now (wall clock: other hosts compare it with theirs); the
        last one when it reaches ``until``."""
        expires = now + self.length
        if self.until is not None and expires >= self.until:
            expires = self.until
            self.active = False
        return Renew(self.key, self.owner, expires)

    def after_renewal(self, renewed: bool | None, monotonic_now: float) -> None:
        """What a renewal's outcome means: ``False`` (the claim is gone) ends the lease;
        a failure (``None``) is tried again at the next tick, like a success."""
        if renewed is False:
            self.active = False
        self.due = monotonic_now + renewal_interval(self.length)


def first_due(length: timedelta, monotonic_now: float) -> float:
    """A claim was just written with a full lease: the first renewal is one interval away."""
    return monotonic_now + renewal_interval(length)


class Schedule:
    """The leases one process keeps alive, earliest due first.

    A heap; an ended lease (``active`` false) leaves it when it comes up, or sooner,
    when ended ones make up most of it (many short calls under a long lease).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Lease]] = []
        self._order = itertools.count()
        self._compacted_size = 0

    def add(self, lease: Lease) -> None:
        heapq.heappush(self._heap, (lease.due, next(self._order), lease))
        if len(self._heap) > max(1024, 2 * self._compacted_size):
            self._heap = [entry for entry in self._heap if entry[2].active]
            heapq.heapify(self._heap)
            self._compacted_size = len(self._heap)

    def due(self, monotonic_now: float) -> list[Lease]:
        """Take out the active leases due by ``monotonic_now``, within ``DUE_SLACK`` (put them back with ``add``)."""
        found = []
        monotonic_now += DUE_SLACK
        while self._heap and (self._heap[0][0] <= monotonic_now or not self._heap[0][2].active):
            lease = heapq.heappop(self._heap)[2]
            if lease.active:
                found.append(lease)
        return found

    def next_due(self) -> float | None:
        """When the earliest active lease is due; ``None`` when there is none."""
        while self._heap and not self._heap[0][2].active:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return sum(1 for _, _, lease in self._heap if lease.active)
