"""``TieredLedger``: PostgreSQL the truth, a Redis cache of finished records in front.

The contract suite runs on it too (``tiered`` in tests/ledgers/conftest.py). These tests pin what is its own:
the cache is written after the truth, versioned and fenced; only a finished record that fits the call is
served from it; a cache that disagrees with the truth never wins; a cache that fails, restarts or is flushed
costs speed only; the CLI's changes reach the truth and clear the cache.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.exceptions

import replaysafe
from replaysafe import (
    CallKey,
    Event,
    EventKind,
    LedgerError,
    PostgresLedger,
    RedisLedger,
    Status,
    TieredLedger,
    on_event,
    open_ledger,
    replay_safe,
    tool_call,
)
from replaysafe._sealing import Sealer
from replaysafe.ledgers import RetryPolicy
from replaysafe.ledgers.redis import _CACHE_PURGE, _pack, _unpack
from replaysafe.ledgers.tiered import _CacheStep, _TruthStep

from ..cli import cli
from ..servers import PostgresServer, RedisServer, with_query
from .test_server_restart import _tool
from .test_stalled_servers import frozen

NOW = dt.datetime(2026, 12, 6, 10, 0, tzinfo=dt.timezone.utc)
LEASE = NOW + dt.timedelta(seconds=300)
DIGEST = "d" * 64
SIGNING_KEY = "a-signing-key-of-32-bytes-or-so!"
NO_RETRY = RetryPolicy(attempts=1)


def new_key() -> CallKey:
    return CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c")


@pytest.fixture
def tiered(postgres_url: str, redis_url: str) -> Iterator[TieredLedger]:
    with TieredLedger(PostgresLedger(postgres_url), cache=RedisLedger(redis_url)) as ledger:
        yield ledger


@pytest.fixture
def events() -> Iterator[list[Event]]:
    seen: list[Event] = []
    stop = on_event(seen.append)
    yield seen
    stop()


def record(ledger: TieredLedger, key: CallKey, result: str = '"ok"', *, owner: str = "a#1") -> None:
    """Claim and complete ``key`` as a call would."""
    assert claim(ledger, key, owner=owner).claimed
    assert ledger.complete(key, owner=owner, status=Status.COMPLETED, result=result, now=NOW)


def claim(ledger: Any, key: CallKey, *, owner: str = "a#1", tool: str = "refund", digest: str = DIGEST) -> Any:
    return ledger.claim(key, tool_name=tool, args_digest=digest, owner=owner, now=NOW, lease_expires_at=LEASE)


def _run_id(ledger: TieredLedger) -> bytes:
    """What the cache's entries start with: the Redis server's run_id and a space."""
    return f"{ledger.cache.client.info('server')['run_id']} ".encode()


def cached(ledger: TieredLedger, key: CallKey) -> replaysafe.Record | None:
    """The cache's entry of ``key`` as stored (a record of the server's current run), read without the ledger."""
    raw = ledger.cache.client.get(ledger._ops.keys(key)[0])
    if raw is None:
        return None
    run, _, packed = raw.partition(b" ")
    assert run + b" " == _run_id(ledger)
    return _unpack(key, packed)


def evict(ledger: TieredLedger, key: CallKey) -> None:
    """The cache's entry of ``key`` gone, as Redis evicts it."""
    ledger.cache.client.delete(ledger._ops.keys(key)[0])


def refuse(*_: Any, **__: Any) -> Any:
    raise AssertionError("the truth was asked")


# --- written after the truth, read first ------------------------------------------------------


def test_a_finished_record_is_written_to_the_cache_as_the_truth_holds_it(tiered: TieredLedger) -> None:
    key = new_key()
    assert claim(tiered, key).claimed
    assert cached(tiered, key) is None  # a running record never reaches the cache
    assert tiered.complete(key, owner="a#1", status=Status.COMPLETED, result='"ok"', now=NOW)
    assert cached(tiered, key) == tiered.truth.get(key)
    assert tiered.truth.get(key) is not None


def test_a_replay_is_answered_by_the_cache_alone(tiered: TieredLedger, monkeypatch: pytest.MonkeyPatch) -> None:
    key = new_key()
    record(tiered, key)
    monkeypatch.setattr(tiered.truth, "claim", refuse)
    monkeypatch.setattr(tiered.truth, "get", refuse)
    found = claim(tiered, key, owner="b#1")
    assert not found.claimed
    assert (found.record.status, found.record.result, found.record.owner) == (Status.COMPLETED, '"ok"', "a#1")
    assert tiered.get(key) == found.record


