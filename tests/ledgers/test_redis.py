"""What only the Redis ledger has to prove: key layout, isolation, native expiry, shared clients."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

import replaysafe
from replaysafe import CallKey, RedisLedger, Status

from ..servers import with_query

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
LEASE = NOW + dt.timedelta(minutes=5)
HOSTILE = [
    "plain",
    "a:b",
    ":",
    "{tag}",
    "}{",
    "{",
    "*",
    "?",
    "[a-z]",
    "\\",
    "with space",
    "%3A",
    "nul\x00byte",
    "ünï ✓ 中文 🎉",
    "x" * 1024,
    "'; DROP TABLE tool_executions; --",
]


def _server_and_prefix(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    prefix = query.pop("prefix")
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query))), prefix


@pytest.fixture
def rl(redis_url: str) -> Iterator[RedisLedger]:
    with replaysafe.open_ledger(redis_url) as ledger:
        assert isinstance(ledger, RedisLedger)
        yield ledger


def claim(ledger: replaysafe.Ledger, key: CallKey, owner: str = "o#1") -> bool:
    return ledger.claim(key, tool_name="t", args_digest="d", owner=owner, now=NOW, lease_expires_at=LEASE).claimed


def _hash_tag(name: str) -> str:
    """The part of a key Redis Cluster hashes: between the first '{' and the next '}'."""
    start = name.index("{")
    return name[start + 1 : name.index("}", start + 1)]


def test_hostile_ids_stay_in_their_own_record_and_thread(rl: RedisLedger) -> None:
    """Ids with separators, braces, glob characters, NUL, unicode and 1 KB never collide or reach another thread."""
    keys = [CallKey(t, m, c) for t in HOSTILE for m, c in ((t, t), ("m", t), (t + ":", "c"))]
    keys += [CallKey("a", "b:c", "d"), CallKey("a:b", "c", "d")]  # collide under naive joining
    for n, key in enumerate(keys):
        assert claim(rl, key, owner=f"o#{n}")
        assert rl.complete(key, owner=f"o#{n}", status=Status.COMPLETED, result=str(n), now=NOW)
    for n, key in enumerate(keys):
        stored = rl.get(key)
        assert stored is not None and stored.key == key and stored.result == str(n)
    assert rl.get_many(keys) == {key: rl.get(key) for key in keys}
    assert {r.key for r in rl.records()} == set(keys)
    for thread in HOSTILE:
        mine = [k for k in keys if k.thread_id == thread]
        assert sorted(r.key for r in rl.records(thread_id=thread)) == sorted(mine)
        assert rl.purge_thread(thread) == len(mine)
        assert all(rl.get(k) is None for k in mine)
    assert {r.key for r in rl.records()} == {k for k in keys if k.thread_id not in HOSTILE}


def test_one_thread_one_hash_tag_no_raw_separators(rl: RedisLedger) -> None:
    """A thread's record and index keys share one hash tag (one cluster slot); ids appear only encoded."""
    thread = "t:{x}*?[ ]"
    for n in range(3):
        assert claim(rl, CallKey(thread, f"m:{n}", "c{}"))
    names = [n.decode() for n in rl.client.scan_iter(match=f"{rl.prefix}:*")]
    assert len(names) == 4  # three records and the thread's index
    assert {_hash_tag(name) for name in names} == {"t%3A%7Bx%7D%2A%3F%5B%20%5D"}
    assert all(name.count("{") == 1 and name.count("}") == 1 for name in names)


