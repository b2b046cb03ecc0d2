"""``TieredLedger``: a durable ledger (PostgreSQL, the truth) with a Redis cache of finished records in front.

Every claim, takeover, renewal, record, deletion and listing goes to the truth. A replay
(``claim`` of a recorded call) and ``get`` read the cache first and the truth on a miss;
the cache only ever holds, and only ever serves, **finished** records (completed or
failed) exactly as the truth stored them.

The rules (docs/ledgers.md, "Tiered: PostgreSQL with a Redis cache"):

* **Written after the truth, versioned and fenced.** A finished record reaches the cache
  only after the truth took it: written through by the call that finished it, or filled
  by a replay that missed. A write replaces an entry only if its version, ``(attempt,
  updated_at)``, is newer, so an older writer never regresses it; and only with the fill
  token a miss handed out still there, which every invalidation deletes, so a read of the
  truth that raced a deletion cannot put the deleted record back.
* **Served only when it fits.** An entry is served only if it is finished, of this key,
  of the tool and argument digest the call asks for, not past its ``expires_at``, and,
  when the ledger signs, its seal checks with one of the ledger's keys. Anything else is
  not an answer: the truth answers (a mismatch, an in-doubt call, a tampered record: each
  verdict is always made on the truth's record). An entry that could not have come from
  the truth (not finished, or failing its seal) is dropped, and a forged one reported
  (``EventKind.TAMPERED``); so is one the truth's answer then contradicts (another
  record, or none).
* **Changes clear the cache before and after the truth.** ``delete``, ``purge_thread`` and a
  takeover of a finished record (``resolve --force``) remove the cache's entry (and its fill
  token) before the truth changes and again after (a replay may have filled it in between);
  ``purge_thread`` removes the entries of the keys the truth listed and those the cache's
  index lists. A failed removal raises ``LedgerError`` naming the key and the next step.
* **Entries are of this truth and this run of Redis.** They live in a key space of their own
  (``_namespace``: the truth's database and table), never among a ``RedisLedger``'s records,
  and each carries the ``run_id`` of the server that stored it: one a restarted server loaded
  from disk is never served. An entry that is no record is dropped and reported.
* **The cache may fail.** A cache error never fails a call: the truth answers, an event
  says so (``EventKind.LEDGER_ERROR`` at WARNING), and the cache is skipped for
  ``cache_pause`` seconds. Its timeouts are capped so that a stalled cache leaves the
  truth at least half the ledger's ``io_timeout``. A flushed or evicted cache costs speed.

Each operation is written once, as a generator of steps (``_TruthStep``, ``_CacheStep``);
``_drive`` runs them on the sync ledgers and ``_adrive`` on their ``.aio``.

Events: only this ledger sees its cache fail (the drivers see an operation that succeeded),
so it reports that itself, through ``replaysafe._events``, which sits below both the
protocol and the ledgers and imports neither. The event decides nothing: the protocol
gets the truth's answer, as it would from the truth alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Generator, Iterable, Iterator
from datetime import datetime
from types import TracebackType
from typing import Any, NamedTuple, TypeVar

from .._errors import LedgerError
from .._events import EventKind, emit
from .._records import CallKey, ClaimResult, Record, Status, expires_at, new_tuple
from .._sealing import FINISHED, Sealer
from ._options import redact
from ._protocol import AsyncLedger, Ledger, LedgerBase, LedgerFault, diagnose, forget_in_forked_child, handed_now
from .redis import RecordFormatError, RedisLedger, _Operations

_T = TypeVar("_T")

#: Seconds the cache is skipped after it failed.
CACHE_PAUSE = 5.0
#: How long a miss's fill token lives (ms): a write through that comes later is dropped (costs speed only).
_TOKEN_MS = 600_000
#: Claims awaiting their write through, at most (the oldest is forgotten first: costs speed only).
_PENDING_MAX = 4096
#: The URL schemes a cache URL may have.
_CACHE_SCHEMES = ("redis", "rediss", "unix")
#: Cache entries removed per command.
_BATCH = 500
#: The cache URL's options that set its socket timeouts (capped like ``io_timeout``).
_SOCKET_OPTIONS = ("socket_timeout", "socket_connect_timeout")
#: The URL option naming the cache.
CACHE_OPTION = "cache"
_ENCODE_HINT = (
    "Percent-encode the cache URL as the option's value (urllib.parse.quote(cache_url, safe='')), so that "
    "its own options and any '+', '&' or '%' in its password stay with it"
)


class _TruthStep(NamedTuple):
    """Call the truth's operation ``method`` (on ``.aio`` for an async caller)."""

    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class _CacheStep(NamedTuple):
    """Run one of the cache's operations (built by its ``_ops``) on its sync or async runner."""

    op: Any


