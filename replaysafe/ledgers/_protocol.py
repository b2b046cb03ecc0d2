"""The ledger protocol: the few atomic operations the replay protocol needs.

A backend implements ``Ledger`` (sync) and offers an ``AsyncLedger`` as ``.aio``.
Backends without async I/O get one for free from ``LedgerBase`` (a worker thread
per operation), so adding a backend is one small module.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from .. import _unrecorded
from .._clock import utcnow
from .._codec import JsonSerializer, Serializer
from .._constants import LEDGER_RETRY_ATTEMPTS, LEDGER_RETRY_MAX_SECONDS
from .._events import EventKind, emit
from .._identity import owner_token
from .._records import CallKey, ClaimResult, Record, Status
from .._sealing import Sealer, unsealed

#: One signing key, or a list whose first key signs and all of which are accepted.
SigningKey = str | bytes | Sequence[str | bytes]

_NO_RESULT: Any = object()


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a ledger operation that failed with a transient error is tried again."""

    attempts: int = LEDGER_RETRY_ATTEMPTS
    max_seconds: float = LEDGER_RETRY_MAX_SECONDS


@runtime_checkable
class Ledger(Protocol):
    """Where protected calls are claimed and recorded.

    Every write is atomic and fenced by ``owner``: a caller can only complete or
    release a record it owns, so a late finisher cannot overwrite another's record.
    """

    #: Exceptions worth trying again (a dropped connection, a locked database).
    transient_errors: tuple[type[BaseException], ...]
    retry: RetryPolicy
    #: Seals finished records and checks them on replay; ``None`` when not signing.
    sealer: Sealer | None

    @property
    def aio(self) -> AsyncLedger:
        """The same ledger with ``async`` operations."""
        ...

    def claim(
        self, key: CallKey, *, tool_name: str, args_digest: str, owner: str, now: datetime, lease_expires_at: datetime
    ) -> ClaimResult:
        """Atomically create a ``running`` record owned by ``owner``, or return the one there."""
        ...

    def takeover(self, record: Record, *, owner: str, now: datetime, lease_expires_at: datetime) -> Record | None:
        """Replace ``record`` (still as read) by a ``running`` one for ``owner``, attempt + 1.

        Returns ``None`` when the stored record changed since it was read.
        """
        ...

    def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: datetime) -> bool:
        """Finish the call ``owner`` claimed; ``False`` when ``owner`` no longer holds it."""
        ...

    def release(self, key: CallKey, *, owner: str) -> bool:
        """Delete the ``running`` record ``owner`` holds, so the call may run again."""
        ...

    def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool:
        """Move the lease of the ``running`` record ``owner`` holds to ``lease_expires_at``.

        Fenced like ``complete``: ``False``, and nothing changed, when the record is
        gone, finished or held by another owner. Called while the tool runs.
        """
        ...

    def get(self, key: CallKey) -> Record | None: ...

    def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        """The records among ``keys`` that exist, in one round trip."""
        ...

    def delete(self, key: CallKey) -> bool: ...

    def purge_thread(self, thread_id: str) -> int:
        """Delete every record of one thread; returns how many."""
        ...

    def records(self, *, thread_id: str | None = None) -> Iterator[Record]:
        """Every record (of one thread), oldest first."""
        ...

    def resolve(
        self,
        key: CallKey,
        *,
        result: Any = ...,
        rerun: bool = False,
        serializer: Serializer | None = None,
        force: bool = False,
    ) -> Record | None:
        """Settle an in-doubt call by hand: record ``result``, or ``rerun=True`` to let it run again."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class AsyncLedger(Protocol):
    """``Ledger``'s operations as coroutines (only those the replay protocol needs)."""

    async def claim(
        self, key: CallKey, *, tool_name: str, args_digest: str, owner: str, now: datetime, lease_expires_at: datetime
    ) -> ClaimResult: ...

    async def takeover(
        self, record: Record, *, owner: str, now: datetime, lease_expires_at: datetime
    ) -> Record | None: ...

    async def complete(
        self, key: CallKey, *, owner: str, status: Status, result: str | None, now: datetime
    ) -> bool: ...

    async def release(self, key: CallKey, *, owner: str) -> bool: ...

    async def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool: ...

    async def get(self, key: CallKey) -> Record | None: ...

    async def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]: ...


_offload: concurrent.futures.ThreadPoolExecutor | None = None
_offload_lock = threading.Lock()


def _offload_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads blocking ledger operations of async callers run in (sized like asyncio's default)."""
    global _offload
    with _offload_lock:
        if _offload is None:
            _offload = concurrent.futures.ThreadPoolExecutor(
                max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="replaysafe-ledger"
            )
        return _offload


def _forget_parent_pool() -> None:
    # In a forked child the parent's threads do not exist: a copied pool would queue forever.
    global _offload, _offload_lock
    _offload = None
    _offload_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_parent_pool)