def test_real_short_ttl_expires_records_natively(redis_url: str) -> None:
    """With ttl, Redis itself expires a completed record (and the thread's index); a new claim then wins."""
    server, prefix = _server_and_prefix(redis_url)
    with RedisLedger(server, prefix=prefix, ttl=0.3) as ledger:
        done, doubt = CallKey("t", "m", "done"), CallKey("t", "m", "doubt")
        assert claim(ledger, done) and claim(ledger, doubt)
        assert ledger.complete(done, owner="o#1", status=Status.COMPLETED, result="1", now=NOW)
        assert ledger.complete(doubt, owner="o#1", status=Status.IN_DOUBT, result=None, now=NOW)
        record_key, index_key = ledger._ops.keys(done)
        assert 0 < ledger.client.pttl(record_key) <= 300
        assert ledger.client.pttl(ledger._ops.keys(doubt)[0]) == -1  # in doubt: kept until settled
        stored = ledger.get(done)
        assert stored is not None and stored.expires_at == NOW + dt.timedelta(seconds=0.3)
        deadline = time.monotonic() + 10
        while ledger.get(done) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ledger.get(done) is None
        assert claim(ledger, done, owner="o#2")
        assert ledger.delete(doubt) and ledger.release(done, owner="o#2")
        assert not ledger.client.exists(index_key)
        assert ledger.complete(done, owner="o#2", status=Status.COMPLETED, result="1", now=NOW) is False


