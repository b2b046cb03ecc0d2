"""Round trips: of values through every ledger, and to the server per protected call.

Values: a result replays from each ledger (memory, SQLite, PostgreSQL, Redis) equal to
what the first call returned, with the same types at every level and no annotation,
in the same process and in a new one; the cases below once came back wrong or not at all.

Server round trips: a miss costs 2, a replay (hit) costs 1. PostgreSQL round trips are
counted on the wire by a proxy (every round trip ends with a ``Sync`` or is one
``Query`` message), so a hidden ``BEGIN``, ``COMMIT`` or ping would show. Redis round
trips are counted by a connection class that counts what it sends (a pipeline is sent
at once).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import replaysafe
from replaysafe import PostgresLedger, RedisLedger, replay_safe, tool_call
from replaysafe.ledgers import Ledger

from ..result_domain import TAG, Receipt, assert_exact
from ..servers import PostgresWireCounter, libpq_url, with_query


class Stage(enum.Enum):
    DRAFT = "draft"
    SENT = 2


class Priority(enum.IntEnum):
    HIGH = 1


@dataclasses.dataclass(frozen=True)
class Invite:
    email: str
    n: int


def reproduced() -> list[Any]:
    """Results that came back wrong, or not at all (so the tool ran again), before."""
    return [
        {("ana@example.com", 1), ("bo@example.com", 2)},  # a set of tuples: 1 -> 2 -> 3 invitations sent
        frozenset({("x", 1), ("y", (2, 3))}),
        {TAG: "bytes", "v": "AA=="},  # user data shaped like a tag replayed as bytes
        {"data": {TAG: "datetime", "v": "not a tag, just data"}},
        {TAG: "set", "v": [[1, 2]]},
        {1: "a"},  # came back as {"1": "a"}
        {True: 1, None: 2},  # came back as {"true": 1, "null": 2}
        {1: "int", "1": "str"},  # came back as one key
        {(1, "a"): [1.5, -0.0], 2.5: None},
        Stage.SENT,  # came back as its value
        Priority.HIGH,
        (1, 2),  # came back as a list
        ("content", {"artifact": [1, 2]}),  # LangChain content_and_artifact
        {Invite("a@example.com", 1)},
        [Invite("b@example.com", 2), b"\x00", bytearray(b"\x01")],
        Receipt(id=uuid.UUID(int=9), total=decimal.Decimal("59.00"), tags=("refund",), payload={1: (2,)}),
        dt.datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=__import__("zoneinfo").ZoneInfo("Europe/Paris")),
        dt.timedelta(days=1, microseconds=1),
        decimal.Decimal("NaN"),
        [float("nan"), float("-inf")],
    ]


def _invite_tool(ledger: Ledger, runs: list[int], value: Any) -> Any:
    @replay_safe(ledger=ledger)
    def send_invites():  # type: ignore[no-untyped-def] # no annotation: the record alone says the types
        runs.append(1)
        return value

    return send_invites


def _async_invite_tool(ledger: Ledger, runs: list[int], value: Any) -> Any:
    @replay_safe(ledger=ledger)
    async def send_invites():  # type: ignore[no-untyped-def]
        runs.append(1)
        return value

    return send_invites


def test_reproduced_results_replay_exactly_on_every_ledger(ledger: Ledger) -> None:
    """Each reproduced case replays exactly from this ledger, and the tool runs once."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    for n, value in enumerate(reproduced()):
        runs: list[int] = []
        tool = _invite_tool(ledger, runs, value)
        with tool_call(thread, f"m{n}", "c"):
            assert tool() is value
        with tool_call(thread, f"m{n}", "c"):
            replayed = tool()
        assert runs == [1], f"case {n} ran again"
        assert_exact(replayed, value)


