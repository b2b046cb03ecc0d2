"""``MemoryLedger``: a dict behind striped locks. Per process; gone when the process ends."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from datetime import datetime

from .._records import CallKey, ClaimResult, Record, Status, new_tuple
from ._protocol import LedgerBase, RetryPolicy, SigningKey, forget_in_forked_child

#: How many locks a ledger's keys are spread over. One lock for every key made threads convoy:
#: a thread switched out by the GIL while holding it blocks the next thread to want it, which
#: then holds it while it waits for the GIL, and from then on every acquisition by either thread
#: blocks and hands the GIL over (measured: 2 threads made half the first calls of 1). Calls on
#: different keys now rarely share a lock, and a collision lasts one operation, not the run.
_STRIPES = 64


class MemoryLedger(LedgerBase):
    """A thread-safe ledger in process memory.

    It protects replays inside one process (a retried node, a re-invoked graph) but
    does not survive a restart: use ``SqliteLedger`` or a server ledger for that.
    """

    blocking_io = False

    def __init__(self, *, retry: RetryPolicy | None = None, signing_key: SigningKey | None = None) -> None:
        super().__init__(retry=retry, signing_key=signing_key)
        self._locks = tuple(threading.Lock() for _ in range(_STRIPES))
        self._records: dict[CallKey, Record] = {}
        forget_in_forked_child(self)

    def _forget_parent(self) -> None:
        # A fork may copy a lock held by another thread of the parent: it would never be released.
        self._locks = tuple(threading.Lock() for _ in range(_STRIPES))

    def _lock(self, key: CallKey) -> threading.Lock:
        """The lock of ``key``'s stripe: every change to one key's record is made under it. (Reads
        take none: a dict lookup is atomic, and a record is immutable.)"""
        return self._locks[hash(key) % _STRIPES]

    def __repr__(self) -> str:
        return f"MemoryLedger(<{len(self._records)} records>)"

    def claim(
        self, key: CallKey, *, tool_name: str, args_digest: str, owner: str, now: datetime, lease_expires_at: datetime
    ) -> ClaimResult:
        found = self._records.get(key)
        if found is not None:  # a replay or a wait: nothing to change, so no lock to take
            return new_tuple(ClaimResult, (found, False))  # type: ignore[no-any-return]
        with self._lock(key):
            found = self._records.get(key)
            if found is not None:
                return new_tuple(ClaimResult, (found, False))  # type: ignore[no-any-return]
            record = Record.claimed(key, tool_name, args_digest, owner, now, lease_expires_at)
            self._records[key] = record
            return new_tuple(ClaimResult, (record, True))  # type: ignore[no-any-return]

    def takeover(
        self,
        record: Record,
        *,
        owner: str,
        now: datetime,
        lease_expires_at: datetime,
        status: Status = Status.RUNNING,
        result: str | None = None,
        args_digest: str | None = None,
    ) -> Record | None:
        with self._lock(record.key):
            if self._records.get(record.key) != record:
                return None
            new = record.taken_over_by(owner, now, lease_expires_at, status, result, args_digest)
            self._records[record.key] = new
            return new

    def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: datetime) -> bool:
        with self._lock(key):
            found = self._records.get(key)
            # A retried write finds its own finished record: still a success.
            if found is None or found.owner != owner or found.status not in (Status.RUNNING, status):
                return False
            self._records[key] = new_tuple(
                Record,
                (
                    key,
                    found.tool_name,
                    found.args_digest,
                    status,
                    result,
                    owner,
                    found.attempt,
                    found.created_at,
                    now,
                    found.lease_expires_at,
                    found.expires_at,
                ),
            )
            return True

    def release(self, key: CallKey, *, owner: str) -> bool:
        with self._lock(key):
            found = self._records.get(key)
            if found is None or found.owner != owner or found.status is not Status.RUNNING:
                return False
            del self._records[key]
            return True

    def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool:
        with self._lock(key):
            found = self._records.get(key)
            if found is None or found.owner != owner or found.status is not Status.RUNNING:
                return False
            self._records[key] = found._replace(lease_expires_at=lease_expires_at)
            return True

    def get(self, key: CallKey) -> Record | None:
        return self._records.get(key)

    def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        records = self._records
        return {key: record for key in keys if (record := records.get(key)) is not None}

    def delete(self, key: CallKey) -> bool:
        with self._lock(key):
            return self._records.pop(key, None) is not None

    def purge_thread(self, thread_id: str) -> int:
        purged = 0
        for key in self._snapshot():
            if key.thread_id == thread_id:
                with self._lock(key):
                    purged += self._records.pop(key, None) is not None
        return purged

    def records(self, *, thread_id: str | None = None) -> Iterator[Record]:
        found = [r for r in self._snapshot().values() if thread_id is None or r.key.thread_id == thread_id]
        return iter(sorted(found, key=lambda r: r.created_at))

    def _snapshot(self) -> dict[CallKey, Record]:
        # dict.copy is one step (under the GIL, or the dict's own lock without one): iterating the
        # live dict would fail when another thread adds a record meanwhile.
        return self._records.copy()