def test_the_index_expires_with_its_last_record(redis_url: str) -> None:
    """When every record of a thread has a ttl, the thread's index expires too: nothing is left behind."""
    server, prefix = _server_and_prefix(redis_url)
    with RedisLedger(server, prefix=prefix, ttl=0.2) as ledger:
        key = CallKey("t", "m", "c")
        assert claim(ledger, key)
        index_key = ledger._ops.keys(key)[1]
        assert ledger.client.pttl(index_key) == -1  # a running record: the index must stay
        assert ledger.complete(key, owner="o#1", status=Status.COMPLETED, result="1", now=NOW)
        assert 0 < ledger.client.pttl(index_key) <= 200
        deadline = time.monotonic() + 10
        while list(ledger.client.scan_iter(match=f"{prefix}:*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(ledger.client.scan_iter(match=f"{prefix}:*")) == []


def test_scripts_are_called_by_sha(redis_url: str) -> None:
    """The protocol's writes are EVALSHA calls of scripts loaded once; no script text is sent per call."""
    server, prefix = _server_and_prefix(redis_url)
    sent: list[bytes] = []

    class Recording(redis.Connection):
        def send_packed_command(self, command: object, check_health: bool = True) -> None:
            chunks = command if isinstance(command, list) else [command]
            sent.extend(bytes(c) for c in chunks)  # type: ignore[call-overload]
            super().send_packed_command(command, check_health)

    parts = urllib.parse.urlsplit(server)
    pool = redis.ConnectionPool(connection_class=Recording, host=parts.hostname, port=parts.port or 6379)
    client = redis.Redis(connection_pool=pool)
    with RedisLedger(client, prefix=prefix) as ledger:
        key = CallKey("t", "m", "c")
        assert claim(ledger, key)
        sent.clear()
        assert ledger.complete(key, owner="o#1", status=Status.COMPLETED, result="secret-result", now=NOW)
        assert not claim(ledger, key, owner="o#2")
    wire = b"".join(sent)
    assert wire.count(b"EVALSHA") == 2
    assert b"redis.call" not in wire
    client.close()


def test_prefix_and_arguments_are_checked(redis_server_url: str) -> None:
    """A prefix with braces or glob characters, a bad ttl or client type is refused with a clear message."""
    for prefix in ("a{b}", "a*", "a?", "a b", "", "x[y]"):
        with pytest.raises(ValueError, match="prefix"):
            RedisLedger(redis_server_url, prefix=prefix)
    with pytest.raises(ValueError, match="ttl"):
        RedisLedger(redis_server_url, ttl=0)
    with pytest.raises(TypeError, match="redis:// URL"):
        RedisLedger(42)  # type: ignore[arg-type]
    assert "secret" not in repr(RedisLedger("redis://:secret@127.0.0.1:6379/0"))


# --- shared clients -----------------------------------------------------------------------


def test_a_shared_sync_client_is_used_and_left_open(redis_url: str) -> None:
    """Given the app's redis.Redis, the ledger uses it, .aio connects alike, and close() leaves it open."""
    server, prefix = _server_and_prefix(redis_url)
    client = redis.Redis.from_url(server)
    ledger = RedisLedger(client, prefix=prefix)
    key = CallKey("t", "m", "c")
    assert claim(ledger, key)

    async def finish() -> bool:
        done = await ledger.aio.complete(key, owner="o#1", status=Status.COMPLETED, result="1", now=NOW)
        await ledger.aclose()
        return done

    assert asyncio.run(finish())
    ledger.close()
    assert client.ping()
    stored = ledger.get(key)  # through the shared client, still open
    assert stored is not None and stored.status is Status.COMPLETED
    ledger.close()  # the read above reopened the ledger's own connection
    client.close()


async def test_a_shared_async_client_is_used_and_left_open(redis_url: str) -> None:
    """Given the app's redis.asyncio.Redis, .aio uses it, the sync side connects alike, close() leaves it open."""
    server, prefix = _server_and_prefix(redis_url)
    client = redis.asyncio.Redis.from_url(server)
    async with RedisLedger(client, prefix=prefix) as ledger:
        key = CallKey("t", "m", "c")
        found = await ledger.aio.claim(key, tool_name="t", args_digest="d", owner="a", now=NOW, lease_expires_at=LEASE)
        assert found.claimed
        assert ledger.get(key) == found.record  # the sync side, on its own connection
    assert await client.ping()
    await client.aclose()


# --- async -------------------------------------------------------------------------------


async def test_async_takeover_release_and_fencing(rl: RedisLedger) -> None:
    """.aio's takeover is a compare-and-set, and release and complete are fenced by owner."""
    key = CallKey("t", "m", "c")
    first = await rl.aio.claim(key, tool_name="t", args_digest="d", owner="a", now=NOW, lease_expires_at=NOW)
    assert first.claimed
    taken = await rl.aio.takeover(first.record, owner="b", now=NOW, lease_expires_at=LEASE)
    assert taken is not None and (taken.owner, taken.attempt) == ("b", 2)
    assert await rl.aio.takeover(first.record, owner="c", now=NOW, lease_expires_at=LEASE) is None
    assert not await rl.aio.complete(key, owner="a", status=Status.COMPLETED, result="1", now=NOW)
    assert not await rl.aio.release(key, owner="a")
    assert await rl.aio.get(key) == taken
    assert await rl.aio.complete(key, owner="b", status=Status.FAILED, result="{}", now=NOW)
    assert await rl.aio.complete(key, owner="b", status=Status.FAILED, result="{}", now=NOW)  # a retried write
    assert not await rl.aio.release(key, owner="b")  # only a running record is released
    assert set(await rl.aio.get_many([key, CallKey("t", "m", "other")])) == {key}
    await rl.aclose()


def test_prefixes_are_isolated(redis_url: str) -> None:
    """Two prefixes on one server are two ledgers, and records() of one never lists the other's keys."""
    server, prefix = _server_and_prefix(redis_url)
    with RedisLedger(server, prefix=prefix) as one, RedisLedger(server, prefix=f"{prefix}:inner") as two:
        assert claim(one, CallKey("t", "m", "c"))
        assert claim(two, CallKey("t", "m", "c"))
        assert len(list(one.records())) == 1
        assert len(list(two.records())) == 1


@pytest.mark.parametrize("stored", ["hash", "text"])
def test_a_value_of_another_format_fails_closed_naming_the_fix(rl: RedisLedger, stored: str) -> None:
    """A record of the previous format (a hash) or any other value under a record's key is never read as a
    record: every operation raises, and the ledger calls it permanent with the fix (delete it, or a new prefix)."""
    key = CallKey("t", "m", "c")
    name = rl._ops.keys(key)[0]
    if stored == "hash":
        rl.client.hset(name, mapping={"status": "completed", "owner": "o#1", "result": "1"})
    else:
        rl.client.set(name, "1 completed but not a record")
    operations = [
        lambda: rl.get(key),
        lambda: claim(rl, key),
        lambda: rl.complete(key, owner="o#1", status=Status.COMPLETED, result="1", now=NOW),
        lambda: rl.renew(key, owner="o#1", lease_expires_at=LEASE),
        lambda: rl.release(key, owner="o#1"),
    ]
    for operation in operations:
        with pytest.raises(Exception) as raised:  # noqa: PT011 - the ledger's diagnosis is what is checked
            operation()
        fault = rl.diagnose(raised.value)
        assert not fault.transient
        assert "new prefix" in fault.fix


def test_a_connection_given_back_after_close_is_closed_too(rl: RedisLedger) -> None:
    """A command that gives its held connection back after the ledger's connections were closed
    (a command in flight during ``close()``) closes it then: none stays open in a closed ledger."""
    key = CallKey("t", "m", "c")
    assert rl.get(key) is None  # the held connections exist now
    held = rl._held
    assert held is not None and held._idle, "a single-server client's commands run on held connections"
    held.close()
    assert len(held._idle) == 0
    assert held.execute_command("GET", "rs-test-unused") is None  # ends after close: its connection is closed
    assert len(held._idle) == 0


@pytest.mark.parametrize(
    "texts",
    [
        ("refund", "a" * 64, "host:1:2#3", '{"refunded": "42"}'),
        ("ünï ✓", "中文", "host:ü#1", "🎉 \ud800 lone surrogate"),
        ("t", "d", "o#1", None),
        ("t", "d", "o#1", ""),
    ],
)
def test_a_record_reads_back_exactly_and_in_the_stored_format(
    rl: RedisLedger, texts: tuple[str, str, str, str | None]
) -> None:
    """ASCII and other texts (lengths count UTF-8 bytes) read back as written, from the one packed format."""
    from replaysafe.ledgers.redis import _pack, _unpack

    tool, digest, owner, result = texts
    key = CallKey("t", "m", "c")
    record = replaysafe.Record(
        key, tool, digest, Status.COMPLETED, result, owner, 2, NOW, NOW + dt.timedelta(seconds=1), LEASE, None
    )
    packed = _pack(record)
    size = "" if result is None else len(result.encode("utf-8", "surrogatepass"))
    lengths = " ".join(str(len(t.encode("utf-8", "surrogatepass"))) for t in (owner, tool, digest))
    head = f"1 completed 2 1772366400000000 1772366401000000 1772366700000000  {lengths} {size}\n"
    assert packed == (head + owner + tool + digest + (result or "")).encode("utf-8", "surrogatepass")
    assert _unpack(key, packed) == record
    assert _unpack(key, packed.decode("utf-8", "surrogatepass")) == record  # a decode_responses client
    name = rl._ops.keys(key)[0]
    rl.client.set(name, packed)
    assert rl.get(key) == record


def test_a_header_with_other_digits_fails_closed() -> None:
    """Only ASCII digits count: a value whose lengths are other Unicode digits is not a record."""
    from replaysafe.ledgers.redis import RecordFormatError, _unpack

    with pytest.raises(RecordFormatError):
        _unpack(CallKey("t", "m", "c"), "1 completed 1 1 1 1  \u0661 1 1 \nabc".encode())


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_commands_are_packed_as_redis_py_packs_them(encoding: str) -> None:
    """The held connections pack the ledger's commands themselves: the same bytes as redis-py, sync and asyncio."""
    from replaysafe.ledgers.redis import _packed

    commands = [
        ("GET", "p:{t}:m:c"),
        ("CLIENT ID",),
        ("SCRIPT EXISTS", "a" * 40),
        ("EVALSHA", "a" * 40, 2, "p:{t}:m:c", "p:{t}", b"1 running\n" + b"x" * 100_000, "ownér", 0, "", -5, 1.5),
    ]
    for client in (redis.Redis(encoding=encoding), redis.asyncio.Redis(encoding=encoding)):
        conn = client.connection_pool.make_connection()
        for command in commands:
            assert _packed(command, conn.encoder) == [b"".join(conn.pack_command(*command))]
        with pytest.raises(redis.DataError):
            _packed(("GET", True), conn.encoder)


@pytest.mark.parametrize("encoding", ["latin-1", "utf-8"])
def test_a_non_ascii_owner_holds_its_claim_whatever_the_clients_encoding(redis_url: str, encoding: str) -> None:
    """Records hold owners in UTF-8; the fenced operations send the owner in UTF-8 too, so a client set to
    another encoding (and a host name with a non-ASCII letter) still finishes, renews and releases its own
    claims, and never another owner's."""
    server, prefix = _server_and_prefix(redis_url)
    client = redis.Redis.from_url(server, encoding=encoding)
    owner, other = "büro-1:42:1700000000#1", "büro-2:42:1700000000#1"
    with RedisLedger(client, prefix=prefix) as ledger:
        done, released = CallKey("t", "m", "done"), CallKey("t", "m", "released")
        assert claim(ledger, done, owner=owner) and claim(ledger, released, owner=owner)
        assert not ledger.renew(done, owner=other, lease_expires_at=LEASE)
        assert ledger.renew(done, owner=owner, lease_expires_at=LEASE)
        assert not ledger.complete(done, owner=other, status=Status.COMPLETED, result="r", now=NOW)
        assert ledger.complete(done, owner=owner, status=Status.COMPLETED, result="r", now=NOW)
        record = ledger.get(done)
        assert record is not None and (record.status, record.owner, record.result) == (Status.COMPLETED, owner, "r")
        assert ledger.release(released, owner=owner)
        assert ledger.get(released) is None
    client.close()


def test_close_from_another_thread_closes_the_connections_of_a_running_loop(redis_url: str) -> None:
    """close() called outside the thread whose event loop ``.aio`` used: that loop closes them soon."""
    name = f"rs-close-{uuid.uuid4().hex[:8]}"
    ledger = RedisLedger(with_query(redis_url, client_name=name))
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    probe = redis.Redis.from_url(redis_url.partition("?")[0])

    def named() -> int:
        return sum(1 for entry in probe.client_list() if entry["name"] == name)

    try:
        key = CallKey("t", "m", "c")
        asyncio.run_coroutine_threadsafe(ledger.aio.get(key), loop).result(10)
        assert named() >= 1
        ledger.close()
        deadline = time.monotonic() + 2
        while named() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert named() == 0, "the loop's connections stayed open"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()
        probe.close()


def _kill_connections_named(server: str, name: str) -> int:
    """Close, on the server, every connection whose client name is ``name`` (as a restart or an idle
    timeout would); how many there were."""
    admin = redis.Redis.from_url(server)
    try:
        ids = [entry["id"] for entry in admin.client_list() if entry.get("name") == name]
        for client_id in ids:
            admin.client_kill_filter(_id=client_id)
        return len(ids)
    finally:
        admin.close()


@pytest.mark.parametrize(
    "given",
    ["url", "a-sync-client", "an-async-client"],
    ids=["built-from-a-url", "given-a-sync-client", "given-an-async-client"],
)
async def test_a_connection_the_server_closed_is_reopened_at_once_on_both_sides(redis_url: str, given: str) -> None:
    """A held connection the server closed while it sat idle is reopened and the command sent again,
    at once and below the ledger's retry policy: under ``attempts=1`` no operation fails for it,
    on the sync side and on ``.aio``, whether the ledger built its clients or copied a given one
    for its other side."""
    server, prefix = _server_and_prefix(redis_url)
    name = f"rs-stale-{uuid.uuid4().hex[:8]}"
    named = with_query(server, client_name=name)
    client: redis.Redis | redis.asyncio.Redis | None = None
    if given == "a-sync-client":
        client = redis.Redis.from_url(named)
    elif given == "an-async-client":
        client = redis.asyncio.Redis.from_url(named)
    ledger = RedisLedger(
        with_query(named, prefix=prefix) if client is None else client,
        prefix=None if client is None else prefix,
        retry=replaysafe.ledgers.RetryPolicy(attempts=1),
    )
    key = CallKey("t", "m", "c")
    try:
        assert claim(ledger, key)
        assert (await ledger.aio.get(key)) is not None  # both sides now hold a connection
        assert _kill_connections_named(server, name) >= 2
        assert ledger.get(key) is not None
        assert (await ledger.aio.get(key)) is not None
    finally:
        await ledger.aclose()
        ledger.close()
        if isinstance(client, redis.asyncio.Redis):
            await client.aclose()
        elif client is not None:
            client.close()
