"""The Redis ledger on a real Redis Cluster: six local nodes (three primaries with a replica each).

The whole contract suite runs here again, on the cluster (its ``ledger`` fixture opens
``?cluster=true`` URLs below), and the tests after it prove what only a cluster can show:
a thread's keys share one slot, while threads spread over the primaries, and the thread
index, ``records()``, ``get_many()`` and ``purge_thread()`` work across them, sync and
async, given a URL or a ``RedisCluster`` client of either flavour.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
import redis.asyncio.cluster
import redis.cluster

from replaysafe import CallKey, RedisLedger, Status, open_ledger, tool_call

from ..servers import RedisClusterNodes, with_query
from .test_contract import *  # noqa: F403 - the contract suite, collected again for the cluster
from .test_contract import LEASE, NOW
from .test_roundtrips import _tools


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    """A Redis Cluster of six nodes on free ports, started for this module and shut down after it."""
    nodes = RedisClusterNodes()
    try:
        nodes.start()
        yield nodes.url
    finally:
        nodes.destroy()


@pytest.fixture
def ledger_url(cluster_url: str) -> str:
    """The contract suite's ledger: the Redis ledger on the cluster, with a prefix of this test's own."""
    return with_query(cluster_url, prefix=f"rs-test-{uuid.uuid4().hex[:12]}", cluster="true")


@pytest.fixture
def durable_ledger_url(ledger_url: str) -> str:
    return ledger_url


def _threads_on_every_primary(client: redis.cluster.RedisCluster, ledger: RedisLedger) -> list[str]:
    """Thread ids whose keys live on different primaries, at least one per primary."""
    primaries = {node.name for node in client.get_primaries()}
    chosen: dict[str, str] = {}
    for n in range(1000):
        thread = f"thread-{n}"
        node = client.get_node_from_key(ledger._ops.index(thread))
        assert node is not None
        chosen.setdefault(node.name, thread)
        if set(chosen) == primaries:
            return sorted(chosen.values())
    raise AssertionError("no thread id found for every primary")


def _close_cluster_client(client: redis.cluster.RedisCluster) -> None:
    """Close a test's own sync cluster client: RedisCluster.close() leaves the nodes' pools open (redis-py 8)."""
    for node in client.get_nodes():
        if node.redis_connection is not None:
            node.redis_connection.connection_pool.disconnect()
    client.close()


def claim(ledger: RedisLedger, key: CallKey, owner: str = "o#1") -> bool:
    return ledger.claim(key, tool_name="t", args_digest="d", owner=owner, now=NOW, lease_expires_at=LEASE).claimed


def test_a_thread_is_one_slot_and_threads_spread_over_the_primaries(ledger_url: str) -> None:
    """Each thread's record keys and index hash to one slot; the index, records() and purge work across nodes."""
    with RedisLedger(ledger_url) as ledger:
        client = ledger.client
        assert isinstance(client, redis.cluster.RedisCluster)
        threads = _threads_on_every_primary(client, ledger)
        assert len(threads) == 3
        keys = [CallKey(t, f"m:{n}", f"c{{{n}}}") for t in [*threads, "a:{b}*"] for n in range(3)]
        for key in keys:
            record_key, index_key = ledger._ops.keys(key)
            assert client.keyslot(record_key) == client.keyslot(index_key)
            assert claim(ledger, key)
            assert ledger.complete(key, owner="o#1", status=Status.COMPLETED, result='"ok"', now=NOW)
        assert ledger.get_many(keys) == {key: ledger.get(key) for key in keys}  # one pipeline over three nodes
        assert {r.key for r in ledger.records()} == set(keys)  # scanned on every primary
        for thread in threads:
            mine = {k for k in keys if k.thread_id == thread}
            assert {r.key for r in ledger.records(thread_id=thread)} == mine
            assert ledger.purge_thread(thread) == len(mine)
            assert all(ledger.get(k) is None for k in mine)
            assert list(ledger.records(thread_id=thread)) == []
        assert {r.key for r in ledger.records()} == {k for k in keys if k.thread_id == "a:{b}*"}
        assert ledger.purge_thread("a:{b}*") == 3
        assert list(client.scan_iter(match=f"{ledger.prefix}:*")) == []  # no index left behind


def test_a_purge_larger_than_a_batch(ledger_url: str) -> None:
    """purge_thread deletes in batches of one slot each until the thread's index is empty."""
    with RedisLedger(ledger_url) as ledger:
        keys = [CallKey("big", "m", f"c{n}") for n in range(1203)]
        for key in keys:
            assert claim(ledger, key)
        assert len(list(ledger.records(thread_id="big"))) == len(keys)
        assert ledger.purge_thread("big") == len(keys)
        assert ledger.get_many(keys) == {}


