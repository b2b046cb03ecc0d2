"""Section 5: replay (hit) latency as the ledger grows, and the memory ledger's bytes per record.

For each ledger, one store per size (10^3, 10^5 and 10^6 records; fewer
with ``--quick``) exists at once, bulk-loaded with the raw client from one real
record (same tool, arguments and result, other keys; the memory ledger's dict filled
in the process). Every round replays a block of
randomly chosen loaded calls in each store, and reads the same rows with the raw
client (the floor), so the sizes are compared within a round.
"""

from __future__ import annotations

import gc
import random
import sqlite3
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from psycopg import sql

from replaysafe import CallKey, Ledger, MemoryLedger, PostgresLedger, RedisLedger, SqliteLedger, tool_call

from . import _subjects as subjects
from ._env import Scratch, delete_prefix
from ._stats import Block, micros, paired_rounds, ratios, summary
from .settings import Settings

#: Loaded calls are keyed ("s<n // 10>", "m<n>", "c"): ten calls per thread.
SEED = CallKey("seed", "m", "c")


def loaded_key(n: int) -> CallKey:
    return CallKey(f"s{n // 10}", f"m{n}", "c")


class Store:
    """One ledger holding ``size`` records, and its raw floor read."""

    def __init__(
        self, size: int, ledger: Ledger, floor_read: Callable[[CallKey], Any], drop: Callable[[], Any]
    ) -> None:
        self.size = size
        self.ledger = ledger
        self.tools = subjects.Tools(ledger)
        self.floor_read = floor_read
        self._drop = drop

    def drop(self) -> None:
        """Close the ledger and the raw client, and delete the loaded records now (not only at the run's end)."""
        self.ledger.close()
        self._drop()

    def seed(self) -> None:
        with tool_call(*SEED):
            self.tools.sync(subjects.ORDER_ID)

    def check(self) -> None:
        """The last loaded record replays (so the load wrote real records, keyed as the ledger keys them)."""
        runs = self.tools.runs
        with tool_call(*loaded_key(self.size - 1)):
            self.tools.sync(subjects.ORDER_ID)
        if self.tools.runs != runs:
            raise RuntimeError(f"bulk-loaded records of {self.ledger!r} are not found by the ledger")


# --- bulk loads with the raw clients -----------------------------------------------------


def _load_sqlite(store: Store, path: Any) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        row = conn.execute(
            "SELECT tool_name, args_digest, status, result, owner, attempt, created_at, updated_at, "
            "lease_expires_at FROM tool_executions WHERE call_key = ?",
            (subjects.key_digest(*SEED),),
        ).fetchone()
        rows = ((subjects.key_digest(*loaded_key(n)), *loaded_key(n), *row) for n in range(store.size))
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO tool_executions (call_key, thread_id, message_id, tool_call_id, tool_name, args_digest, "
            "status, result, owner, attempt, created_at, updated_at, lease_expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _load_postgres(store: Store, scratch: Scratch, table: str) -> None:
    """``INSERT ... SELECT`` from ``generate_series``: keys hashed by the server like ``key_digest``."""
    target = sql.Identifier(scratch.schema, table)
    statement = sql.SQL(
        """
        INSERT INTO {target} (call_key, thread_id, message_id, tool_call_id, tool_name, args_digest, status, result,
            owner, attempt, created_at, updated_at, lease_expires_at, expires_at)
        SELECT encode(sha256(convert_to('["s' || (g / 10) || '","m' || g || '","c"]', 'UTF8')), 'hex'),
            's' || (g / 10), 'm' || g, 'c', seed.tool_name, seed.args_digest, seed.status, seed.result,
            seed.owner, seed.attempt, seed.created_at, seed.updated_at, seed.lease_expires_at, NULL
        FROM generate_series(%(start)s::bigint, %(stop)s::bigint - 1) AS g,
            (SELECT * FROM {target} WHERE call_key = %(seed)s) AS seed
        """
    ).format(target=target)
    with scratch.postgres_connect() as conn:
        step = 200_000
        for start in range(0, store.size, step):
            conn.execute(
                statement, {"start": start, "stop": min(start + step, store.size), "seed": subjects.key_digest(*SEED)}
            )
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(target))


