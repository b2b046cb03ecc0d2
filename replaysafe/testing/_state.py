"""Process-wide state for tests: reset it, or switch protection off for a block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .. import _config, _drivers
from .._clock import MACHINE


def reset() -> None:
    """Put replaysafe's process-wide state back as a fresh import has it.

    The default ledger (``set_default_ledger``) is unset and the one ``REPLAYSAFE_LEDGER_URL``
    opened is closed, the global timeouts go back to their defaults, once-only warnings (per
    tool or per process) are said again, ``REPLAYSAFE_DISABLED`` is read again, and replaysafe
    reads the machine's clocks again (a ``SteppedClock`` left in use is put aside). Event handlers
    registered with ``on_event`` stay: each is removed by the function ``on_event`` returned.
    """
    _config.reset()
    _drivers.use_clocks(MACHINE)


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Inside the block, every protected tool runs plainly: no ledger, no claim, no record.

    For unit tests of tool bodies; the same as ``REPLAYSAFE_DISABLED=1`` for a whole process.
    A warning says so once. Process-wide: other threads' calls run plainly too.
    """
    before = _config.disabled
    _config.disabled = True
    try:
        yield
    finally:
        _config.disabled = before
