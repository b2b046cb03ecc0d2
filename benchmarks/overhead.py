"""Sections 1-3: the cost of one protected call against the raw floor and against Powertools.

Per ledger, every configuration (ours, floor and alternative; sync and async; miss
and hit) runs one block of calls in every round, so the ratios are taken between
blocks timed moments apart. A miss is a first execution (a fresh key every call),
a hit a replay of a recorded call.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import redis

from replaysafe import (
    Ledger,
    MemoryLedger,
    PostgresLedger,
    RedisLedger,
    SqliteLedger,
    TieredLedger,
    replay_safe,
    tool_call,
)

from . import _subjects as subjects
from ._env import Scratch, libpq_url
from ._stats import Block, differences, excess_ratios, micros, paired_rounds, ratios, summary
from ._straight import straight
from ._wire import relayed
from .settings import Settings

THREAD = "t"


@dataclass
class Group:
    """One ledger's configurations, run in paired rounds."""

    ledger: str
    blocks: dict[str, Block]
    rounds: int
    #: (label, numerator, denominator) ratios to report, per round.
    compare: list[tuple[str, str, str]]
    closers: list[Callable[[], None]]
    notes: list[str]
    round_trips: dict[str, int] | None = None
    #: The library's CPU (memory ledger): configuration -> the bare call it is taken over, per round.
    library_cpu: dict[str, str] | None = None


def _miss_ids(r: int, calls: int, tag: str) -> list[tuple[str, str, str]]:
    return [(THREAD, f"{tag}{r}-{i}", "c") for i in range(calls)]


def _hit_ids(calls: int, tag: str) -> list[tuple[str, str, str]]:
    return [(THREAD, f"{tag}hit-{i}", "c") for i in range(calls)]


def ours_sync(tool: Callable[[str], Any], ids: Callable[[int], list[tuple[str, str, str]]]) -> Block:
    def block(r: int) -> float:
        keys = ids(r)
        start = time.perf_counter()
        for thread_id, message_id, tool_call_id in keys:
            with tool_call(thread_id, message_id, tool_call_id):
                tool(subjects.ORDER_ID)
        return time.perf_counter() - start

    return block


def ours_async(
    loop: asyncio.AbstractEventLoop, tool: Callable[[str], Any], ids: Callable[[int], list[tuple[str, str, str]]]
) -> Block:
    async def run(r: int) -> float:
        keys = ids(r)
        start = time.perf_counter()
        for thread_id, message_id, tool_call_id in keys:
            async with tool_call(thread_id, message_id, tool_call_id):
                await tool(subjects.ORDER_ID)
        return time.perf_counter() - start

    return lambda r: loop.run_until_complete(run(r))


def raw_sync(operation: Callable[[str], Any], names: Callable[[int], list[str]]) -> Block:
    def block(r: int) -> float:
        keys = names(r)
        start = time.perf_counter()
        for name in keys:
            operation(name)
        return time.perf_counter() - start

    return block


def raw_async(
    loop: asyncio.AbstractEventLoop,
    operation: Callable[[str], Coroutine[Any, Any, Any]],
    names: Callable[[int], list[str]],
) -> Block:
    async def run(r: int) -> float:
        keys = names(r)
        start = time.perf_counter()
        for name in keys:
            await operation(name)
        return time.perf_counter() - start

    return lambda r: loop.run_until_complete(run(r))