async def test_reproduced_results_replay_exactly_on_every_ledger_async(ledger: Ledger) -> None:
    """The same through an async tool."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    for n, value in enumerate(reproduced()):
        runs: list[int] = []
        send_invites = _async_invite_tool(ledger, runs, value)
        async with tool_call(thread, f"m{n}", "c"):
            assert await send_invites() is value
        async with tool_call(thread, f"m{n}", "c"):
            replayed = await send_invites()
        assert runs == [1], f"case {n} ran again"
        assert_exact(replayed, value)


def record_reproduced(url: str, thread: str) -> None:
    """Run in another process: record every reproduced case, then exit."""
    with replaysafe.open_ledger(url) as ledger:
        for n, value in enumerate(reproduced()):
            with tool_call(thread, f"m{n}", "c"):
                _invite_tool(ledger, [], value)()


def test_reproduced_results_replay_exactly_in_a_new_process(durable_ledger_url: str) -> None:
    """Recorded by one process, replayed by another: classes are found again by name."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    code = "import sys; from tests.ledgers.test_roundtrips import record_reproduced; record_reproduced(*sys.argv[1:])"
    subprocess.run([sys.executable, "-c", code, durable_ledger_url, thread], check=True, timeout=120)
    with replaysafe.open_ledger(durable_ledger_url) as ledger:
        for n, value in enumerate(reproduced()):
            runs: list[int] = []
            with tool_call(thread, f"m{n}", "c"):
                replayed = _invite_tool(ledger, runs, value)()
            assert runs == [], f"case {n} ran again"
            assert_exact(replayed, value)


@pytest.fixture
def wire(postgres_server_url: str) -> Iterator[PostgresWireCounter]:
    parts = urllib.parse.urlsplit(libpq_url(postgres_server_url))
    counter = PostgresWireCounter(parts.hostname or "127.0.0.1", parts.port or 5432)
    yield counter
    counter.close()


@pytest.fixture
def counted_postgres(postgres_url: str, wire: PostgresWireCounter) -> Iterator[PostgresLedger]:
    """A Postgres ledger whose every connection goes through the counting proxy."""
    parts = urllib.parse.urlsplit(postgres_url)
    netloc = f"{parts.username}@127.0.0.1:{wire.port}" if parts.username else f"127.0.0.1:{wire.port}"
    if parts.password:
        netloc = f"{parts.username}:{parts.password}@127.0.0.1:{wire.port}"
    query = dict(urllib.parse.parse_qsl(parts.query))
    schema = query.pop("schema")
    url = urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=urllib.parse.urlencode(query)))
    url = with_query(url, sslmode="disable", gssencmode="disable")  # the proxy reads plain messages
    with PostgresLedger(url, schema=schema) as ledger:
        yield ledger


class CountingConnection(redis.Connection):
    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


class CountingAsyncConnection(redis.asyncio.Connection):
    sent = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingAsyncConnection.sent += 1
        await super().send_packed_command(command, check_health)


def _redis_settings(redis_url: str) -> tuple[dict[str, Any], str]:
    parts = urllib.parse.urlsplit(redis_url)
    prefix = dict(urllib.parse.parse_qsl(parts.query))["prefix"]
    settings = {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 6379,
        "db": int(parts.path.strip("/") or 0),
        "username": parts.username,
        "password": parts.password,
    }
    return settings, prefix


def _tools(ledger: Any) -> tuple[Any, Any, list[str]]:
    runs: list[str] = []

    @replay_safe(ledger=ledger)
    def refund(order_id: str) -> dict[str, str]:
        runs.append(order_id)
        return {"refunded": order_id}

    @replay_safe(ledger=ledger)
    async def arefund(order_id: str) -> dict[str, str]:
        runs.append(order_id)
        return {"refunded": order_id}

    return refund, arefund, runs


def _sync_round_trips(ledger: Any, count: Any, reset: Any) -> tuple[int, int]:
    refund, _, runs = _tools(ledger)
    thread = f"t-{uuid.uuid4().hex[:8]}"
    for n in range(8):  # warm up: connections opened, scripts loaded, statements prepared
        with tool_call(thread, f"warm-{n}", "c"):
            refund(str(n))
        with tool_call(thread, f"warm-{n}", "c"):
            refund(str(n))
    reset()
    with tool_call(thread, "m", "c"):
        assert refund("42") == {"refunded": "42"}
    miss = count()
    reset()
    with tool_call(thread, "m", "c"):
        assert refund("42") == {"refunded": "42"}
    hit = count()
    assert runs.count("42") == 1
    return miss, hit


