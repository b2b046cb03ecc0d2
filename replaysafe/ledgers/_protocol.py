"""The ledger protocol: the few atomic operations the replay protocol needs.

A backend implements ``Ledger`` (sync) and offers an ``AsyncLedger`` as ``.aio``.
Backends without async I/O get one for free from ``LedgerBase`` (a worker thread
per operation), so adding a backend is one small module.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Iterator
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from .._constants import LEDGER_RETRY_ATTEMPTS, LEDGER_RETRY_MAX_SECONDS
from .._records import CallKey, ClaimResult, Record, Status


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

    async def get(self, key: CallKey) -> Record | None: ...

    async def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]: ...


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
            return await asyncio.to_thread(method, *args, **kwargs)
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

    async def get(self, key: CallKey) -> Record | None:
        result: Record | None = await self._run(self._ledger.get, key)
        return result

    async def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        result: dict[CallKey, Record] = await self._run(self._ledger.get_many, list(keys))
        return result


class LedgerBase:
    """What every ledger shares: context management, lazy open, retry settings."""

    transient_errors: tuple[type[BaseException], ...] = ()
    #: Whether operations wait on I/O (then ``.aio`` runs them in a worker thread).
    blocking_io = True

    def __init__(self, *, retry: RetryPolicy | None = None) -> None:
        self.retry = retry or RetryPolicy()
        self._aio: AsyncLedger | None = None

    @property
    def aio(self) -> AsyncLedger:
        if self._aio is None:
            self._aio = OffloadedAsyncLedger(self, blocking=self.blocking_io)  # type: ignore[arg-type]
        return self._aio

    def close(self) -> None:
        """Release the ledger's resources; it reopens lazily if used again."""

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
