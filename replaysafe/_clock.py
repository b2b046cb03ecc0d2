"""The clocks replaysafe reads: timezone-aware UTC time and a monotonic clock, in one place.

By default they are the machine's. A test may hand in others (``replaysafe.testing.SteppedClock``):
``_drivers.use_clocks`` swaps them, once, into the module attributes that read them. (freezegun's
``freeze_time`` stops ``utcnow`` too: it reads ``datetime.now``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import NamedTuple


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Clocks(NamedTuple):
    """The wall clock and the monotonic clock handed to the protocol, the lease renewer and the ledgers."""

    #: The wall clock, timezone-aware UTC.
    now: Callable[[], datetime]
    #: A clock that never steps back, in seconds.
    monotonic: Callable[[], float]
    #: ``None`` for clocks that run by themselves. For clocks that move only when a test steps them, how
    #: to step them by some seconds: a pause of the protocol's (a wait for a live owner) steps them instead
    #: of sleeping, and the renewer sleeps until it is woken (a step wakes it), not until its next renewal.
    step: Callable[[float], None] | None = None


#: The machine's clocks.
MACHINE = Clocks(utcnow, time.monotonic)