#: An operation, written once: it yields steps, gets each step's reply (or its error thrown in) and returns.
Steps = Generator[_TruthStep | _CacheStep, Any, _T]


class _Done(NamedTuple):
    """An operation's steps are over: what it returns."""

    value: Any


def _advance(steps: Steps[Any], reply: Any, error: BaseException | None) -> _TruthStep | _CacheStep | _Done:
    """The operation's next step, given the last one's reply (or its error, thrown in); ``_Done`` once it returned."""
    try:
        return steps.send(reply) if error is None else steps.throw(error)
    except StopIteration as done:
        return _Done(done.value)


def _truth(method: str, *args: Any, **kwargs: Any) -> _TruthStep:
    return _TruthStep(method, args, kwargs)


class TieredLedger(LedgerBase):
    """PostgreSQL as the truth, Redis in front: replays read the cache, everything else the truth.

    ``TieredLedger(PostgresLedger(url), cache=RedisLedger(redis_url))``, or
    ``open_ledger("postgresql://…?cache=<percent-encoded redis://… URL>")``. The ledger
    seals with the truth's signing key (``signing_key=`` goes to the truth). ``retry``,
    ``io_timeout`` and the classification of errors are the truth's: the cache never fails
    an operation, except ``delete`` and ``purge_thread``, which raise ``LedgerError`` when
    the cache entry cannot be removed after the truth's was.

    ``cache_pause``: seconds the cache is skipped after it failed. The cache's own
    ``connect_timeout`` and ``io_timeout`` are capped at a quarter of the truth's
    ``io_timeout`` (when it connects from a URL), so that a stalled cache, tried twice by
    redis-py, leaves the truth at least half of it. ``close()`` closes both.
    """

    #: Seconds the cache is skipped after it failed.
    cache_pause: float
    #: The truth's: the tiered ledger seals and checks with the truth's keys.
    sealer: Sealer | None
    #: The truth's: an operation's errors are the truth's (the cache never fails one).
    transient_errors: tuple[type[BaseException], ...]

    def __init__(self, truth: Ledger, *, cache: RedisLedger, cache_pause: float = CACHE_PAUSE) -> None:
        if not isinstance(cache, RedisLedger):
            raise TypeError(f"TieredLedger's cache must be a RedisLedger, not {type(cache).__name__}")
        if isinstance(truth, (RedisLedger, TieredLedger)):
            raise TypeError(
                f"TieredLedger's truth must be a durable ledger of its own (a PostgresLedger), not a "
                f"{type(truth).__name__}"
            )
        if isinstance(cache_pause, bool) or not isinstance(cache_pause, (int, float)) or cache_pause < 0:
            raise ValueError(f"cache_pause must be a number of seconds, 0 or more, got {cache_pause!r}")
        super().__init__(retry=truth.retry)
        self.truth = truth
        self.cache = cache
        self.sealer = truth.sealer
        self.transient_errors = truth.transient_errors
        self.cache_pause = float(cache_pause)
        self.io_timeout: float | None = getattr(truth, "io_timeout", None)
        if self.io_timeout is not None and cache._url is not None:
            bound = self.io_timeout / 4
            cache.connect_timeout = min(cache.connect_timeout, bound)
            cache.io_timeout = min(cache.io_timeout, bound)
            cache._url = _capped_socket_options(cache._url, bound)
        #: The cache's entries: a key space of their own, of this truth (``_namespace``), beside the cache's records.
        self._ops = _Operations(_namespace(cache.prefix, truth), cache.ttl)
        #: ``time.monotonic()`` before which the cache is skipped.
        self._skip_until = 0.0
        #: (key, owner) -> (the record the owner holds or None, the fill token its claim's miss got).
        self._pending: dict[tuple[CallKey, str], tuple[Record | None, str]] = {}
        self._pending_lock = threading.Lock()
        self._aio_tiered: _AsyncTieredLedger | None = None
        forget_in_forked_child(self)

    def __repr__(self) -> str:
        return f"TieredLedger({self.truth!r}, cache={self.cache!r})"

    def _forget_parent(self) -> None:
        self._pending_lock = threading.Lock()  # a fork may copy it held by another thread

    # --- the runners ----------------------------------------------------------------------

    def _drive(self, steps: Steps[_T]) -> _T:
        """Run an operation's steps on the sync truth and cache."""
        step = _advance(steps, None, None)
        while not isinstance(step, _Done):
            try:
                if isinstance(step, _CacheStep):
                    reply, error = self.cache._run(step.op), None
                else:
                    reply, error = getattr(self.truth, step.method)(*step.args, **step.kwargs), None
            except BaseException as exc:
                reply, error = None, exc
            step = _advance(steps, reply, error)
        result: _T = step.value
        return result

    async def _adrive(self, steps: Steps[_T]) -> _T:
        """``_drive`` on the truth's and the cache's ``.aio``."""
        truth, cache = self.truth.aio, self.cache.aio
        step = _advance(steps, None, None)
        while not isinstance(step, _Done):
            try:
                if isinstance(step, _CacheStep):
                    reply, error = await cache._run(step.op), None  # type: ignore[attr-defined]
                else:
                    reply, error = await getattr(truth, step.method)(*step.args, **step.kwargs), None
            except BaseException as exc:
                reply, error = None, exc
            step = _advance(steps, reply, error)
        result: _T = step.value
        return result

    # --- the cache: reads, writes, invalidation ----------------------------------------------

    def _cache_failed(self, exc: BaseException, doing: str, key: CallKey, tool_name: str) -> None:
        """The cache failed: skip it for a while, and say so."""
        self._skip_until = time.monotonic() + self.cache_pause
        fix = self.cache.diagnose(exc).fix
        emit(
            EventKind.LEDGER_ERROR,
            f"the tiered ledger's cache failed {doing} {key} ({type(exc).__name__}): PostgreSQL, the truth, "
            f"answers instead, and the cache is skipped for {self.cache_pause:g}s. Nothing is lost; replays are "
            f"slower until it answers again. {fix}",
            tool_name=tool_name,
            key=key,
            level=logging.WARNING,
            ledger="tiered",
        )

    def _cached(self, key: CallKey, tool_name: str) -> Steps[tuple[Record | None, str | None]]:
        """The cache's entry of ``key``, or on a miss the fill token a write must show; nothing when it is skipped."""
        if time.monotonic() < self._skip_until:
            return None, None
        try:
            found: tuple[Record | None, str | None] = yield _CacheStep(
                self._ops.cache_read(key, os.urandom(9).hex(), _TOKEN_MS)
            )
        except RecordFormatError:
            emit(
                EventKind.TAMPERED,
                f"the tiered ledger's cache holds an entry of {key} that is not a record: it was ignored and dropped, "
                "and PostgreSQL, the truth, answered. Check who can write to the cache's Redis.",
                tool_name=tool_name,
                key=key,
                ledger="tiered",
            )
            yield from self._drop(key, tool_name)
            return None, None
        except Exception as exc:
            self._cache_failed(exc, "reading", key, tool_name)
            return None, None
        return found

    def _servable(self, record: Record, now: datetime) -> bool | None:
        """Whether an entry may answer: ``True``; ``False``: it is kept, the truth answers this once (expired, or of
        another tool or arguments, a verdict only the truth makes); ``None``: it could not have come from the truth
        (not finished, or its seal fails), and is dropped."""
        if record.status not in FINISHED:
            return None
        if self.sealer is not None and self.sealer.key_of(record) is None:
            emit(
                EventKind.TAMPERED,
                f"the tiered ledger's cache holds a {record.status} record of {record.key} that fails its seal "
                "check: it was ignored and dropped, and PostgreSQL, the truth, answered. Check who can write to the "
                "cache's Redis.",
                tool_name=record.tool_name,
                key=record.key,
                ledger="tiered",
            )
            return None
        return record.expires_at is None or record.expires_at > now

    def _fill(self, record: Record, token: str | None) -> Steps[None]:
        """Write a finished record the truth holds to the cache (fenced by ``token``, versioned): a failure
        costs speed only."""
        if token is None or record.status not in FINISHED or time.monotonic() < self._skip_until:
            return
        try:
            yield _CacheStep(self._ops.cache_fill(record, token))
        except Exception as exc:
            self._cache_failed(exc, "writing", record.key, record.tool_name)

    def _invalidate(self, key: CallKey, doing: str, *, changed: bool) -> Steps[None]:
        """Remove the cache's entry of ``key`` and its fill token; ``LedgerError`` naming the next step on failure.
        ``changed``: whether the truth has changed already (``doing`` says what)."""
        try:
            yield _CacheStep(self._ops.uncache(key.thread_id, [key]))
        except Exception as exc:
            name = self._ops.keys(key)[0]
            raise self._stale_entry(
                f"{doing} {key}", f"the Redis keys {name} and {name}:fill", exc, key, changed
            ) from exc

    def _stale_entry(
        self, what: str, keys: str, exc: BaseException, key: CallKey | None = None, changed: bool = True
    ) -> LedgerError:
        fault = self.cache.diagnose(exc)
        if changed:
            told = (
                f"the tiered ledger {what} in PostgreSQL, but could not remove the Redis cache's entries "
                f"({type(exc).__name__}): a replay may still read the old record from the cache. Run the same "
                f"operation again once Redis answers (it is safe to repeat), or delete {keys}."
            )
        else:
            told = (
                f"the tiered ledger {what}, but could not first remove the Redis cache's entries "
                f"({type(exc).__name__}): nothing was changed in PostgreSQL. Run the same operation again once Redis "
                "answers."
            )
        return LedgerError(f"{told} {fault.fix}", key=key, transient=fault.transient, permanent=not fault.transient)

    # --- pending write-throughs --------------------------------------------------------------

    def _hold(self, key: CallKey, owner: str, record: Record | None, token: str | None) -> None:
        if token is None:
            return
        with self._pending_lock:
            self._pending[key, owner] = (record, token)
            if len(self._pending) > _PENDING_MAX:
                del self._pending[next(iter(self._pending))]

    def _unhold(self, key: CallKey, owner: str) -> tuple[Record | None, str] | None:
        if not self._pending:
            return None
        with self._pending_lock:
            return self._pending.pop((key, owner), None)

    # --- the operations, each written once ------------------------------------------------------

    def _claim(
        self, key: CallKey, tool_name: str, args_digest: str, owner: str, now: datetime, lease_expires_at: datetime
    ) -> Steps[ClaimResult]:
        entry, token = yield from self._cached(key, tool_name)
        servable: bool | None = None
        if entry is not None:
            servable = self._servable(entry, now)
            if servable and entry.tool_name == tool_name and entry.args_digest == args_digest:
                return new_tuple(ClaimResult, (entry, False))  # type: ignore[no-any-return]
            if servable is None:
                yield from self._drop(key, tool_name)
        found: ClaimResult = yield _truth(
            "claim",
            key,
            tool_name=tool_name,
            args_digest=args_digest,
            owner=owner,
            now=now,
            lease_expires_at=lease_expires_at,
        )
        record = found.record
        if entry is not None and servable is not None and record != entry:
            yield from self._drop(key, tool_name)  # the truth contradicts it: it never answers again
        if record.status in FINISHED:
            self._unhold(key, owner)
            yield from self._fill(record, token)
        else:
            # Ours (claimed), or another's that this owner may take over: the token goes with it to the complete.
            self._hold(key, owner, record if found.claimed else None, token)
        return found

    def _drop(self, key: CallKey, tool_name: str) -> Steps[None]:
        """Drop an entry that could not have come from the truth; a failure costs speed only."""
        try:
            yield from self._invalidate(key, "read", changed=False)
        except LedgerError as exc:
            self._cache_failed(exc, "dropping a bad entry of", key, tool_name)

    def _takeover(
        self,
        record: Record,
        owner: str,
        now: datetime,
        lease_expires_at: datetime,
        new: tuple[Status, str | None, str | None] = (Status.RUNNING, None, None),
    ) -> Steps[Record | None]:
        finished = record.status in FINISHED
        if finished:  # only a finished record may be in the cache: out first, nothing changed if it fails
            yield from self._invalidate(record.key, "was to take over", changed=False)
        status, result, args_digest = new
        taken: Record | None = yield _truth(
            "takeover",
            record,
            owner=owner,
            now=now,
            lease_expires_at=lease_expires_at,
            status=status,
            result=result,
            args_digest=args_digest,
        )
        held = self._unhold(record.key, owner)
        if taken is not None:
            self._hold(record.key, owner, taken, None if held is None else held[1])
        if finished:  # a replay may have filled it again meanwhile, from the truth as it was
            try:
                yield _CacheStep(self._ops.uncache(record.key.thread_id, [record.key]))
            except Exception as exc:
                raise self._taken_but_cached(record.key, exc) from exc
        return taken

    def _taken_but_cached(self, key: CallKey, exc: BaseException) -> LedgerError:
        """A takeover landed in the truth, but the old record's entry may still be served: never tried again
        (the takeover is done), the operator removes the entry and settles the call again."""
        name = self._ops.keys(key)[0]
        return LedgerError(
            f"the tiered ledger took over {key} in PostgreSQL, but could not then remove the Redis cache's entry of "
            f"its old record ({type(exc).__name__}): a replay may still read the old record from the cache. Once "
            f"Redis answers, delete the Redis keys {name} and {name}:fill (or run `replaysafe ledger delete` of the "
            f"call), then resolve it again. {self.cache.diagnose(exc).fix}",
            key=key,
            permanent=True,
        )

    def _complete(self, key: CallKey, owner: str, status: Status, result: str | None, now: datetime) -> Steps[bool]:
        done: bool = yield _truth("complete", key, owner=owner, status=status, result=result, now=now)
        held = self._unhold(key, owner) if done else None
        if held is not None and held[0] is not None and status in FINISHED:
            ttl = getattr(self.truth, "ttl", None)
            stored = held[0]._replace(
                status=status, result=result, updated_at=now, expires_at=expires_at(status, now, ttl)
            )
            yield from self._fill(stored, held[1])
        return done

    def _release(self, key: CallKey, owner: str) -> Steps[bool]:
        done: bool = yield _truth("release", key, owner=owner)
        self._unhold(key, owner)
        return done

    def _renew(self, key: CallKey, owner: str, lease_expires_at: datetime) -> Steps[bool]:
        done: bool = yield _truth("renew", key, owner=owner, lease_expires_at=lease_expires_at)
        if not done:
            return done
        with self._pending_lock:  # the record written through after the complete carries the lease as stored
            held = self._pending.get((key, owner))
            if held is not None and held[0] is not None:
                self._pending[key, owner] = (held[0]._replace(lease_expires_at=lease_expires_at), held[1])
                return done
        # Nothing held: the complete may already have taken the record, with the lease before this renewal, to
        # write it through. Removing the entry and its fill token drops that write, or the entry it made. Not while
        # the cache is skipped: a renewal must not wait on a cache that failed.
        if time.monotonic() < self._skip_until:
            return done
        try:
            yield _CacheStep(self._ops.uncache(key.thread_id, [key]))
        except Exception as exc:  # the renewal stands (a stale lease time on a finished entry at worst)
            self._cache_failed(exc, "invalidating", key, "")
        return done

    def _get(self, key: CallKey) -> Steps[Record | None]:
        entry, token = yield from self._cached(key, "")
        servable: bool | None = None
        if entry is not None:
            servable = self._servable(entry, handed_now())
            if servable:
                return entry
            if servable is None:
                yield from self._drop(key, entry.tool_name)
        found: Record | None = yield _truth("get", key)
        if entry is not None and servable is not None and found != entry:
            yield from self._drop(key, entry.tool_name)  # the truth contradicts it
        if found is not None:
            yield from self._fill(found, token)
        return found

    def _get_many(self, keys: Iterable[CallKey]) -> Steps[dict[CallKey, Record]]:
        found: dict[CallKey, Record] = yield _truth("get_many", list(keys))
        return found

    # --- the Ledger protocol -------------------------------------------------------------------

    def claim(
        self, key: CallKey, *, tool_name: str, args_digest: str, owner: str, now: datetime, lease_expires_at: datetime
    ) -> ClaimResult:
        """A replay: the cache's finished record when it fits the call; otherwise the truth's claim."""
        return self._drive(self._claim(key, tool_name, args_digest, owner, now, lease_expires_at))

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
        """The truth's takeover; a finished record's cache entry is removed first (and again after)."""
        return self._drive(self._takeover(record, owner, now, lease_expires_at, (status, result, args_digest)))

    def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: datetime) -> bool:
        """The truth's complete; a finished record is then written to the cache."""
        return self._drive(self._complete(key, owner, status, result, now))

    def release(self, key: CallKey, *, owner: str) -> bool:
        """The truth's release."""
        return self._drive(self._release(key, owner))

    def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool:
        """The truth's renew."""
        return self._drive(self._renew(key, owner, lease_expires_at))

    def get(self, key: CallKey) -> Record | None:
        """The cache's finished record, or the truth's record."""
        return self._drive(self._get(key))

    def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        """The truth's records among ``keys``."""
        return self._drive(self._get_many(keys))

    def delete(self, key: CallKey) -> bool:
        """Remove the cache's entry, delete the truth's record, then remove the entry again (a replay may have
        filled it in between): ``LedgerError`` if either removal fails (run it again)."""
        self._drive(self._invalidate(key, "was to delete", changed=False))
        deleted = bool(self.truth.delete(key))
        self._drive(self._invalidate(key, "deleted", changed=True))
        return deleted

    def purge_thread(self, thread_id: str) -> int:
        """Remove the cache entries of the thread's records (as the truth lists them, and as the cache's index of
        the thread does), delete the records in the truth, then remove the entries again: ``LedgerError`` if a
        removal fails (run it again: it is safe to repeat, and clears what the cache still holds)."""
        keys = [record.key for record in self.truth.records(thread_id=thread_id)]
        self._purge_cache(thread_id, keys, changed=False)
        deleted = self.truth.purge_thread(thread_id)
        self._purge_cache(thread_id, keys, changed=True)
        return deleted

    def _purge_cache(self, thread_id: str, keys: list[CallKey], *, changed: bool) -> None:
        """Remove the entries of ``keys`` and of every name the thread's index lists (never a key of another)."""
        try:
            for start in range(0, len(keys), _BATCH):
                self.cache._run(self._ops.uncache(thread_id, keys[start : start + _BATCH]))
            while names := self.cache._run(self._ops.members(thread_id, _BATCH)):
                self.cache._run(self._ops.uncache_listed(thread_id, names))
        except Exception as exc:
            index = self._ops.index(thread_id)
            what = f"purged the thread {thread_id!r}" if changed else f"was to purge the thread {thread_id!r}"
            listed = f"the keys listed in the Redis sorted set {index}, and the set"
            raise self._stale_entry(what, listed, exc, changed=changed) from exc

    def records(self, *, thread_id: str | None = None) -> Iterator[Record]:
        """The truth's records (of one thread), oldest first."""
        return self.truth.records(thread_id=thread_id)

    def purge_expired(self, *, batch_size: int = 1000, dry_run: bool = False) -> int:
        """The truth's ``purge_expired`` (cache entries expire on their own)."""
        purge = getattr(self.truth, "purge_expired", None)
        if purge is None:
            raise AttributeError(f"{self.truth!r} has no purge_expired")
        return int(purge(batch_size=batch_size, dry_run=dry_run))

    def ddl(self, *args: Any, **kwargs: Any) -> list[str]:
        """The truth's DDL."""
        statements: list[str] = self.truth.ddl(*args, **kwargs)  # type: ignore[attr-defined]
        return statements

    def diagnose(self, exc: BaseException) -> LedgerFault:
        """The truth's classification; this ledger's own ``LedgerError`` says itself."""
        if isinstance(exc, LedgerError):  # its own message names the key and the next step (no value)
            return LedgerFault(exc.transient, str(exc))
        return diagnose(self.truth, exc)

    def check(self) -> None:
        """The truth's ``check()``, then a read of the cache: a cache that fails is reported (an event), not raised."""
        self.truth.check()
        self._drive(self._cached(CallKey("replaysafe-probe-cache", "-", "-"), "replaysafe.check"))

    async def acheck(self) -> None:
        """``check()`` for async code."""
        await self.truth.acheck()  # type: ignore[attr-defined]
        await self._adrive(self._cached(CallKey("replaysafe-probe-cache", "-", "-"), "replaysafe.check"))

    @property
    def aio(self) -> AsyncLedger:
        if self._aio_tiered is None:
            self._aio_tiered = _AsyncTieredLedger(self)
        return self._aio_tiered

    def close(self) -> None:
        """Close the truth and the cache."""
        try:
            self.truth.close()
        finally:
            self.cache.close()
            super().close()

    async def aclose(self) -> None:
        """``close()`` for async code: also waits for this loop's connections to close."""
        for part in (self.truth, self.cache):
            closing = getattr(part, "aclose", None)
            if closing is not None:
                await closing()
        super().close()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class _AsyncTieredLedger:
    """``TieredLedger.aio``: the same operations, driven on the truth's and the cache's ``.aio``."""

    __slots__ = ("_ledger",)

    def __init__(self, ledger: TieredLedger) -> None:
        self._ledger = ledger

    async def claim(
        self, key: CallKey, *, tool_name: str, args_digest: str, owner: str, now: datetime, lease_expires_at: datetime
    ) -> ClaimResult:
        ledger = self._ledger
        return await ledger._adrive(ledger._claim(key, tool_name, args_digest, owner, now, lease_expires_at))

    async def takeover(
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
        new = (status, result, args_digest)
        return await self._ledger._adrive(self._ledger._takeover(record, owner, now, lease_expires_at, new))

    async def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: datetime) -> bool:
        return await self._ledger._adrive(self._ledger._complete(key, owner, status, result, now))

    async def release(self, key: CallKey, *, owner: str) -> bool:
        return await self._ledger._adrive(self._ledger._release(key, owner))

    async def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool:
        return await self._ledger._adrive(self._ledger._renew(key, owner, lease_expires_at))

    async def get(self, key: CallKey) -> Record | None:
        return await self._ledger._adrive(self._ledger._get(key))

    async def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        return await self._ledger._adrive(self._ledger._get_many(keys))