async def test_async_writes_through_and_replays_from_the_cache(
    tiered: TieredLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = new_key()
    aio = tiered.aio
    assert (
        await aio.claim(key, tool_name="refund", args_digest=DIGEST, owner="a#1", now=NOW, lease_expires_at=LEASE)
    ).claimed
    assert await aio.complete(key, owner="a#1", status=Status.COMPLETED, result='"ok"', now=NOW)
    assert cached(tiered, key) == tiered.truth.get(key)
    monkeypatch.setattr(tiered.truth.aio, "claim", refuse)
    found = await aio.claim(key, tool_name="refund", args_digest=DIGEST, owner="b#1", now=NOW, lease_expires_at=LEASE)
    assert (found.claimed, found.record.result) == (False, '"ok"')


def test_the_record_written_through_carries_the_lease_as_renewed(tiered: TieredLedger) -> None:
    key = new_key()
    assert claim(tiered, key).claimed
    assert tiered.renew(key, owner="a#1", lease_expires_at=LEASE + dt.timedelta(minutes=5))
    assert tiered.complete(key, owner="a#1", status=Status.COMPLETED, result='"ok"', now=NOW)
    assert cached(tiered, key) == tiered.truth.get(key)


def test_a_replay_that_misses_fills_the_cache_from_the_truth(tiered: TieredLedger) -> None:
    """A flushed or evicted cache costs one read of the truth, which fills it again."""
    key = new_key()
    record(tiered, key)
    evict(tiered, key)  # evicted
    assert claim(tiered, key, owner="b#1").record.result == '"ok"'
    assert cached(tiered, key) == tiered.truth.get(key)


def test_a_failed_record_is_cached_and_replayed_paused_and_in_doubt_ones_never(tiered: TieredLedger) -> None:
    failed, paused, in_doubt = new_key(), new_key(), new_key()
    for key, status in ((failed, Status.FAILED), (paused, Status.PAUSED), (in_doubt, Status.IN_DOUBT)):
        assert claim(tiered, key).claimed
        assert tiered.complete(key, owner="a#1", status=status, result='"e"', now=NOW)
    assert cached(tiered, failed) == tiered.truth.get(failed)
    assert cached(tiered, paused) is None
    assert cached(tiered, in_doubt) is None
    claim(tiered, paused, owner="b#1")  # a replay of each reads the truth, and caches nothing
    claim(tiered, in_doubt, owner="b#1")
    assert cached(tiered, paused) is None
    assert cached(tiered, in_doubt) is None


def test_a_protected_tool_runs_once_and_replays(tiered: TieredLedger) -> None:
    runs: list[str] = []

    @replay_safe(ledger=tiered, on_ledger_error="raise")
    def refund(order_id: str) -> dict[str, str]:
        runs.append(order_id)
        return {"refunded": order_id}

    for _ in range(3):
        with tool_call("t-tool", "m", "c"):
            assert refund("42") == {"refunded": "42"}
    assert runs == ["42"]
    assert cached(tiered, CallKey("t-tool", "m", "c")) == tiered.truth.get(CallKey("t-tool", "m", "c"))


# --- versioned and fenced writes ------------------------------------------------------------------


def _token(ledger: TieredLedger, key: CallKey) -> str:
    """A miss on the cache, as a replay's first step makes it: the fill token it hands out."""
    entry, token = ledger.cache._run(ledger._ops.cache_read(key, uuid.uuid4().hex, 60_000))
    assert entry is None and token is not None
    return token


def _finished(key: CallKey, attempt: int, updated: dt.datetime, result: str) -> replaysafe.Record:
    return replaysafe.Record(key, "refund", DIGEST, Status.COMPLETED, result, "a#1", attempt, NOW, updated, LEASE)


def _fill(ledger: TieredLedger, entry: replaysafe.Record, token: str) -> bool:
    written: bool = ledger.cache._run(ledger._ops.cache_fill(entry, token))
    return written


def test_an_older_write_never_replaces_a_newer_one(tiered: TieredLedger) -> None:
    """Two writers of one key land in the order that makes the older one last: the newer entry stays."""
    key = new_key()
    token = _token(tiered, key)
    later = NOW + dt.timedelta(seconds=1)
    newer = _finished(key, 2, NOW, '"attempt 2"')
    assert _fill(tiered, newer, token)
    assert not _fill(tiered, _finished(key, 1, later, '"attempt 1, later clock"'), token)  # a lower attempt
    assert not _fill(tiered, _finished(key, 2, NOW - dt.timedelta(seconds=1), '"attempt 2, earlier"'), token)
    assert not _fill(tiered, _finished(key, 2, NOW, '"attempt 2, same version"'), token)
    assert cached(tiered, key) == newer
    newest = _finished(key, 2, later, '"attempt 2, later"')
    assert _fill(tiered, newest, token)  # a newer version replaces it
    assert cached(tiered, key) == newest


def test_a_write_without_the_token_of_a_miss_is_refused(tiered: TieredLedger) -> None:
    key = new_key()
    assert not _fill(tiered, _finished(key, 1, NOW, '"forged"'), "no-such-token")
    token = _token(tiered, key)
    assert not _fill(tiered, _finished(key, 1, NOW, '"forged"'), f"{token}-other")
    assert cached(tiered, key) is None


def test_a_replay_that_read_the_truth_before_a_delete_cannot_put_the_record_back(tiered: TieredLedger) -> None:
    """The race a version cannot fence: a replay misses, reads the truth's record, then an operator deletes the
    record (so that the call runs again) before the replay writes the cache. The write is refused; the next call
    runs the tool, as the operator asked."""
    key = new_key()
    record(tiered, key)
    evict(tiered, key)  # evicted: the next replay misses
    replay = tiered._claim(key, "refund", DIGEST, "b#1", NOW, LEASE)
    read = next(replay)
    assert isinstance(read, _CacheStep)
    asked = replay.send(tiered.cache._run(read.op))  # the miss, and its token
    assert isinstance(asked, _TruthStep) and asked.method == "claim"
    found = tiered.truth.claim(key, **asked.kwargs)
    assert found.record.status is Status.COMPLETED
    assert tiered.delete(key)  # the operator, between the replay's read and its write
    fill = replay.send(found)
    assert isinstance(fill, _CacheStep)
    with pytest.raises(StopIteration):
        replay.send(tiered.cache._run(fill.op))
    assert cached(tiered, key) is None
    assert claim(tiered, key, owner="c#1").claimed  # the call runs again


# --- what the cache serves ------------------------------------------------------------------------


def _plant(ledger: TieredLedger, entry: replaysafe.Record) -> None:
    """Write ``entry`` straight into the cache's Redis, as another program (or an attacker) could."""
    ledger.cache.client.set(ledger._ops.keys(entry.key)[0], _run_id(ledger) + _pack(entry))


@pytest.mark.parametrize("status", [Status.RUNNING, Status.IN_DOUBT, Status.PAUSED])
def test_only_a_finished_record_is_served_from_the_cache(tiered: TieredLedger, status: Status) -> None:
    key = new_key()
    _plant(tiered, _finished(key, 1, NOW, '"x"')._replace(status=status))
    found = claim(tiered, key)
    assert found.claimed  # the truth answered: no record there
    assert cached(tiered, key) is None  # and the entry that could not have come from it is gone


def test_a_cache_holding_a_record_of_another_tool_or_arguments_never_wins(tiered: TieredLedger) -> None:
    """The entry is not this call's: the truth answers, and its verdict (here: no record, so the call runs; or
    its own record) stands."""
    key = new_key()
    _plant(tiered, _finished(key, 1, NOW, '"other tool"')._replace(tool_name="other"))
    assert claim(tiered, key).claimed
    other = new_key()
    record(tiered, other, '"the truth"')
    _plant(tiered, _finished(other, 7, NOW, '"other arguments"')._replace(args_digest="e" * 64))
    found = claim(tiered, other, owner="b#1")
    assert (found.claimed, found.record.result, found.record.attempt) == (False, '"the truth"', 1)
    assert cached(tiered, key) is None  # contradicted by the truth: dropped
    assert cached(tiered, other) is None
    assert claim(tiered, other, owner="c#1").record == cached(tiered, other) == tiered.truth.get(other)


def test_an_entry_of_the_truths_own_record_asked_by_another_tool_is_kept(tiered: TieredLedger) -> None:
    """A call of another tool under a recorded key: the truth says mismatch (the same record); the entry stays."""
    key = new_key()
    record(tiered, key)
    entry = cached(tiered, key)
    assert entry is not None
    with pytest.raises(replaysafe.ReplayMismatchError), tool_call(*key):
        replay_safe(ledger=tiered)(lambda: "other")()
    assert cached(tiered, key) == entry


def test_a_cached_record_past_its_expiry_is_not_served(tiered: TieredLedger) -> None:
    key = new_key()
    _plant(tiered, _finished(key, 1, NOW, '"expired"')._replace(expires_at=NOW - dt.timedelta(seconds=1)))
    assert claim(tiered, key).claimed


def test_a_forged_record_in_the_cache_is_ignored_for_the_truth_and_reported(
    postgres_url: str, redis_url: str, events: list[Event]
) -> None:
    """With a signing key, an entry whose seal does not check (unsealed, or sealed with another key) is never
    served: it is dropped, a ``tampered`` event says so, and the truth answers (here: the tool runs once)."""
    runs: list[str] = []
    truth = PostgresLedger(postgres_url, signing_key=SIGNING_KEY)
    with TieredLedger(truth, cache=RedisLedger(redis_url)) as ledger:

        @replay_safe(ledger=ledger, on_ledger_error="raise")
        def refund(order_id: str) -> str:
            runs.append(order_id)
            return f"refunded {order_id}"

        with tool_call("t-warm", "m", "c"):
            refund("0")  # the tool's argument digest, as the call makes it
        warm = ledger.truth.get(CallKey("t-warm", "m", "c"))
        assert warm is not None
        digest = warm.args_digest
        unsealed, sealed_elsewhere = CallKey("t-unsealed", "m", "c"), CallKey("t-other-key", "m", "c")
        other = Sealer(["another-key-of-32-bytes-or-more!!"])
        forgeries = {
            unsealed: '"forged"',
            sealed_elsewhere: other.seal(sealed_elsewhere, "refund", digest, Status.COMPLETED, '"forged"'),
        }
        for key, result in forgeries.items():
            _plant(
                ledger, replaysafe.Record(key, "refund", digest, Status.COMPLETED, result, "x#1", 1, NOW, NOW, LEASE)
            )
            with tool_call(*key):
                assert refund("0") == "refunded 0"  # the tool ran: the truth had no record
            assert cached(ledger, key) is None  # dropped
            with tool_call(*key):
                assert refund("0") == "refunded 0"  # a replay, which fills the cache from the truth
            assert cached(ledger, key) == ledger.truth.get(key)
        assert runs == ["0", "0", "0"]
    tampered = [e for e in events if e.kind is EventKind.TAMPERED]
    assert len(tampered) == 2
    assert all(e.ledger == "tiered" and "cache" in e.message for e in tampered)


# --- the cache fails: the truth answers -------------------------------------------------------------


def test_cache_down_replays_fall_back_to_postgres_with_an_event(
    postgres_url: str, redis_server: RedisServer, events: list[Event]
) -> None:
    runs: list[str] = []
    truth = PostgresLedger(postgres_url, retry=NO_RETRY)
    with TieredLedger(truth, cache=RedisLedger(redis_server.url), cache_pause=0) as ledger:
        refund = _tool(ledger, runs)
        for n in range(3):
            with tool_call("t", f"m{n}", "c"):
                refund(str(n))
        redis_server.stop()
        for n in range(3):  # replays: PostgreSQL answers, nothing runs again
            with tool_call("t", f"m{n}", "c"):
                assert refund(str(n)) == f"refunded {n}"
        with tool_call("t", "new", "c"):  # a first call too
            assert refund("new") == "refunded new"
        with tool_call("t", "new", "c"):
            assert refund("new") == "refunded new"
        assert runs == ["0", "1", "2", "new"]
        down = [e for e in events if e.kind is EventKind.LEDGER_ERROR]
        assert down and all(
            e.ledger == "tiered" and "PostgreSQL, the truth, answers instead" in e.message for e in down
        )
        assert "password" not in " ".join(e.message for e in down)
        # A delete cannot clear the cache first: it says so, with the next step, and the truth is left as it was.
        with pytest.raises(
            LedgerError,
            match=r"could not first remove the Redis cache's entries.*nothing was changed in PostgreSQL\. "
            r"Run the same operation again",
        ):
            ledger.delete(CallKey("t", "m0", "c"))
        assert ledger.truth.get(CallKey("t", "m0", "c")) is not None
        redis_server.start()  # back (empty): the cache fills again, the delete can be completed
        assert ledger.delete(CallKey("t", "m0", "c"))
        assert ledger.truth.get(CallKey("t", "m0", "c")) is None
        with tool_call("t", "m1", "c"):
            refund("1")
        assert cached(ledger, CallKey("t", "m1", "c")) == ledger.truth.get(CallKey("t", "m1", "c"))
        assert runs == ["0", "1", "2", "new"]


async def test_cache_down_async_replays_fall_back_to_postgres(
    postgres_url: str, redis_server: RedisServer, events: list[Event]
) -> None:
    runs: list[str] = []
    async with TieredLedger(
        PostgresLedger(postgres_url, retry=NO_RETRY), cache=RedisLedger(redis_server.url)
    ) as ledger:

        @replay_safe(ledger=ledger, on_ledger_error="raise")
        async def refund(order_id: str) -> str:
            runs.append(order_id)
            return f"refunded {order_id}"

        async with tool_call("t", "m", "c"):
            await refund("1")
        redis_server.stop()
        for _ in range(2):
            async with tool_call("t", "m", "c"):
                assert await refund("1") == "refunded 1"
        assert runs == ["1"]
        assert [e.ledger for e in events if e.kind is EventKind.LEDGER_ERROR] == ["tiered"]  # then skipped a while


def test_a_stalled_cache_is_bounded_by_the_ledgers_io_timeout(postgres_url: str, redis_url: str) -> None:
    """The cache's timeouts are capped at a quarter of the truth's io_timeout: redis-py's two tries of a stalled
    cache leave the truth at least half of it."""
    ledger = TieredLedger(PostgresLedger(postgres_url, io_timeout=2), cache=RedisLedger(redis_url))
    assert (ledger.cache.connect_timeout, ledger.cache.io_timeout) == (0.5, 0.5)
    ledger.close()
    opened = open_ledger(with_query(postgres_url, io_timeout="8", cache=redis_url))
    assert isinstance(opened, TieredLedger)
    assert opened.cache.io_timeout == 2
    opened.close()


def _record_restart_replay(ledger: TieredLedger, restart: Callable[[], None]) -> list[str]:
    """Three calls, a server restart, then their replays and a first call: the tool's runs."""
    runs: list[str] = []
    refund = _tool(ledger, runs)
    for n in range(3):
        with tool_call("t", f"m{n}", "c"):
            refund(str(n))
    restart()
    for n in range(3):
        with tool_call("t", f"m{n}", "c"):
            assert refund(str(n)) == f"refunded {n}"
    with tool_call("t", "after", "c"):
        assert refund("after") == "refunded after"
    return runs


def _restart(server: PostgresServer | RedisServer) -> Callable[[], None]:
    def restart() -> None:
        server.stop()
        server.start()

    return restart


def _replayer(ledger: TieredLedger, runs: list[str], mode: str) -> Callable[[], str]:
    """A call of one key by a sync or an async tool (each async call on an event loop of its own)."""
    if mode == "sync":
        refund = _tool(ledger, runs)

        def replay() -> str:
            with tool_call("t", "m", "c"):
                answer: str = refund("1")
                return answer

        return replay

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    async def arefund(order_id: str) -> str:
        runs.append(order_id)
        return f"refunded {order_id}"

    async def areplay() -> str:
        async with tool_call("t", "m", "c"):
            return await arefund("1")

    return lambda: asyncio.run(areplay())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stalled_cache_falls_back_to_postgres_within_the_io_timeout(
    postgres_url: str, redis_server: RedisServer, events: list[Event], mode: str
) -> None:
    """A frozen Redis (SIGSTOP: connections accepted, nothing answered): a replay waits at most the cache's capped
    timeouts, twice (redis-py's immediate retry), then PostgreSQL answers; the tool does not run again."""
    runs: list[str] = []
    truth = PostgresLedger(postgres_url, io_timeout=2, retry=NO_RETRY)
    with TieredLedger(truth, cache=RedisLedger(redis_server.url)) as ledger:
        replay = _replayer(ledger, runs, mode)
        assert replay() == "refunded 1"
        assert redis_server._process is not None
        with frozen(redis_server._process.pid):
            started = time.monotonic()
            assert replay() == "refunded 1"
            waited = time.monotonic() - started
        assert waited < 2, f"the replay waited {waited:.2f}s: more than the ledger's io_timeout"
        assert runs == ["1"]
        fallbacks = [e for e in events if e.kind is EventKind.LEDGER_ERROR]
        assert len(fallbacks) == 1
        assert "(TimeoutError): PostgreSQL, the truth, answers instead" in fallbacks[0].message


def test_a_redis_restart_loses_nothing(postgres_url: str, redis_server: RedisServer) -> None:
    """A restarted Redis lost its entries, its scripts and its connections: replays read PostgreSQL, the cache
    fills again."""
    with TieredLedger(PostgresLedger(postgres_url, retry=NO_RETRY), cache=RedisLedger(redis_server.url)) as ledger:
        runs = _record_restart_replay(ledger, _restart(redis_server))
        assert runs == ["0", "1", "2", "after"]
        for n in range(3):
            key = CallKey("t", f"m{n}", "c")
            assert cached(ledger, key) == ledger.truth.get(key)


def test_a_postgres_restart_loses_nothing(postgres_server: PostgresServer, redis_url: str) -> None:
    """Replays are answered by the cache across the restart, first calls reconnect, and the truth holds it all."""
    with TieredLedger(PostgresLedger(postgres_server.url, retry=NO_RETRY), cache=RedisLedger(redis_url)) as ledger:
        runs = _record_restart_replay(ledger, _restart(postgres_server))
        ledger._purge_cache("t", [], changed=True)  # without the cache: the truth holds every record
        assert len(list(ledger.records(thread_id="t"))) == 4
        assert _record_restart_replay(ledger, lambda: None) == []
        assert runs == ["0", "1", "2", "after"]


# --- URLs ---------------------------------------------------------------------------------------------


def test_open_ledger_opens_a_tiered_ledger_from_a_cache_option(postgres_url: str, redis_url: str) -> None:
    encoded = f"{postgres_url}&cache={urllib.parse.quote(redis_url, safe='')}"
    for url, options in ((encoded, {}), (postgres_url, {"cache": redis_url})):
        with open_ledger(url, signing_key=SIGNING_KEY, **options) as ledger:
            assert isinstance(ledger, TieredLedger)
            assert ledger.sealer is ledger.truth.sealer is not None
            assert ledger.cache.prefix == urllib.parse.parse_qs(redis_url.partition("?")[2])["prefix"][0]
            record(ledger, key := new_key())
            assert cached(ledger, key) == ledger.truth.get(key)
    with open_ledger(postgres_url) as plain:
        assert isinstance(plain, PostgresLedger)


@pytest.mark.parametrize(
    ("cache", "expected"),
    [
        ("redis://:s3cret@127.0.0.1:6379/0?prefix=p", "not percent-encoded"),
        ("redis://:s3cret@127.0.0.1:6379/0&cache=redis://127.0.0.1", "given twice"),
        (urllib.parse.quote("http://user:s3cret@example.com/", safe=""), "is not a Redis URL"),
        (urllib.parse.quote("redis://user:s3cret@127.0.0.1:6379/0?nonsense=1", safe=""), "does not open a Redis cache"),
        (urllib.parse.quote("redis://user:s3cret@127.0.0.1:6379/0?prefix=a{b}", safe=""), "does not open a Redis"),
        ("", "is empty"),
    ],
)
def test_a_bad_cache_url_names_the_option_and_the_fix_never_the_password(
    postgres_url: str, cache: str, expected: str
) -> None:
    with pytest.raises(ValueError, match=expected) as raised:
        open_ledger(f"{postgres_url}&cache={cache}")
    message = str(raised.value)
    assert "'cache'" in message
    assert "urllib.parse.quote" in message or "Fix the cache URL" in message
    assert "s3cret" not in message


def test_a_tiered_ledger_needs_a_redis_cache_and_a_durable_truth(postgres_url: str, redis_url: str) -> None:
    with pytest.raises(TypeError, match="cache must be a RedisLedger"):
        TieredLedger(PostgresLedger(postgres_url), cache=replaysafe.MemoryLedger())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="truth must be a durable ledger"):
        TieredLedger(RedisLedger(redis_url), cache=RedisLedger(redis_url))


