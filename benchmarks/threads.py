"""Section 8: thread scaling, 1 to 16 sync callers on many keys, on every ledger.

Each point is the calls per second of N threads each calling its own keys (``miss``:
a fresh key every call; ``hit``: each thread replays its own recorded call) for a
fixed time. In every repeat the thread counts of one ledger and kind run one after
the other in a shuffled order, so the ratio to one thread is taken between points
measured moments apart; the median over the repeats is reported. The target:
throughput does not fall as callers grow, read as calls/s at the most threads over
calls/s at one thread >= 1.0.

Beside it, the **floor's scaling** (context, not a target): the raw client making the
same round trips (``benchmarks._subjects``' floors; a bare call of the tool's body for
the memory ledger) from one thread and from the most threads, each thread on a floor of
its own (its own connection), measured in the same shuffled order. It separates what
Python's GIL and the client do to throughput from what the library adds.
"""

from __future__ import annotations

import contextlib
import random
import statistics
from collections.abc import Callable, Iterator
from typing import Any

from replaysafe import MemoryLedger

from . import _subjects as subjects
from ._env import Scratch, libpq_url
from ._stats import summary
from .concurrency import SYNC_CALLERS, Load, _threads, loaded
from .settings import Settings

KINDS = ("miss", "hit")


def _floor_factories(scratch: Scratch) -> dict[str, Callable[[], subjects.Floor] | None]:
    """A factory of one thread's floor per ledger, on a table or prefix of this section's own."""
    postgres, redis_url = scratch.postgres_url, scratch.redis_url
    sqlite_path = scratch.directory / "threads-floor.db"
    return {
        "memory": subjects.BareFloor,
        "sqlite": lambda: subjects.SqliteFloor(sqlite_path),
        "postgres": (lambda: subjects.PostgresFloor(libpq_url(postgres), scratch.schema)) if postgres else None,
        "redis": (lambda: subjects.RedisFloor(redis_url)) if redis_url else None,
    }


def _create_floor_tables(scratch: Scratch) -> None:
    """The SQL floors' table, made with the ledgers' own DDL (section 1-3 may not have run)."""
    from replaysafe import PostgresLedger, SqliteLedger

    sqlite_path = scratch.directory / "threads-floor.db"
    subjects.create_floor_table(lambda table: SqliteLedger(sqlite_path, table=table))
    if scratch.postgres_url is not None:
        url = scratch.postgres_url
        subjects.create_floor_table(lambda table: PostgresLedger(url, schema=scratch.schema, table=table))


class FloorLoad:
    """The floor's side of the section: one floor per thread, each with the recorded row its thread's hits read.

    With ``then`` (a load on a memory ledger), each floor operation is followed by the same kind of
    protected call on the memory ledger: the raw client's round trips with the library's generic
    Python between them, but none of the server ledger's own code (the control for the library's part).
    """

    def __init__(self, floors: list[subjects.Floor], prefix: str) -> None:
        self.floors = floors
        self.prefix = prefix
        self.point = 0

    def measure(self, kind: str, callers: int, seconds: float, then: Load | None = None) -> float:
        self.point += 1
        floors, tag, prefix = self.floors, f"{self.prefix}-p{self.point}", self.prefix

        if kind == "miss":  # chosen once: the floor's loop runs no test of its own

            def floor_op(w: int, i: int) -> None:
                floors[w].miss(f"{tag}-w{w}-{i}")

        else:

            def floor_op(w: int, i: int) -> None:
                floors[w].hit(f"{prefix}-hit-w{w}")

        if then is None:
            return _threads(floor_op, callers, seconds)
        memory_call = then.call(kind, tag)

        def floor_then_memory(w: int, i: int) -> None:
            floor_op(w, i)
            memory_call(w, i)

        return _threads(floor_then_memory, callers, seconds)


@contextlib.contextmanager
def floor_loaded(factory: Callable[[], subjects.Floor], count: int, prefix: str) -> Iterator[FloorLoad]:
    floors: list[subjects.Floor] = []
    try:
        for w in range(count):
            floors.append(factory())
            floors[w].miss(f"{prefix}-hit-w{w}")
        yield FloorLoad(floors, prefix)
    finally:
        for floor in floors:
            floor.close()


def _most_vs_one(samples: list[float], ones: list[float]) -> dict[str, float]:
    return summary([most / one for most, one in zip(samples, ones, strict=True) if one])


def run(settings: Settings, scratch: Scratch, log: Callable[[str], None]) -> dict[str, Any]:
    counts = settings.threads
    ends = (counts[0], counts[-1])
    results: dict[str, Any] = {
        "threads": list(counts),
        "seconds_per_point": settings.thread_seconds,
        "repeats": settings.thread_repeats,
        "note": SYNC_CALLERS,
    }
    shuffler = random.Random(7)
    floor_factories = _floor_factories(scratch)
    _create_floor_tables(scratch)
    for name, factory in subjects.ledgers(scratch, "threads").items():
        floor_factory = floor_factories[name]
        if factory is None or floor_factory is None:
            results[name] = {"skipped": f"no {name} server answered"}
            continue
        log(f"threads: {name}")
        prefix = f"{scratch.prefix}:threads-floor:{name}"
        # The control (the floor, then a memory-ledger call) only where the floor makes round trips.
        sides = ("floor", "floor-then-memory") if name != "memory" else ("floor",)
        samples: dict[tuple[str, str, int], list[float]] = {
            **{("ours", k, n): [] for k in KINDS for n in counts},
            **{(side, k, n): [] for side in sides for k in KINDS for n in ends},
        }
        with (
            loaded(factory, max(counts)) as load,
            floor_loaded(floor_factory, max(counts), prefix) as floor_load,
            loaded(MemoryLedger, max(counts)) as memory_load,
        ):
            for _ in range(settings.thread_repeats):
                for kind in KINDS:
                    points = [("ours", n) for n in counts] + [(side, n) for side in sides for n in ends]
                    for side, n in shuffler.sample(points, len(points)):
                        if side == "ours":
                            measured = load.measure("sync", kind, n, settings.thread_seconds)
                        else:
                            then = memory_load if side == "floor-then-memory" else None
                            measured = floor_load.measure(kind, n, settings.thread_seconds, then)
                        samples[(side, kind, n)].append(measured)
        results[name] = {
            kind: {
                "per_s": {str(n): statistics.median(samples[("ours", kind, n)]) for n in counts},
                "most_vs_one": _most_vs_one(samples[("ours", kind, ends[1])], samples[("ours", kind, ends[0])]),
                **{
                    side.replace("-", "_"): {
                        "per_s": {str(n): statistics.median(samples[(side, kind, n)]) for n in ends},
                        "most_vs_one": _most_vs_one(samples[(side, kind, ends[1])], samples[(side, kind, ends[0])]),
                    }
                    for side in sides
                },
            }
            for kind in KINDS
        }
    return results