def bare_sync(calls: int) -> Block:
    def block(r: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            subjects.refund_body(subjects.ORDER_ID)
        return time.perf_counter() - start

    return block


def bare_async(loop: asyncio.AbstractEventLoop, calls: int) -> Block:
    async def run() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            await subjects.arefund_body(subjects.ORDER_ID)
        return time.perf_counter() - start

    return lambda r: loop.run_until_complete(run())


def json_reference(calls: int) -> Block:
    """The machine's speed in the same rounds: ``json.loads(json.dumps(result))`` of the tool's small dict."""
    result = subjects.refund_body(subjects.ORDER_ID)

    def block(r: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            json.loads(json.dumps(result))
        return time.perf_counter() - start

    return block


def powertools_block(alternative: subjects.Powertools, ids: Callable[[int], list[tuple[str, str, str]]]) -> Block:
    def block(r: int) -> float:
        keys = ids(r)
        start = time.perf_counter()
        for thread_id, message_id, tool_call_id in keys:
            alternative(thread_id, message_id, tool_call_id)
        return time.perf_counter() - start

    return block


def _record(tools: subjects.Tools, keys: list[tuple[str, str, str]]) -> None:
    """Record calls (a first execution each), so that later calls of these keys are hits."""
    for thread_id, message_id, tool_call_id in keys:
        with tool_call(thread_id, message_id, tool_call_id):
            tools.sync(subjects.ORDER_ID)


def _ours(group: dict[str, Block], ledger: Ledger, loop: asyncio.AbstractEventLoop, calls: int) -> subjects.Tools:
    """Our four configurations on ``ledger``; the hit keys are recorded first."""
    tools = subjects.Tools(ledger)
    _record(tools, _hit_ids(calls, "s"))
    for thread_id, message_id, tool_call_id in _hit_ids(calls, "a"):

        async def first(t: str = thread_id, m: str = message_id, c: str = tool_call_id) -> None:
            async with tool_call(t, m, c):
                await tools.aio(subjects.ORDER_ID)

        loop.run_until_complete(first())
    group["ours.sync.miss"] = ours_sync(tools.sync, lambda r: _miss_ids(r, calls, "s"))
    group["ours.sync.hit"] = ours_sync(tools.sync, lambda r: _hit_ids(calls, "s"))
    group["ours.async.miss"] = ours_async(loop, tools.aio, lambda r: _miss_ids(r, calls, "a"))
    group["ours.async.hit"] = ours_async(loop, tools.aio, lambda r: _hit_ids(calls, "a"))
    return tools


def floor_then_memory_call(
    floor_op: Callable[[str], Any],
    names: Callable[[int], list[str]],
    keys: Callable[[int], list[tuple[str, str, str]]],
    tools: subjects.Tools,
) -> Block:
    """The floor's operation, each followed by the same kind of call on the memory ledger: the
    library's own work as it runs right after the round trips (context for the ledgers' ratios)."""

    def block(r: int) -> float:
        pairs = list(zip(names(r), keys(r), strict=True))
        start = time.perf_counter()
        for name, (thread_id, message_id, tool_call_id) in pairs:
            floor_op(name)
            with tool_call(thread_id, message_id, tool_call_id):
                tools.sync(subjects.ORDER_ID)
        return time.perf_counter() - start

    return block


def _after_round_trips(
    group: dict[str, Block], floor: subjects.Floor, calls: int, name: Callable[[str], str], hit_names: list[str]
) -> None:
    """``floor-then-memory.sync.{miss,hit}``: the floor's sync miss (hit, of ``hit_names``, its
    recorded keys), each followed by a first call (a replay) on the memory ledger."""
    tools = subjects.Tools(MemoryLedger())
    hits = _hit_ids(calls, "m")
    _record(tools, hits)
    group["floor-then-memory.sync.miss"] = floor_then_memory_call(
        floor.miss, lambda r: [name(f"m{r}-{i}") for i in range(calls)], lambda r: _miss_ids(r, calls, "m"), tools
    )
    group["floor-then-memory.sync.hit"] = floor_then_memory_call(floor.hit, lambda r: hit_names, lambda r: hits, tools)


#: Context: the floor plus the same call on the memory ledger after it, against the floor alone.
_AFTER_ROUND_TRIPS = [
    (f"context.memory_call_after_round_trips.sync.{kind}", f"floor-then-memory.sync.{kind}", f"floor.sync.{kind}")
    for kind in ("miss", "hit")
]


def _floor(
    group: dict[str, Block],
    floor: subjects.Floor,
    loop: asyncio.AbstractEventLoop,
    calls: int,
    name: Callable[[str], str],
) -> list[str]:
    """The floor's four configurations; its hit records are written first. Returns the sync hits' keys."""
    sync_hits = [name(f"shit-{i}") for i in range(calls)]
    async_hits = [name(f"ahit-{i}") for i in range(calls)]
    for key in sync_hits + async_hits:
        floor.miss(key)
    group["floor.sync.miss"] = raw_sync(floor.miss, lambda r: [name(f"s{r}-{i}") for i in range(calls)])
    group["floor.sync.hit"] = raw_sync(floor.hit, lambda r: sync_hits)
    group["floor.async.miss"] = raw_async(loop, floor.amiss, lambda r: [name(f"a{r}-{i}") for i in range(calls)])
    group["floor.async.hit"] = raw_async(loop, floor.ahit, lambda r: async_hits)
    return sync_hits


_OURS_VS_FLOOR = [
    (f"{mode}.{kind}", f"ours.{mode}.{kind}", f"floor.{mode}.{kind}")
    for mode in ("sync", "async")
    for kind in ("miss", "hit")
]


def in_a_thread(block: Block) -> Block:
    """``block`` run from a thread other than the main one (where no signal timer can be used)."""

    def threaded(r: int) -> float:
        elapsed: list[float] = []
        worker = threading.Thread(target=lambda: elapsed.append(block(r)))
        worker.start()
        worker.join()
        return elapsed[0]

    return threaded


def _timeout_mechanisms(blocks: dict[str, Block], ledger: Ledger, calls: int) -> list[tuple[str, str, str]]:
    """What a timeout costs a first call over ``timeout=None``, in the main thread and in another: the
    default one (kept by the lease, the tool runs in the caller's thread) and an explicit one (a hard
    deadline: the SIGALRM timer in the main thread, the worker-thread hand-off in another)."""
    tools = {
        "none": replay_safe(ledger=ledger, timeout=None, name="untimed")(subjects.refund_body),
        "default": replay_safe(ledger=ledger, name="default")(subjects.refund_body),
        "explicit": replay_safe(ledger=ledger, timeout=300, name="timed")(subjects.refund_body),
    }
    for timeout, tool in tools.items():
        for where in ("main", "thread"):
            tag = f"t{where[0]}{timeout}"
            block = ours_sync(tool, functools.partial(_miss_ids, calls=calls, tag=tag))
            blocks[f"timeout.{timeout}.{where}.miss"] = block if where == "main" else in_a_thread(block)
    return [
        (f"timeout.{timeout}.{where}", f"timeout.{timeout}.{where}.miss", f"timeout.none.{where}.miss")
        for timeout in ("default", "explicit")
        for where in ("main", "thread")
    ]


def _counting_refund() -> Callable[[str], dict[str, str]]:
    """The tool body ``subjects.Tools`` protects: it counts its runs too."""
    runs = [0]

    def refund(order_id: str) -> dict[str, str]:
        runs[0] += 1
        return {"refunded": order_id}

    return refund


def memory_group(settings: Settings, scratch: Scratch, loop: asyncio.AbstractEventLoop) -> Group:
    calls = settings.block
    blocks: dict[str, Block] = {}
    ledger = MemoryLedger()
    _ours(blocks, ledger, loop, calls)
    blocks["floor.sync"] = bare_sync(calls)
    blocks["floor.async"] = bare_async(loop, calls)
    blocks["reference.json"] = json_reference(calls)
    compare = [
        (f"{mode}.{kind}", f"ours.{mode}.{kind}", f"floor.{mode}")
        for mode in ("sync", "async")
        for kind in ("miss", "hit")
    ]
    compare += _timeout_mechanisms(blocks, ledger, calls)
    # Context: the same common path written straight, on a memory ledger of its own. It holds fewer records
    # than ours', which the timeout blocks fill too; a review measured about 0.2 us more per first call with
    # 100k more records.
    written_straight = straight(MemoryLedger(), _counting_refund(), "refund")
    for thread_id, message_id, tool_call_id in _hit_ids(calls, "x"):
        with tool_call(thread_id, message_id, tool_call_id):
            written_straight(subjects.ORDER_ID)
    blocks["straight.sync.miss"] = ours_sync(written_straight, lambda r: _miss_ids(r, calls, "x"))
    blocks["straight.sync.hit"] = ours_sync(written_straight, lambda r: _hit_ids(calls, "x"))
    closers: list[Callable[[], None]] = []
    notes: list[str] = []
    if subjects.powertools_available():
        alternative = subjects.Powertools("dict")
        for key in _hit_ids(calls, "p"):
            alternative(*key)
        blocks["powertools.sync.miss"] = powertools_block(alternative, lambda r: _miss_ids(r, calls, "p"))
        blocks["powertools.sync.hit"] = powertools_block(alternative, lambda r: _hit_ids(calls, "p"))
        compare += [
            (f"vs-powertools.{kind}", f"ours.sync.{kind}", f"powertools.sync.{kind}") for kind in ("miss", "hit")
        ]
        if scratch.redis_url is not None:
            cached = subjects.Powertools(
                "redis+local-cache",
                client=scratch.redis_client(decode_responses=True),
                key_prefix=f"{scratch.prefix}-ptc",
            )
            for key in _hit_ids(calls, "c"):
                cached(*key)
            blocks["powertools-local-cache.sync.hit"] = powertools_block(cached, lambda r: _hit_ids(calls, "c"))
            compare.append(("vs-powertools-local-cache.hit", "ours.sync.hit", "powertools-local-cache.sync.hit"))
            closers.append(cached.close)
    else:
        notes.append("aws-lambda-powertools is not installed (pip install -e '.[bench]'): no alternative measured")
    cpu = {
        config: f"floor.{config.split('.')[-2]}"
        for config in blocks
        if config.startswith(("ours.", "straight.", "powertools"))
    }
    return Group("memory", blocks, settings.memory_rounds, compare, closers, notes, library_cpu=cpu)


def sqlite_group(settings: Settings, scratch: Scratch, loop: asyncio.AbstractEventLoop) -> Group:
    calls = settings.block
    blocks: dict[str, Block] = {}
    path = scratch.directory / "overhead.db"
    ledger = SqliteLedger(path)
    _ours(blocks, ledger, loop, calls)
    floor_path = scratch.directory / "overhead-floor.db"
    subjects.create_floor_table(lambda table: SqliteLedger(floor_path, table=table))
    floor = subjects.SqliteFloor(floor_path)
    _floor(blocks, floor, loop, calls, lambda m: subjects.key_digest(THREAD, m, "c"))
    return Group("sqlite", blocks, settings.rounds, list(_OURS_VS_FLOOR), [floor.close, ledger.close], [])


def postgres_group(settings: Settings, scratch: Scratch, loop: asyncio.AbstractEventLoop) -> Group:
    assert scratch.postgres_url is not None
    calls = settings.block
    blocks: dict[str, Block] = {}
    ledger = PostgresLedger(scratch.postgres_url, schema=scratch.schema)
    _ours(blocks, ledger, loop, calls)
    subjects.create_floor_table(
        lambda table: PostgresLedger(scratch.postgres_url or "", schema=scratch.schema, table=table)
    )
    floor = subjects.PostgresFloor(libpq_url(scratch.postgres_url), scratch.schema)
    floor_name = functools.partial(subjects.key_digest, THREAD, tool_call_id="c")
    _after_round_trips(blocks, floor, calls, floor_name, _floor(blocks, floor, loop, calls, floor_name))
    # Context: both sides with synchronous_commit=off (a commit does not wait for the WAL flush).
    relaxed = "-c synchronous_commit=off"
    relaxed_url = f"{scratch.postgres_url}{'&' if '?' in scratch.postgres_url else '?'}options={quote(relaxed)}"
    relaxed_ledger = PostgresLedger(relaxed_url, schema=scratch.schema)
    relaxed_tools = subjects.Tools(relaxed_ledger)
    relaxed_floor = subjects.PostgresFloor(libpq_url(scratch.postgres_url), scratch.schema, options=relaxed)
    blocks["ours-commit-off.sync.miss"] = ours_sync(relaxed_tools.sync, lambda r: _miss_ids(r, calls, "o"))
    blocks["floor-commit-off.sync.miss"] = raw_sync(
        relaxed_floor.miss, lambda r: [subjects.key_digest(THREAD, f"o{r}-{i}", "f") for i in range(calls)]
    )
    compare = [
        *_OURS_VS_FLOOR,
        ("context.synchronous_commit_off.sync.miss", "ours-commit-off.sync.miss", "floor-commit-off.sync.miss"),
        *_AFTER_ROUND_TRIPS,
    ]

    def close() -> None:
        loop.run_until_complete(floor.aclose())
        loop.run_until_complete(ledger.aclose())
        relaxed_floor.close()
        relaxed_ledger.close()

    return Group("postgres", blocks, settings.rounds, compare, [close], [], _postgres_round_trips(scratch))


def redis_group(settings: Settings, scratch: Scratch, loop: asyncio.AbstractEventLoop) -> Group:
    assert scratch.redis_url is not None
    calls = settings.block
    blocks: dict[str, Block] = {}
    ledger = RedisLedger(scratch.redis_url, prefix=f"{scratch.prefix}:ours")
    _ours(blocks, ledger, loop, calls)
    floor = subjects.RedisFloor(scratch.redis_url)

    def floor_name(message_id: str) -> str:
        return f"{scratch.prefix}:floor:{{{THREAD}}}:{message_id}:c"

    _after_round_trips(blocks, floor, calls, floor_name, _floor(blocks, floor, loop, calls, floor_name))
    # Context: the floor on one held connection, below redis-py's command layer.
    held = subjects.RedisHeldFloor(scratch.redis_url)
    held_hits = [f"{scratch.prefix}:held:{{{THREAD}}}:hit-{i}:c" for i in range(calls)]
    for name in held_hits:
        held.miss(name)
    blocks["floor-held.sync.miss"] = raw_sync(
        held.miss, lambda r: [f"{scratch.prefix}:held:{{{THREAD}}}:{r}-{i}:c" for i in range(calls)]
    )
    blocks["floor-held.sync.hit"] = raw_sync(held.hit, lambda r: held_hits)
    compare = [
        *_OURS_VS_FLOOR,
        *(
            (f"context.held_connection.sync.{kind}", f"ours.sync.{kind}", f"floor-held.sync.{kind}")
            for kind in ("miss", "hit")
        ),
        *_AFTER_ROUND_TRIPS,
    ]
    closers: list[Callable[[], None]] = [held.close]
    notes: list[str] = []
    if subjects.powertools_available():
        alternative = subjects.Powertools(
            "redis", client=scratch.redis_client(decode_responses=True), key_prefix=f"{scratch.prefix}-pt"
        )
        for key in _hit_ids(calls, "p"):
            alternative(*key)
        blocks["powertools.sync.miss"] = powertools_block(alternative, lambda r: _miss_ids(r, calls, "p"))
        blocks["powertools.sync.hit"] = powertools_block(alternative, lambda r: _hit_ids(calls, "p"))
        compare += [
            (f"vs-powertools.{kind}", f"ours.sync.{kind}", f"powertools.sync.{kind}") for kind in ("miss", "hit")
        ]
        closers.append(alternative.close)
    else:
        notes.append("aws-lambda-powertools is not installed (pip install -e '.[bench]'): no alternative measured")

    def close() -> None:
        loop.run_until_complete(floor.aclose())
        loop.run_until_complete(ledger.aclose())

    closers.append(close)
    return Group("redis", blocks, settings.rounds, compare, closers, notes, _redis_round_trips(scratch))


#: The tiered ledger against what it is made of, per round: its replays against the Redis ledger's, its first
#: calls against the PostgreSQL ledger's (labels: ``tiered_<kind>_vs_<ledger>.<mode>``).
_TIERED_VS_PARTS = [
    (f"tiered_{kind}_vs_{part}.{mode}", f"ours.{mode}.{kind}", f"{part}.{mode}.{kind}")
    for kind, part in (("hit", "redis"), ("miss", "postgres"))
    for mode in ("sync", "async")
]


def tiered_group(settings: Settings, scratch: Scratch, loop: asyncio.AbstractEventLoop) -> Group:
    """The tiered ledger (PostgreSQL with a Redis cache in front) in the same rounds as a Redis ledger and a
    PostgreSQL ledger alone, each on a place of its own: its replays are the Redis ledger's kind of call, its
    first calls the PostgreSQL ledger's (plus the cache's read and write)."""
    assert scratch.postgres_url is not None
    assert scratch.redis_url is not None
    calls = settings.block
    blocks: dict[str, Block] = {}
    tiered = TieredLedger(
        PostgresLedger(scratch.postgres_url, schema=scratch.schema, table="tiered_executions"),
        cache=RedisLedger(scratch.redis_url, prefix=f"{scratch.prefix}:tiered"),
    )
    _ours(blocks, tiered, loop, calls)
    parts: dict[str, Ledger] = {
        "redis": RedisLedger(scratch.redis_url, prefix=f"{scratch.prefix}:tiered-redis"),
        "postgres": PostgresLedger(scratch.postgres_url, schema=scratch.schema, table="tiered_postgres"),
    }
    for part, ledger in parts.items():
        own: dict[str, Block] = {}
        _ours(own, ledger, loop, calls)
        blocks.update({config.replace("ours.", f"{part}.", 1): block for config, block in own.items()})

    def close() -> None:
        for ledger in (tiered, *parts.values()):
            loop.run_until_complete(ledger.aclose())  # type: ignore[attr-defined]

    return Group("tiered", blocks, settings.rounds, list(_TIERED_VS_PARTS), [close], [])


def _round_trips(
    url: str, ours: Callable[[str], Ledger], floor: Callable[[str], subjects.Floor], floor_name: Callable[[str], str]
) -> dict[str, int]:
    """Round trips one first call and one replay make, ours and the floor's, counted on the wire (``_wire``)."""
    counts: dict[str, int] = {}
    with relayed(url) as (relay, through):
        ledger = ours(through)
        tools = subjects.Tools(ledger)
        _call(tools, "warm")  # connections open, scripts loaded, statements prepared
        counts["ours.miss"] = relay.count(lambda: _call(tools, "count"))
        counts["ours.hit"] = relay.count(lambda: _call(tools, "count"))
        ledger.close()
        raw = floor(through)
        raw.miss(floor_name("warm"))
        counts["floor.miss"] = relay.count(lambda: raw.miss(floor_name("count")))
        counts["floor.hit"] = relay.count(lambda: raw.hit(floor_name("count")))
        raw.close()
    return counts


def _redis_round_trips(scratch: Scratch) -> dict[str, int]:
    assert scratch.redis_url is not None
    counts = _round_trips(
        scratch.redis_url,
        lambda url: RedisLedger(url, prefix=f"{scratch.prefix}:count"),
        subjects.RedisFloor,
        lambda m: f"{scratch.prefix}:count-floor:{{{THREAD}}}:{m}:c",
    )
    if subjects.powertools_available():
        with relayed(scratch.redis_url) as (relay, through):
            client = redis.Redis.from_url(through, decode_responses=True)
            alternative = subjects.Powertools("redis", client=client, key_prefix=f"{scratch.prefix}-ptcount")
            alternative(THREAD, "warm", "c")
            counts["powertools.miss"] = relay.count(lambda: alternative(THREAD, "count", "c"))
            counts["powertools.hit"] = relay.count(lambda: alternative(THREAD, "count", "c"))
            alternative.close()
    return counts


def _postgres_round_trips(scratch: Scratch) -> dict[str, int]:
    assert scratch.postgres_url is not None
    return _round_trips(
        scratch.postgres_url,
        lambda url: PostgresLedger(url, schema=scratch.schema),
        lambda url: subjects.PostgresFloor(libpq_url(url), scratch.schema),
        lambda m: subjects.key_digest(THREAD, m, "c"),
    )


def _call(tools: subjects.Tools, message_id: str) -> None:
    with tool_call(THREAD, message_id, "c"):
        tools.sync(subjects.ORDER_ID)


def library_cpu(per_call: dict[str, list[float]], bare: dict[str, str]) -> dict[str, Any]:
    """Each configuration's CPU over a bare call, in microseconds and in JSON round trips
    (``json.dumps`` + ``json.loads`` of the result, timed in the same round); and the async
    calls' library CPU over the sync ones'. All per round."""
    cpu = {
        config: [a - b for a, b in zip(per_call[config], per_call[floor], strict=True)]
        for config, floor in bare.items()
    }
    reference = per_call["reference.json"]
    found: dict[str, Any] = {
        "library_cpu": {
            config: {"us": micros(values), "vs_json": summary(excess_ratios(values, reference))}
            for config, values in cpu.items()
        }
    }
    found["async_vs_sync"] = {
        kind: summary(excess_ratios(cpu[f"ours.async.{kind}"], cpu[f"ours.sync.{kind}"])) for kind in ("miss", "hit")
    }
    return found


def run(settings: Settings, scratch: Scratch, log: Callable[[str], None]) -> dict[str, Any]:
    """Every ledger's paired rounds; returns the ``overhead``, ``floor`` and ``alternative`` sections."""
    builders: list[tuple[str, Callable[..., Group], bool]] = [
        ("memory", memory_group, True),
        ("sqlite", sqlite_group, True),
        ("postgres", postgres_group, scratch.postgres_url is not None),
        ("redis", redis_group, scratch.redis_url is not None),
        ("tiered", tiered_group, scratch.postgres_url is not None and scratch.redis_url is not None),
    ]
    overhead: dict[str, Any] = {}
    floor: dict[str, Any] = {}
    alternative: dict[str, Any] = {}
    for name, build, available in builders:
        if not available:
            overhead[name] = {"skipped": f"no {name} server answered"}
            continue
        log(f"overhead: {name}")
        loop = asyncio.new_event_loop()
        group = build(settings, scratch, loop)
        try:
            per_call = paired_rounds(group.blocks, rounds=group.rounds, calls=settings.block, warmup=settings.warmup)
        finally:
            for close in group.closers:
                close()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
        overhead[name] = {
            "rounds": group.rounds,
            "calls_per_block": settings.block,
            "per_call_us": {config: micros(values) for config, values in per_call.items()},
            "notes": group.notes,
        }
        if group.round_trips is not None:
            overhead[name]["round_trips"] = group.round_trips
        if group.library_cpu:
            overhead[name].update(library_cpu(per_call, group.library_cpu))
        for label, numerator, denominator in group.compare:
            entry = {
                "ours": numerator,
                "other": denominator,
                "ratio": summary(ratios(per_call, numerator, denominator)),
                "difference_us": micros(differences(per_call, numerator, denominator)),
            }
            target = alternative if label.startswith("vs-") else floor
            target.setdefault(name, {})[label.removeprefix("vs-")] = entry
    return {"overhead": overhead, "floor": floor, "alternative": alternative}
