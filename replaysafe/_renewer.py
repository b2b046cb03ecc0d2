"""Keeping the leases of running calls alive: one daemon thread for sync tools, a task per async tool.

This module only performs renewals; ``_leases`` decides when each is due and until
when it extends the lease. A renewal never delays or fails the tool: its errors
are logged, tried again with the ledger's retry policy and at the next tick, and a
lease that was lost anyway (taken over) is reported when the call completes.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from datetime import timedelta
from typing import Any

import tenacity

from ._clock import utcnow
from ._errors import describe
from ._events import logger
from ._leases import Lease, Schedule, first_due, renewal_interval
from ._records import CallKey


def _retrying(ledger: Any) -> dict[str, Any]:
    """The ledger's retry policy, for one renewal (its first attempt included)."""
    policy = ledger.retry
    return {
        "stop": tenacity.stop_after_attempt(max(policy.attempts, 1)) | tenacity.stop_after_delay(policy.max_seconds),
        "wait": tenacity.wait_random_exponential(multiplier=0.01, max=0.1),
        "retry": tenacity.retry_if_exception_type(ledger.transient_errors),
        "reraise": True,
    }


def _report(lease: Lease, renewed: bool | None, error: BaseException | None) -> None:
    if error is not None:
        logger.warning(
            "%s: its lease could not be renewed (%s); trying again in %gs. If it runs out, another host may "
            "take the call over",
            describe(lease.tool_name, lease.key),
            type(error).__name__,
            renewal_interval(lease.length),
        )
    elif renewed is False:
        logger.warning(
            "%s: its lease is no longer held by %s (taken over or settled by hand); its completion will report it",
            describe(lease.tool_name, lease.key),
            lease.owner,
        )


def renew_now(lease: Lease) -> bool | None:
    """Renew one lease: ``True`` done, ``False`` no longer ours, ``None`` the ledger failed."""
    try:
        for attempt in tenacity.Retrying(**_retrying(lease.ledger)):
            with attempt:
                renewed = bool(lease.renewal(utcnow()).on(lease.ledger))
    except Exception as exc:
        _report(lease, None, exc)
        return None
    _report(lease, renewed, None)
    return renewed


async def arenew_now(lease: Lease) -> bool | None:
    """``renew_now`` on the ledger's async operations."""
    try:
        async for attempt in tenacity.AsyncRetrying(**_retrying(lease.ledger)):
            with attempt:
                renewed = bool(await lease.renewal(utcnow()).on(lease.ledger.aio))
    except Exception as exc:
        _report(lease, None, exc)
        return None
    _report(lease, renewed, None)
    return renewed


def new_lease(ledger: Any, tool_name: str, key: CallKey, owner: str | None, length: timedelta) -> Lease | None:
    """The lease of a call about to run; ``None`` when there is none to keep (an unprotected run)."""
    if owner is None or not hasattr(ledger, "renew"):
        return None
    return Lease(key, owner, tool_name, length, ledger, first_due(length, time.monotonic()))


class Renewer:
    """One daemon thread renewing the leases of sync calls, earliest due first.

    It never holds a call's thread: a call adds its lease and takes it out when the
    tool ends.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # Also run in a forked child: the parent's thread does not exist there and
        # its lock may have been copied held.
        self._changed = threading.Condition(threading.Lock())
        self._schedule = Schedule()
        self._thread: threading.Thread | None = None

    def add(self, lease: Lease | None) -> None:
        if lease is None:
            return
        with self._changed:
            earliest = self._schedule.next_due()
            self._schedule.add(lease)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="replaysafe-lease-renewer", daemon=True)
                self._thread.start()
            elif earliest is None or lease.due < earliest:
                self._changed.notify()  # the thread sleeps until a later time

    def remove(self, lease: Lease | None) -> None:
        if lease is None:
            return
        with self._changed:
            self._schedule.discard(lease)

    def __len__(self) -> int:
        with self._changed:
            return len(self._schedule)

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    now = time.monotonic()
                    due = self._schedule.due(now)
                    if due:
                        break
                    earliest = self._schedule.next_due()
                    self._changed.wait(None if earliest is None else earliest - now)
            for lease in due:
                renewed = renew_now(lease)
                lease.after_renewal(renewed, time.monotonic())
                with self._changed:
                    if lease.active:
                        self._schedule.add(lease)


renewer = Renewer()


async def keep_renewed(lease: Lease) -> None:
    """Renew ``lease`` until cancelled (when the async tool ends) or lost."""
    while lease.active:
        await asyncio.sleep(max(lease.due - time.monotonic(), 0.0))
        renewed = await arenew_now(lease)
        lease.after_renewal(renewed, time.monotonic())


def start_renewing(lease: Lease | None) -> asyncio.Task[None] | None:
    """A task in the running loop that keeps ``lease`` alive; cancel it when the tool ends."""
    if lease is None:
        return None
    return asyncio.get_running_loop().create_task(keep_renewed(lease), name="replaysafe-lease-renewer")


os.register_at_fork(after_in_child=renewer._reset)
