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
* **Changes go to the truth, then the cache is invalidated.** ``delete``, ``purge_thread``
  and a takeover of a finished record (``resolve --force``) remove the cache's entry (and
  its fill token) after the truth changed; ``delete`` and ``purge_thread`` raise
  ``LedgerError`` when that fails, since the entry could still be replayed.
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
from .._sealing import FINISHED
from ._options import redact
from ._protocol import AsyncLedger, Ledger, LedgerBase, LedgerFault, diagnose, forget_in_forked_child, handed_now
from .redis import RedisLedger

_T = TypeVar("_T")

#: Seconds the cache is skipped after it failed.
CACHE_PAUSE = 5.0
#: How long a miss's fill token lives (ms): a write through that comes later is dropped (costs speed only).
_TOKEN_MS = 600_000
#: Claims awaiting their write through, at most (the oldest is forgotten first: costs speed only).
_PENDING_MAX = 4096
#: The URL schemes a cache URL may have.
_CACHE_SCHEMES = ("redis", "rediss", "unix")
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
                self.cache._ops.cache_read(key, os.urandom(9).hex(), _TOKEN_MS)
            )
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
            yield _CacheStep(self.cache._ops.cache_fill(record, token))
        except Exception as exc:
            self._cache_failed(exc, "writing", record.key, record.tool_name)

    def _invalidate(self, key: CallKey, after: str) -> Steps[None]:
        """Remove the cache's entry of ``key`` and its fill token; ``LedgerError`` naming the next step on failure."""
        try:
            yield _CacheStep(self.cache._ops.uncache(key))
        except Exception as exc:
            name = self.cache._ops.keys(key)[0]
            raise self._stale_entry(f"{after} {key}", f"the Redis keys {name} and {name}:fill", exc, key) from exc

    def _stale_entry(self, what: str, keys: str, exc: BaseException, key: CallKey | None = None) -> LedgerError:
        fault = self.cache.diagnose(exc)
        return LedgerError(
            f"the tiered ledger {what} in PostgreSQL, but could not remove the Redis cache's entries "
            f"({type(exc).__name__}): a replay may still read the old record from the cache. Run the same operation "
            f"again once Redis answers (it is safe to repeat), or delete {keys}. {fault.fix}",
            key=key,
            transient=fault.transient,
            permanent=not fault.transient,
        )

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
            yield from self._invalidate(key, "read")
        except LedgerError as exc:
            self._cache_failed(exc, "dropping a bad entry of", key, tool_name)

    def _takeover(self, record: Record, owner: str, now: datetime, lease_expires_at: datetime) -> Steps[Record | None]:
        finished = record.status in FINISHED
        if finished:  # only a finished record may be in the cache: out first, nothing changed if it fails
            yield from self._invalidate(record.key, "was to take over")
        taken: Record | None = yield _truth("takeover", record, owner=owner, now=now, lease_expires_at=lease_expires_at)
        held = self._unhold(record.key, owner)
        if taken is not None:
            self._hold(record.key, owner, taken, None if held is None else held[1])
        if finished:  # a replay may have filled it again meanwhile, from the truth as it was
            try:
                yield from self._invalidate(record.key, "took over")
            except LedgerError as exc:
                self._cache_failed(exc, "removing the entry taken over of", record.key, record.tool_name)
        return taken

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
        if done and self._pending:  # the record written through after the complete carries the lease as stored
            with self._pending_lock:
                held = self._pending.get((key, owner))
                if held is not None and held[0] is not None:
                    self._pending[key, owner] = (held[0]._replace(lease_expires_at=lease_expires_at), held[1])
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

    def takeover(self, record: Record, *, owner: str, now: datetime, lease_expires_at: datetime) -> Record | None:
        """The truth's takeover; a finished record's cache entry is removed first (and again after)."""
        return self._drive(self._takeover(record, owner, now, lease_expires_at))

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
        """Delete the truth's record, then the cache's entry (``LedgerError`` if that fails: run it again)."""
        deleted = bool(self.truth.delete(key))
        self._drive(self._invalidate(key, "deleted"))
        return deleted

    def purge_thread(self, thread_id: str) -> int:
        """Delete the thread's records in the truth, then its cache entries (``LedgerError`` if that fails)."""
        deleted = self.truth.purge_thread(thread_id)
        try:
            self.cache.purge_thread(thread_id)
        except Exception as exc:
            index = self.cache._ops.index(thread_id)
            what = f"purged the thread {thread_id!r}"
            raise self._stale_entry(what, f"the keys listed in the Redis sorted set {index}, and the set", exc) from exc
        return deleted

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
        if isinstance(exc, LedgerError):
            return LedgerFault(exc.transient, "See the error's message.")
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

    async def takeover(self, record: Record, *, owner: str, now: datetime, lease_expires_at: datetime) -> Record | None:
        return await self._ledger._adrive(self._ledger._takeover(record, owner, now, lease_expires_at))

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