# --- URLs ----------------------------------------------------------------------------------------


def split_cache(url: str) -> tuple[str, str | None]:
    """``url`` without its ``cache`` option, and that option's value, decoded (``None`` when it has none).

    The value is one query value, read as every query value is (``+`` a space, ``%2B`` a plus): percent-encoded,
    its own query string (``?prefix=...``) and a password with ``+``, ``&`` or ``%`` stay with it. Given unencoded
    with a ``?`` in it, it is refused, since its options would go to PostgreSQL.
    """
    base, sep, query = url.partition("?")
    if not sep:
        return url, None
    kept: list[str] = []
    cache: str | None = None
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if urllib.parse.unquote_plus(name) != CACHE_OPTION:
            if cache is not None and "=" not in part:  # the rest of a cache URL an unencoded '&' split
                raise ValueError(
                    f"the URL option {CACHE_OPTION!r} is followed by a part that is no option (an unencoded '&' "
                    f"in the cache URL, its password?): it would go to PostgreSQL. {_ENCODE_HINT}."
                )
            kept.append(part)
            continue
        if cache is not None:
            raise ValueError(f"the URL option {CACHE_OPTION!r} is given twice: give one cache URL. {_ENCODE_HINT}.")
        if "?" in value:
            raise ValueError(
                f"the URL option {CACHE_OPTION!r} holds a cache URL with options of its own that is not "
                f"percent-encoded (a '?' in it): they would go to PostgreSQL. {_ENCODE_HINT}."
            )
        cache = urllib.parse.unquote_plus(value)  # as every query value is read: '+' is a space, '%2B' a plus
    return (f"{base}?{'&'.join(kept)}" if kept else base), cache