# --- the CLI: changes go to the truth and clear the cache ----------------------------------------------


def test_the_cli_deletes_and_resolves_in_the_truth_and_clears_the_cache(postgres_url: str, redis_url: str) -> None:
    url = with_query(postgres_url, cache=redis_url)
    with open_ledger(url) as ledger:
        assert isinstance(ledger, TieredLedger)
        done, in_doubt = new_key(), new_key()
        record(ledger, done)
        assert claim(ledger, in_doubt).claimed
        assert ledger.complete(in_doubt, owner="a#1", status=Status.IN_DOUBT, result=None, now=NOW)
        assert cached(ledger, done) is not None
        shown = cli("ledger", "--ledger", url, "show", *done, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["status"] == "completed"
        listed = cli("ledger", "--ledger", url, "list", "--thread", done.thread_id, "--json")
        assert listed.returncode == 0, listed.stderr
        deleted = cli("ledger", "--ledger", url, "delete", *done, "--yes")
        assert deleted.returncode == 0, deleted.stderr
        assert ledger.truth.get(done) is None
        assert cached(ledger, done) is None
        assert claim(ledger, done, owner="b#1").claimed  # the call runs again, as deleting it asked
        resolved = cli("ledger", "--ledger", url, "resolve", *in_doubt, "--result", '"settled"', "--yes")
        assert resolved.returncode == 0, resolved.stderr
        settled = ledger.get(in_doubt)
        assert settled is not None and settled.status is Status.COMPLETED
        assert ledger.get(in_doubt) == ledger.truth.get(in_doubt)
        purged = cli("ledger", "--ledger", url, "purge", "--thread", in_doubt.thread_id, "--yes")
        assert purged.returncode == 0, purged.stderr
        assert ledger.truth.get(in_doubt) is None and cached(ledger, in_doubt) is None


def test_a_forced_resolve_of_a_finished_record_replaces_its_cache_entry(tiered: TieredLedger) -> None:
    key = new_key()
    record(tiered, key, '"old"')
    assert cached(tiered, key) is not None
    settled = tiered.resolve(key, result="new", force=True)
    assert settled is not None and settled.attempt == 2
    assert cached(tiered, key) is None or cached(tiered, key) == tiered.truth.get(key)
    found = claim(tiered, key, owner="b#1")
    assert (found.record.attempt, found.record.result) == (2, tiered.truth.get(key).result)  # type: ignore[union-attr]
    assert cached(tiered, key) == tiered.truth.get(key)


def test_check_passes_with_the_cache_down(postgres_url: str, redis_server: RedisServer, events: list[Event]) -> None:
    """A readiness probe: the truth must answer; a cache that does not is reported, not raised."""
    with TieredLedger(PostgresLedger(postgres_url), cache=RedisLedger(redis_server.url)) as ledger:
        ledger.check()
        asyncio.run(ledger.acheck())
        redis_server.stop()
        ledger.check()
    assert [e.kind for e in events] == [EventKind.LEDGER_ERROR]


# --- what an attacker found (each test failed before its fix) ----------------------------------------------


def test_an_entry_a_restarted_redis_brought_back_from_its_snapshot_is_never_served(
    postgres_url: str, redis_server: RedisServer
) -> None:
    """A restart from an RDB snapshot brings back an entry deleted since: it is of another run of the server, so it
    is a miss (and dropped), and the truth answers."""
    key = new_key()
    with TieredLedger(PostgresLedger(postgres_url), cache=RedisLedger(redis_server.url)) as ledger:
        record(ledger, key, '"first"')
        assert cached(ledger, key) is not None
        ledger.cache.client.save()  # a periodic snapshot
        assert ledger.delete(key)
    redis_server.stop()
    redis_server.start()  # from the snapshot: the deleted entry is back
    with TieredLedger(PostgresLedger(postgres_url), cache=RedisLedger(redis_server.url)) as ledger:
        assert ledger.cache.client.get(ledger._ops.keys(key)[0]) is not None
        found = claim(ledger, key, owner="b#1")
        assert found.claimed  # the truth has no record: the call runs again, as the delete asked
        assert ledger.cache.client.get(ledger._ops.keys(key)[0]) is None  # dropped


def test_a_purge_removes_the_entries_of_the_truths_records_when_the_thread_index_was_evicted(
    tiered: TieredLedger,
) -> None:
    key = new_key()
    record(tiered, key)
    assert cached(tiered, key) is not None
    tiered.cache.client.delete(tiered._ops.index(key.thread_id))  # evicted
    assert tiered.purge_thread(key.thread_id) == 1
    assert cached(tiered, key) is None
    assert claim(tiered, key, owner="b#1").claimed


def test_the_cli_purge_run_again_clears_what_the_cache_still_holds(postgres_url: str, redis_url: str) -> None:
    """A purge whose cache removal failed after the truth's: the retry its error advises finds no record in the
    truth, and still clears the thread's entries."""
    url = with_query(postgres_url, cache=redis_url)
    with open_ledger(url) as ledger:
        assert isinstance(ledger, TieredLedger)
        key = new_key()
        record(ledger, key)
        record(ledger, new_key())  # the table holds other threads too
        assert ledger.truth.purge_thread(key.thread_id) == 1  # the truth purged, the cache not
        assert cached(ledger, key) is not None
        purged = cli("ledger", "--ledger", url, "purge", "--thread", key.thread_id, "--yes")
        assert purged.returncode == 0, purged.stderr
        assert cached(ledger, key) is None
        assert claim(ledger, key, owner="b#1").claimed


def test_the_cli_shows_a_ledger_errors_own_message() -> None:
    from replaysafe._ledger_cli import _ledger_failure

    with TieredLedger(
        PostgresLedger("postgresql://u:hunter2@127.0.0.1:1/db"), cache=RedisLedger("redis://h")
    ) as ledger:
        error = LedgerError("the tiered ledger purged the thread 't' in PostgreSQL, but ... Run it again.")
        shown = str(_ledger_failure(ledger, error))
    assert "Run it again." in shown and "hunter2" not in shown


def test_a_takeover_whose_second_invalidation_fails_raises_naming_the_key_and_the_next_step(
    tiered: TieredLedger,
) -> None:
    key = new_key()
    record(tiered, key, '"first"')
    old = tiered.get(key)
    assert old is not None
    steps = tiered._takeover(old, "resolve@x", NOW, NOW)
    first = next(steps)
    assert isinstance(first, _CacheStep)
    taking = steps.send(tiered.cache._run(first.op))
    assert isinstance(taking, _TruthStep) and taking.method == "takeover"
    second = steps.send(tiered.truth.takeover(*taking.args, **taking.kwargs))
    assert isinstance(second, _CacheStep)
    with pytest.raises(LedgerError, match=r"took over .*t-.* delete the Redis keys .*then resolve it again") as raised:
        steps.throw(ConnectionError("Redis blip"))
    assert raised.value.key == key and raised.value.permanent


def test_a_delete_killed_after_the_truths_delete_leaves_no_entry(
    tiered: TieredLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache's entry goes before the truth's record too: a process killed in between leaves none."""
    key = new_key()
    record(tiered, key)
    assert cached(tiered, key) is not None
    delete = tiered.truth.delete

    def killed(call: CallKey) -> bool:
        delete(call)
        raise SystemExit("killed")

    monkeypatch.setattr(tiered.truth, "delete", killed)
    with pytest.raises(SystemExit):
        tiered.delete(key)
    assert tiered.truth.get(key) is None and cached(tiered, key) is None
    assert claim(tiered, key, owner="b#1").claimed


def test_ledgers_sharing_a_cache_prefix_never_serve_or_delete_each_others_records(
    postgres_url: str, redis_url: str
) -> None:
    """Two truths (tables) and a plain RedisLedger on one prefix: each tiered ledger's entries are its own."""
    key = new_key()
    plain = RedisLedger(redis_url)
    with (
        TieredLedger(PostgresLedger(postgres_url), cache=RedisLedger(redis_url)) as first,
        TieredLedger(
            PostgresLedger(with_query(postgres_url, table="other_calls")), cache=RedisLedger(redis_url)
        ) as other,
        plain,
    ):
        record(first, key, '"of the first table"')
        assert claim(other, key, owner="b#1").claimed  # its own truth has no record
        running = new_key()
        assert claim(plain, running, owner="p#1").claimed
        assert first.get(running) is None
        first.delete(running)
        first.purge_thread(running.thread_id)
        held = plain.get(running)
        assert held is not None and held.status is Status.RUNNING  # the plain ledger's record is untouched
        assert not claim(plain, running, owner="q#1").claimed


def test_socket_timeouts_in_the_cache_url_are_capped(postgres_url: str, redis_url: str) -> None:
    cache = with_query(redis_url, socket_timeout="30", socket_connect_timeout="30")
    with TieredLedger(PostgresLedger(postgres_url, io_timeout=2), cache=RedisLedger(cache)) as ledger:
        settings = ledger.cache.client.connection_pool.connection_kwargs
        assert settings["socket_timeout"] <= 0.5 and settings["socket_connect_timeout"] <= 0.5
    with pytest.raises(ValueError, match="'socket_timeout' is not a number of seconds"):
        TieredLedger(
            PostgresLedger(postgres_url, io_timeout=2), cache=RedisLedger(with_query(redis_url, socket_timeout="soon"))
        )


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h/db?cache=" + urllib.parse.quote("redis://:Sup3rSecretPw@h:6379/0?prefix=p", safe=""),
        "postgresql://u@h/db?cache=" + urllib.parse.quote("redis://h:6379/0?password=Sup3rSecretPw", safe=""),
        "postgresql://u@h/db?cache=" + urllib.parse.quote("redis://:Sup#3rSecretPw@h:6379/0", safe=""),
        "redis://h:6379/0?password=Sup3rSecretPw&prefix=p",
        "redis://:Sup#3rSecretPw@h:6379/0",
    ],
)
def test_every_password_in_a_url_is_redacted(url: str) -> None:
    from replaysafe._ledger_cli import _without_password
    from replaysafe.ledgers._options import redact

    assert "3rSecretPw" not in redact(url)
    shown, hidden = _without_password(url)
    assert hidden and "3rSecretPw" not in shown and "***" in shown


