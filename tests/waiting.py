"""Proof that a replay really waited: a real ledger, observed where a caller finds its call running.

A test of "a replay waits for the live owner" passes without any wait if the owner happens
to finish before the replay looks. ``SeesWaiting`` wraps a real ledger and changes nothing;
it counts each claim that found the call running under another owner (the moment the
protocol decides to wait) and calls ``on_wait``. A test releases the owner only after
that, so the wait is certain, with no sleep and no timed assertion.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from replaysafe import CallKey, ClaimResult, Ledger, Status


class SeesWaiting:
    """A real ledger, delegated to in full; a claim that finds another owner running is reported."""

    def __init__(self, ledger: Ledger, on_wait: Callable[[], None] | None = None) -> None:
        self._ledger = ledger
        self._on_wait = on_wait
        self.waited = threading.Event()
        self.waits = 0
        self._aio: _SeesWaitingAsync | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def _seen(self, found: ClaimResult, owner: str) -> ClaimResult:
        if not found.claimed and found.record.status is Status.RUNNING and found.record.owner != owner:
            self.waits += 1
            self.waited.set()
            if self._on_wait is not None:
                self._on_wait()
        return found

    def claim(self, key: CallKey, **kwargs: Any) -> ClaimResult:
        return self._seen(self._ledger.claim(key, **kwargs), kwargs["owner"])

    @property
    def aio(self) -> _SeesWaitingAsync:
        if self._aio is None:
            self._aio = _SeesWaitingAsync(self)
        return self._aio


class _SeesWaitingAsync:
    def __init__(self, outer: SeesWaiting) -> None:
        self._outer = outer
        self._aio = outer._ledger.aio

    def __getattr__(self, name: str) -> Any:
        return getattr(self._aio, name)

    async def claim(self, key: CallKey, **kwargs: Any) -> ClaimResult:
        return self._outer._seen(await self._aio.claim(key, **kwargs), kwargs["owner"])