class OffloadedAsyncLedger:
    """An ``AsyncLedger`` over a sync one: blocking I/O runs in a worker thread.

    With ``blocking=False`` (a ledger that never waits, like the memory one) the
    operations run inline, which is cheaper than a thread hop.
    """

    __slots__ = ("_blocking", "_ledger")

    def __init__(self, ledger: Ledger, *, blocking: bool = True) -> None:
        self._ledger = ledger
        self._blocking = blocking

    async def _run(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        if self._blocking:
            # Our own pool rather than the loop's default executor: a forked child gets a
            # new one (see _offload_pool), even when it goes on with a loop of its parent.
            call = functools.partial(contextvars.copy_context().run, method, *args, **kwargs)
            return await asyncio.get_running_loop().run_in_executor(_offload_pool(), call)
        return method(*args, **kwargs)

    async def claim(self, key: CallKey, **kwargs: Any) -> ClaimResult:
        result: ClaimResult = await self._run(self._ledger.claim, key, **kwargs)
        return result

    async def takeover(self, record: Record, **kwargs: Any) -> Record | None:
        result: Record | None = await self._run(self._ledger.takeover, record, **kwargs)
        return result

    async def complete(self, key: CallKey, **kwargs: Any) -> bool:
        result: bool = await self._run(self._ledger.complete, key, **kwargs)
        return result

    async def release(self, key: CallKey, *, owner: str) -> bool:
        result: bool = await self._run(self._ledger.release, key, owner=owner)
        return result

    async def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool:
        result: bool = await self._run(self._ledger.renew, key, owner=owner, lease_expires_at=lease_expires_at)
        return result

    async def get(self, key: CallKey) -> Record | None:
        result: Record | None = await self._run(self._ledger.get, key)
        return result

    async def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        result: dict[CallKey, Record] = await self._run(self._ledger.get_many, list(keys))
        return result


class LedgerBase:
    """What every ledger shares: context management, lazy open, retry settings, resolve."""

    transient_errors: tuple[type[BaseException], ...] = ()
    #: Whether operations wait on I/O (then ``.aio`` runs them in a worker thread).
    blocking_io = True

    def __init__(self, *, retry: RetryPolicy | None = None, signing_key: SigningKey | None = None) -> None:
        self.retry = retry or RetryPolicy()
        self.sealer = Sealer.from_setting(signing_key)
        self._aio: AsyncLedger | None = None

    @property
    def aio(self) -> AsyncLedger:
        if self._aio is None:
            self._aio = OffloadedAsyncLedger(self, blocking=self.blocking_io)  # type: ignore[arg-type]
        return self._aio

    def close(self) -> None:
        """Release the ledger's resources; it reopens lazily if used again."""

    def resolve(
        self: Any,
        key: CallKey,
        *,
        result: Any = _NO_RESULT,
        rerun: bool = False,
        serializer: Serializer | None = None,
        force: bool = False,
    ) -> Record | None:
        """Settle an in-doubt call by hand, after checking with the provider.

        ``result=...`` records it as the call's result (a replay returns it, the tool
        does not run); ``rerun=True`` removes the record, so the next replay runs the
        tool. Returns the new record (``None`` after ``rerun``). A call whose owner is
        still alive is refused unless ``force=True`` (its owner would then find its
        claim gone when it finishes, and report a duplicate execution).
        """
        if rerun == (result is not _NO_RESULT):
            raise TypeError("resolve() takes exactly one of result=... or rerun=True")
        record = self.get(key)
        if record is None:
            raise LookupError(f"no record for {key}: nothing to resolve")
        # A finished call whose result was not recorded (or cannot be read) is settled here too.
        unrecorded = record.status is Status.COMPLETED and _unrecorded.parse(unsealed(record.result)) is not None
        if record.status not in (Status.RUNNING, Status.IN_DOUBT) and not (unrecorded or force):
            raise ValueError(
                f"the call {key} is already {record.status}; delete(key) it to allow a rerun, or pass force=True "
                "if its recorded result cannot be read"
            )
        from .._core import Verdict, judge  # the one place that tells a live owner from a dead one

        if not force and record.status is Status.RUNNING and judge(record, utcnow()) is Verdict.WAIT:
            raise ValueError(
                f"the call {key} is still running in {record.owner}, which is alive: wait for it, or pass "
                "force=True if you know it is stuck"
            )
        encoded = None if rerun else (serializer or JsonSerializer()).dumps(result)
        if encoded is not None and self.sealer is not None:
            encoded = self.sealer.seal(key, record.tool_name, record.args_digest, Status.COMPLETED, encoded)
        owner = f"resolve@{owner_token()}"
        now = utcnow()
        taken = self.takeover(record, owner=owner, now=now, lease_expires_at=now)
        if taken is None:
            raise RuntimeError(f"the record of {key} changed while resolving it; look at it again and retry")
        if rerun:
            self.release(key, owner=owner)
            settled = None
        else:
            self.complete(key, owner=owner, status=Status.COMPLETED, result=encoded, now=now)
            settled = self.get(key)
        emit(
            EventKind.RECONCILED,
            f"{record.tool_name} ({key}) was settled by hand: " + ("rerun" if rerun else "result recorded"),
            tool_name=record.tool_name,
            key=key,
            attempt=record.attempt,
        )
        return settled

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