def open_tiered(url: str, **options: Any) -> TieredLedger:
    """``open_ledger``'s factory for ``postgresql://…?cache=redis://…`` (or ``open_ledger(url, cache=...)``).

    The truth gets the URL without ``cache`` and every other option (``signing_key``, ``create_schema``, ...);
    the cache is opened from its own URL, and ``cache_pause`` goes to the tiered ledger.
    """
    given = options.pop(CACHE_OPTION, None)
    cache_pause = options.pop("cache_pause", CACHE_PAUSE)
    url, in_url = split_cache(url)
    cache_url = given if given is not None else in_url
    cache = cache_url if isinstance(cache_url, RedisLedger) else _open_cache(cache_url)
    from .postgres import PostgresLedger  # SQLAlchemy and psycopg, imported when a URL needs them

    try:
        truth = PostgresLedger(url, **options)
    except BaseException:
        cache.close()
        raise
    return TieredLedger(truth, cache=cache, cache_pause=cache_pause)


def _open_cache(cache_url: Any) -> RedisLedger:
    """The cache a URL names; a ``ValueError`` naming the option and the fix, never the password."""
    if not isinstance(cache_url, str) or not cache_url:
        raise ValueError(f"the URL option {CACHE_OPTION!r} is empty: give the cache's redis:// URL. {_ENCODE_HINT}.")
    shown = redact(cache_url)
    scheme = urllib.parse.urlsplit(cache_url).scheme.lower()
    if scheme not in _CACHE_SCHEMES:
        raise ValueError(
            f"the URL option {CACHE_OPTION!r} ({shown!r}) is not a Redis URL: the cache of a tiered ledger is "
            f"Redis, a redis://, rediss:// or unix:// URL. {_ENCODE_HINT}."
        )
    try:
        return RedisLedger(cache_url)
    except (ValueError, TypeError) as exc:
        reason = str(exc).replace(cache_url, shown)
        raise ValueError(
            f"the URL option {CACHE_OPTION!r} ({shown!r}) does not open a Redis cache: {reason} Fix the cache URL. "
            f"{_ENCODE_HINT}."
        ) from None


