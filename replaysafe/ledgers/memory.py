"""``MemoryLedger``: a dict behind a lock. Per process; gone when the process ends."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from datetime import datetime

from .._records import CallKey, ClaimResult, Record, Status, new_tuple
from ._protocol import LedgerBase, RetryPolicy, SigningKey, forget_in_forked_child


class MemoryLedger(LedgerBase):
    """A thread-safe ledger in process memory.

    It protects replays inside one process (a retried node, a re-invoked graph) but
    does not survive a restart: use ``SqliteLedger`` or a server ledger for that.
    """

    blocking_io = False

    def __init__(self, *, retry: RetryPolicy | None = None, signing_key: SigningKey | None = None) -> None:
        super().__init__(retry=retry, signing_key=signing_key)
        self._lock = threading.Lock()
        self._records: dict[CallKey, Record] = {}
        forget_in_forked_child(self)

    def _forget_parent(self) -> None:
        # A fork may copy the lock held by another thread of the parent: it would never be released.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryLedger(<{len(self._records)} records>)"

    def claim(
        self, key: CallKey, *, tool_name: str, args_digest: str, owner: str, now: datetime, lease_expires_at: datetime
    ) -> ClaimResult:
        with self._lock:
            found = self._records.get(key)
            if found is not None:
                return new_tuple(ClaimResult, (found, False))  # type: ignore[no-any-return]
            record = Record.claimed(key, tool_name, args_digest, owner, now, lease_expires_at)
            self._records[key] = record
            return new_tuple(ClaimResult, (record, True))  # type: ignore[no-any-return]

    def takeover(self, record: Record, *, owner: str, now: datetime, lease_expires_at: datetime) -> Record | None:
        with self._lock:
            if self._records.get(record.key) != record:
                return None
            new = record.taken_over_by(owner, now, lease_expires_at)
            self._records[record.key] = new
            return new

    def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: datetime) -> bool:
        with self._lock:
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
        with self._lock:
            found = self._records.get(key)
            if found is None or found.owner != owner or found.status is not Status.RUNNING:
                return False
            del self._records[key]
            return True

    def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool:
        with self._lock:
            found = self._records.get(key)
            if found is None or found.owner != owner or found.status is not Status.RUNNING:
                return False
            self._records[key] = found._replace(lease_expires_at=lease_expires_at)
            return True

    def get(self, key: CallKey) -> Record | None:
        return self._records.get(key)

    def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        with self._lock:
            return {key: self._records[key] for key in keys if key in self._records}

    def delete(self, key: CallKey) -> bool:
        with self._lock:
            return self._records.pop(key, None) is not None

    def purge_thread(self, thread_id: str) -> int:
        with self._lock:
            doomed = [key for key in self._records if key.thread_id == thread_id]
            for key in doomed:
                del self._records[key]
            return len(doomed)

    def records(self, *, thread_id: str | None = None) -> Iterator[Record]:
        with self._lock:
            found = [r for r in self._records.values() if thread_id is None or r.key.thread_id == thread_id]
        return iter(sorted(found, key=lambda r: r.created_at))