# KEYS: none (standalone Redis). ARGV: prefix, start, stop, then the seed record's packed value.
_REDIS_LOAD = """
local prefix, start, stop, value = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
for g = start, stop - 1 do
    local index = prefix .. ':{s' .. math.floor(g / 10) .. '}'
    local key = index .. ':m' .. g .. ':c'
    redis.call('SET', key, value)
    redis.call('ZADD', index, '+inf', key)
end
return stop - start
"""


def _load_redis(store: Store, client: redis.Redis, prefix: str) -> None:
    """A server-side loop copying the seed record's value to the loaded keys, in batches."""
    value = client.get(f"{prefix}:{{{SEED.thread_id}}}:{SEED.message_id}:{SEED.tool_call_id}")
    if value is None:
        raise RuntimeError(f"the seed record of {prefix!r} was not written by the ledger")
    load = client.register_script(_REDIS_LOAD)
    step = 20_000
    for start in range(0, store.size, step):
        load(args=[prefix, start, min(start + step, store.size), value])


# --- the measurement -----------------------------------------------------------------------


def _blocks(store: Store, label: str, calls: int) -> dict[str, Block]:
    chooser = random.Random(store.size)

    def keys(r: int) -> list[CallKey]:
        return [loaded_key(chooser.randrange(store.size)) for _ in range(calls)]

    def ours(r: int) -> float:
        chosen = keys(r)
        start = time.perf_counter()
        for key in chosen:
            with tool_call(*key):
                store.tools.sync(subjects.ORDER_ID)
        return time.perf_counter() - start

    def floor(r: int) -> float:
        chosen = keys(r)
        start = time.perf_counter()
        for key in chosen:
            store.floor_read(key)
        return time.perf_counter() - start

    return {f"{label}.ours": ours, f"{label}.floor": floor}


def _measure(name: str, stores: list[Store], settings: Settings) -> dict[str, Any]:
    blocks: dict[str, Block] = {}
    for store in stores:
        blocks.update(_blocks(store, str(store.size), settings.block))
    per_call = paired_rounds(blocks, rounds=settings.scale_rounds, calls=settings.block, warmup=settings.warmup)
    smallest = str(stores[0].size)
    sizes: dict[str, Any] = {}
    for store in stores:
        size = str(store.size)
        sizes[size] = {
            "ours_hit_us": micros(per_call[f"{size}.ours"]),
            "floor_hit_us": micros(per_call[f"{size}.floor"]),
            "ours_vs_floor": summary(ratios(per_call, f"{size}.ours", f"{size}.floor")),
            "vs_smallest": summary(ratios(per_call, f"{size}.ours", f"{smallest}.ours")),
        }
    return {"rounds": settings.scale_rounds, "sizes": sizes}


def _memory(settings: Settings, scratch: Scratch) -> list[Store]:
    """Loaded in the process: the seed record copied under each loaded key into the ledger's dict (its
    raw store), one record object per key, as a server holds one copy per key. The floor is ``get``."""
    stores = []
    gc.disable()  # a million new tuples would trigger full collections over the ones made before
    try:
        for size in settings.scale_sizes:
            ledger = MemoryLedger()
            store = Store(size, ledger, ledger.get, gc.unfreeze)
            store.seed()
            held = ledger._records
            record, rest = type(held[SEED]), held[SEED][1:]
            held.update((key, record(key, *rest)) for key in map(loaded_key, range(size)))
            stores.append(store)
    finally:
        gc.enable()
    # Out of the collector's sight while measured: a server's records are not walked by this process's
    # collector either (the records are still freed when the stores are dropped).
    gc.freeze()
    return stores