def _namespace(prefix: str, truth: Ledger) -> str:
    """The prefix of the cache's entries: the cache's prefix, ``tiered`` and a digest of what the truth's records are
    (its database's name and its table, schema-qualified), so that two truths never share entries and no entry is
    ever among a ``RedisLedger``'s records (``<prefix>:{thread}...``). The same table reached by another URL (host
    name, driver, options) shares them, so that every ledger of one truth invalidates the same entries."""
    table = getattr(truth, "table", None)
    schema = getattr(table, "schema", None) or "public"
    database = getattr(getattr(truth, "_url", None), "database", None)
    identity = f"{database}\0{schema}\0{getattr(table, 'name', None)}"
    return f"{prefix}:tiered:{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def _capped_socket_options(url: str, bound: float) -> str:
    """``url`` with its ``socket_timeout`` and ``socket_connect_timeout`` options (which redis-py prefers to the
    ledger's timeouts) capped at ``bound`` seconds; every other part as given."""
    base, sep, query = url.partition("?")
    if not sep:
        return url
    parts = []
    for part in query.split("&"):
        name, eq, value = part.partition("=")
        if eq and urllib.parse.unquote_plus(name) in _SOCKET_OPTIONS:
            try:
                seconds = float(urllib.parse.unquote_plus(value))
            except ValueError:
                raise ValueError(
                    f"the cache URL's option {urllib.parse.unquote_plus(name)!r} is not a number of seconds: give one "
                    f"(it is capped at a quarter of the truth's io_timeout), or leave it out"
                ) from None
            part = f"{name}={min(seconds, bound):g}"
        parts.append(part)
    return f"{base}?{'&'.join(parts)}"