async def _async_round_trips(ledger: Any, count: Any, reset: Any) -> tuple[int, int]:
    _, arefund, runs = _tools(ledger)
    thread = f"t-{uuid.uuid4().hex[:8]}"
    for n in range(8):
        async with tool_call(thread, f"warm-{n}", "c"):
            await arefund(str(n))
        async with tool_call(thread, f"warm-{n}", "c"):
            await arefund(str(n))
    reset()
    async with tool_call(thread, "m", "c"):
        assert await arefund("42") == {"refunded": "42"}
    miss = count()
    reset()
    async with tool_call(thread, "m", "c"):
        assert await arefund("42") == {"refunded": "42"}
    hit = count()
    assert runs.count("42") == 1
    return miss, hit


def test_postgres_sync_miss_two_hit_one(counted_postgres: PostgresLedger, wire: PostgresWireCounter) -> None:
    """Postgres, sync: a first call is 2 round trips on the wire, a replay 1."""
    assert _sync_round_trips(counted_postgres, lambda: wire.round_trips, wire.reset) == (2, 1)


async def test_postgres_async_miss_two_hit_one(counted_postgres: PostgresLedger, wire: PostgresWireCounter) -> None:
    """Postgres, async: a first call is 2 round trips on the wire, a replay 1."""
    assert await _async_round_trips(counted_postgres, lambda: wire.round_trips, wire.reset) == (2, 1)
    await counted_postgres.aclose()


def test_postgres_get_many_is_one_round_trip(counted_postgres: PostgresLedger, wire: PostgresWireCounter) -> None:
    """get_many of many keys reads them in one round trip."""
    refund, _, _ = _tools(counted_postgres)
    thread = f"t-{uuid.uuid4().hex[:8]}"
    for n in range(10):
        with tool_call(thread, f"m{n}", "c"):
            refund(str(n))
    keys = [r.key for r in counted_postgres.records(thread_id=thread)]
    wire.reset()
    assert set(counted_postgres.get_many(keys)) == set(keys)
    assert wire.round_trips == 1


def test_redis_sync_miss_two_hit_one(redis_url: str) -> None:
    """Redis, sync: a first call sends 2 requests, a replay 1."""
    settings, prefix = _redis_settings(redis_url)
    client = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=CountingConnection, **settings))
    with RedisLedger(client, prefix=prefix) as ledger:

        def reset() -> None:
            CountingConnection.sent = 0

        assert _sync_round_trips(ledger, lambda: CountingConnection.sent, reset) == (2, 1)
    client.close()


async def test_redis_async_miss_two_hit_one(redis_url: str) -> None:
    """Redis, async: a first call sends 2 requests, a replay 1."""
    settings, prefix = _redis_settings(redis_url)
    pool = redis.asyncio.ConnectionPool(connection_class=CountingAsyncConnection, **settings)
    client = redis.asyncio.Redis(connection_pool=pool)
    async with RedisLedger(client, prefix=prefix) as ledger:

        def reset() -> None:
            CountingAsyncConnection.sent = 0

        assert await _async_round_trips(ledger, lambda: CountingAsyncConnection.sent, reset) == (2, 1)
    await client.aclose(close_connection_pool=True)


def test_redis_get_many_is_one_round_trip(redis_url: str) -> None:
    """get_many of many keys is one pipelined request."""
    settings, prefix = _redis_settings(redis_url)
    client = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=CountingConnection, **settings))
    with RedisLedger(client, prefix=prefix) as ledger:
        refund, _, _ = _tools(ledger)
        thread = f"t-{uuid.uuid4().hex[:8]}"
        for n in range(10):
            with tool_call(thread, f"m{n}", "c"):
                refund(str(n))
        keys = [r.key for r in ledger.records(thread_id=thread)]
        CountingConnection.sent = 0
        assert set(ledger.get_many(keys)) == set(keys)
        assert CountingConnection.sent == 1
    client.close()