async def test_async_on_a_cluster_client_of_each_flavour(ledger_url: str) -> None:
    """Given an asyncio RedisCluster, .aio uses it and the sync side connects alike; the reverse for a sync one."""
    url, _, _ = ledger_url.partition("?")
    prefix = f"rs-test-{uuid.uuid4().hex[:12]}"
    given_async = redis.asyncio.cluster.RedisCluster.from_url(url, socket_timeout=5)
    given_sync = redis.cluster.RedisCluster.from_url(url, socket_timeout=5)
    try:
        for given in (given_async, given_sync):
            async with RedisLedger(given, prefix=prefix) as ledger:
                assert ledger.cluster
                key = CallKey(f"t-{type(given).__module__}", "m", "c")
                found = await ledger.aio.claim(
                    key, tool_name="t", args_digest="d", owner="a", now=NOW, lease_expires_at=LEASE
                )
                assert found.claimed
                assert not await ledger.aio.complete(key, owner="b", status=Status.COMPLETED, result="1", now=NOW)
                assert await ledger.aio.renew(key, owner="a", lease_expires_at=LEASE)
                assert await ledger.aio.complete(key, owner="a", status=Status.COMPLETED, result="1", now=NOW)
                stored = ledger.get(key)  # the sync side, on its own connections
                assert stored is not None and stored.result == "1"
                assert await ledger.aio.get_many([key, CallKey("elsewhere", "m", "c")]) == {key: stored}
                taken = await ledger.aio.takeover(stored, owner="b", now=NOW, lease_expires_at=LEASE)
                assert taken is not None and taken.attempt == 2
                assert await ledger.aio.release(key, owner="b")
                assert await ledger.aio.get(key) is None
                assert ledger.purge_thread(key.thread_id) == 0
        assert await given_async.ping()
        assert given_sync.ping()
    finally:
        await given_async.aclose()
        _close_cluster_client(given_sync)


def test_a_protected_tool_runs_once_on_the_cluster(ledger_url: str) -> None:
    """@replay_safe on the cluster: the first call runs, the replay returns its result, in sync and async."""
    with open_ledger(ledger_url) as ledger:
        refund, arefund, runs = _tools(ledger)
        for thread in ("t1", "t2", "t3"):
            with tool_call(thread, "m", "c"):
                assert refund("42") == {"refunded": "42"}
            with tool_call(thread, "m", "c"):
                assert refund("42") == {"refunded": "42"}
        assert runs == ["42"] * 3

        async def twice() -> None:
            for _ in range(2):
                with tool_call("async-thread", "m", "c"):
                    assert await arefund("7") == {"refunded": "7"}

        asyncio.run(twice())
        assert runs == ["42"] * 3 + ["7"]
        ledger.check()


def _connections_named(url: str, name: str) -> int:
    """How many connections named ``name`` the nodes of the cluster at ``url`` have open (the probe's own aside)."""
    probe = redis.cluster.RedisCluster.from_url(url.partition("?")[0])
    try:
        per_node = probe.client_list(target_nodes=redis.cluster.RedisCluster.ALL_NODES)
        return sum(1 for entries in per_node.values() for entry in entries if entry["name"] == name)
    finally:
        _close_cluster_client(probe)


def _no_connection_named(url: str, name: str) -> bool:
    """Whether the nodes have closed every connection named ``name`` within 2 s (a node sees a close a little later)."""
    deadline = time.monotonic() + 2
    while _connections_named(url, name) and time.monotonic() < deadline:
        time.sleep(0.02)
    return _connections_named(url, name) == 0


def test_close_closes_the_connections_to_every_node(ledger_url: str) -> None:
    """A ledger that opened its cluster client closes every node's connections, scripts loaded on all."""
    name = f"rs-close-{uuid.uuid4().hex[:8]}"
    url = with_query(ledger_url, client_name=name)
    with RedisLedger(url) as ledger:
        for n in range(12):  # keys on every primary; the first claim loads the scripts on each
            assert claim(ledger, CallKey(f"thread-{n}", "m", "c"))
        assert _connections_named(url, name) >= 3
    assert _no_connection_named(url, name)


async def test_aclose_closes_the_async_connections_to_every_node(ledger_url: str) -> None:
    """The same for the connections ``.aio`` opened in this event loop."""
    name = f"rs-aclose-{uuid.uuid4().hex[:8]}"
    url = with_query(ledger_url, client_name=name)
    async with RedisLedger(url) as ledger:
        for n in range(12):
            key = CallKey(f"thread-{n}", "m", "c")
            found = await ledger.aio.claim(
                key, tool_name="t", args_digest="d", owner="o", now=NOW, lease_expires_at=LEASE
            )
            assert found.claimed
        assert _connections_named(url, name) >= 3
    assert _no_connection_named(url, name)