def _sqlite(settings: Settings, scratch: Scratch) -> list[Store]:
    stores = []
    for size in settings.scale_sizes:
        path = scratch.directory / f"scale-{size}.db"
        ledger = SqliteLedger(path)
        reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        select = "SELECT tool_name, args_digest, status, result, owner FROM tool_executions WHERE call_key = ?"

        def read(key: CallKey, reader: sqlite3.Connection = reader, select: str = select) -> Any:
            return reader.execute(select, (subjects.key_digest(*key),)).fetchone()

        def drop(reader: sqlite3.Connection = reader, path: Path = path) -> None:
            reader.close()
            for suffix in ("", "-wal", "-shm"):
                path.with_name(path.name + suffix).unlink(missing_ok=True)

        store = Store(size, ledger, read, drop)
        store.seed()
        _load_sqlite(store, path)
        stores.append(store)
    return stores


def _postgres(settings: Settings, scratch: Scratch) -> list[Store]:
    assert scratch.postgres_url is not None
    stores = []
    for size in settings.scale_sizes:
        table = f"scale_{size}"
        ledger = PostgresLedger(scratch.postgres_url, schema=scratch.schema, table=table)
        reader = scratch.postgres_connect()
        # A plain string, rendered once: a sql.Composed would be rendered again on every execute.
        select = (
            sql.SQL("SELECT tool_name, args_digest, status, result, owner FROM {} WHERE call_key = %s")
            .format(sql.Identifier(scratch.schema, table))
            .as_string(reader)
        )

        def read(key: CallKey, reader: Any = reader, select: Any = select) -> Any:
            return reader.execute(select, (subjects.key_digest(*key),)).fetchone()

        def drop(reader: Any = reader, table: str = table) -> None:
            reader.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(scratch.schema, table)))
            reader.close()

        store = Store(size, ledger, read, drop)
        store.seed()
        _load_postgres(store, scratch, table)
        stores.append(store)
    return stores


def _redis(settings: Settings, scratch: Scratch) -> list[Store]:
    stores: list[Store] = []
    client = scratch.redis_client()
    for size in settings.scale_sizes:
        prefix = f"{scratch.prefix}:scale{size}"
        ledger = RedisLedger(client, prefix=prefix)

        def read(key: CallKey, prefix: str = prefix) -> Any:
            return client.get(f"{prefix}:{{{key.thread_id}}}:{key.message_id}:{key.tool_call_id}")

        def drop(prefix: str = prefix, last: bool = size == settings.scale_sizes[-1]) -> None:
            delete_prefix(client, f"{prefix}:")
            if last:
                client.close()

        store = Store(size, ledger, read, drop)
        store.seed()
        _load_redis(store, client, prefix)
        stores.append(store)
    return stores


def memory_bytes_per_record(records: int) -> dict[str, Any]:
    """Bytes the memory ledger holds per recorded call (tracemalloc), for ``records`` recorded calls."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ledger = MemoryLedger()
        tools = subjects.Tools(ledger)
        for n in range(records):
            with tool_call(f"thread-{n // 10}", f"msg_{n:08d}", f"call_{n % 10}"):
                tools.sync(subjects.ORDER_ID)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_record = held / records
    del ledger
    return {
        "records": records,
        "bytes_per_record": round(per_record, 1),
        "call": "ids like ('thread-123', 'msg_00001234', 'call_4'), result {'refunded': '42'}",
    }


def run(settings: Settings, scratch: Scratch, log: Callable[[str], None]) -> dict[str, Any]:
    results: dict[str, Any] = {"sizes": list(settings.scale_sizes)}
    builders: list[tuple[str, Callable[[Settings, Scratch], list[Store]], bool]] = [
        ("memory", _memory, True),
        ("sqlite", _sqlite, True),
        ("postgres", _postgres, scratch.postgres_url is not None),
        ("redis", _redis, scratch.redis_url is not None),
    ]
    for name, build, available in builders:
        if not available:
            results[name] = {"skipped": f"no {name} server answered"}
            continue
        log(f"scale: {name} (loading {sum(settings.scale_sizes):,} records)")
        started = time.perf_counter()
        stores = build(settings, scratch)
        try:
            for store in stores:
                store.check()
            load_seconds = time.perf_counter() - started
            results[name] = _measure(name, stores, settings)
            results[name]["load_seconds"] = round(load_seconds, 1)
        finally:
            for store in stores:
                store.drop()
    log("scale: memory ledger footprint")
    results["memory_footprint"] = memory_bytes_per_record(settings.memory_records)
    return results