def test_no_password_shows_in_a_cache_url_error_or_repr() -> None:
    with pytest.raises(ValueError, match="unencoded '&'") as raised:
        open_ledger("postgresql://u@h/db?cache=redis://:s3cr&et-TAIL@h:6379/0")
    assert "TAIL" not in str(raised.value)
    with pytest.raises(ValueError, match="does not open a Redis cache") as raised:
        open_ledger("postgresql://u@h/db", cache="redis://h:6379/0?password=Sup3rSecretPw&ttl=soon")
    assert "Sup3rSecretPw" not in str(raised.value)
    assert "Sup" not in repr(RedisLedger("redis://:Sup#3rSecretPw@h:6379/0"))


def test_an_undecodable_entry_is_dropped_and_reported_and_the_cache_stays_on(
    tiered: TieredLedger, events: list[Event]
) -> None:
    key = new_key()
    record(tiered, key, '"the truth"')
    tiered.cache.client.set(tiered._ops.keys(key)[0], _run_id(tiered) + b"garbage")
    found = claim(tiered, key, owner="b#1")
    assert (found.claimed, found.record.result) == (False, '"the truth"')
    assert [e.kind for e in events] == [EventKind.TAMPERED]
    assert tiered._skip_until <= time.monotonic()  # the cache is still used
    assert claim(tiered, key, owner="c#1").record == cached(tiered, key) == tiered.truth.get(key)  # filled again


def test_a_name_put_into_the_index_from_elsewhere_is_never_deleted(tiered: TieredLedger, redis_url: str) -> None:
    """The tiered ledger deletes only keys of its own key space, whatever its index lists."""
    key = new_key()
    with RedisLedger(redis_url) as plain:
        assert claim(plain, key, owner="p#1").claimed
        foreign = plain._ops.keys(key)[0]
        tiered.cache.client.zadd(tiered._ops.index(key.thread_id), {foreign: float("inf")})
        tiered.purge_thread(key.thread_id)
        assert plain.get(key) is not None
        assert not tiered.cache.client.exists(tiered._ops.index(key.thread_id))


def test_a_forced_rerun_whose_second_invalidation_fails_says_the_next_step(
    tiered: TieredLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ``resolve`` (as ``replaysafe ledger resolve --force --rerun`` makes it): the error raised carries
    the tiered ledger's own next step."""
    key = new_key()
    record(tiered, key, '"first"')
    run = tiered.cache._run
    removals: list[object] = []

    def second_removal_fails(op: Any) -> Any:
        if _CACHE_PURGE.sha in op.command:
            removals.append(op)
            if len(removals) == 2:
                raise redis.exceptions.ConnectionError("Redis blip")
        return run(op)

    monkeypatch.setattr(tiered.cache, "_run", second_removal_fails)
    with pytest.raises(LedgerError, match=r"delete the Redis keys .*then resolve it again"):
        tiered.resolve(key, rerun=True, force=True)
