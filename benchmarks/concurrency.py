"""Section 4: calls per second with 1, 4, 16 and 64 concurrent callers, on PostgreSQL and Redis.

Sync callers are threads, async callers are asyncio tasks on one event loop. Each
point runs for a fixed time; the repeats of all points are interleaved and the
median is reported. Kinds of load:

* ``miss``: every call is a first execution of a fresh key (many keys);
* ``hit``: every caller replays its own recorded call (many keys);
* ``hot_hit``: every caller replays the same recorded call (one key);
* ``race``: all callers call one fresh key at the same moment: one runs the tool,
  the others wait for its result. Reported as the time until every caller has its
  result, and how many times the tool ran (it must be once per race).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from replaysafe import Ledger, tool_call

from . import _subjects as subjects
from ._env import Scratch
from .settings import Settings

KINDS = ("miss", "hit", "hot_hit")


def _threads(call: Callable[[int, int], Any], callers: int, seconds: float) -> float:
    """Calls per second of ``callers`` threads calling ``call(worker, n)`` for ``seconds``."""
    start_line = threading.Barrier(callers + 1)
    stop = threading.Event()
    counts = [0] * callers
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        start_line.wait()
        n = 0
        try:
            while not stop.is_set():
                call(w, n)
                n += 1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        counts[w] = n

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(callers)]
    for thread in threads:
        thread.start()
    start_line.wait()
    started = time.perf_counter()
    try:
        time.sleep(seconds)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.perf_counter() - started)


async def _tasks(call: Callable[[int, int], Awaitable[Any]], callers: int, seconds: float) -> float:
    """Calls per second of ``callers`` asyncio tasks awaiting ``call(worker, n)`` for ``seconds``."""
    stop = False
    counts = [0] * callers

    async def worker(w: int) -> None:
        n = 0
        while not stop:
            await call(w, n)
            n += 1
        counts[w] = n

    started = time.perf_counter()
    tasks = [asyncio.ensure_future(worker(w)) for w in range(callers)]
    try:
        await asyncio.sleep(seconds)
    finally:
        stop = True
        await asyncio.gather(*tasks)
    return sum(counts) / (time.perf_counter() - started)


def _race_threads(tools: subjects.Tools, callers: int, message_id: str) -> float:
    start_line = threading.Barrier(callers + 1)
    errors: list[BaseException] = []

    def caller() -> None:
        start_line.wait()
        try:
            with tool_call("race", message_id, "c"):
                tools.sync(subjects.ORDER_ID)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller, daemon=True) for _ in range(callers)]
    for thread in threads:
        thread.start()
    start_line.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started


async def _race_tasks(tools: subjects.Tools, callers: int, message_id: str) -> float:
    async def caller() -> None:
        async with tool_call("race", message_id, "c"):
            await tools.aio(subjects.ORDER_ID)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return time.perf_counter() - started


class Load:
    """The sync and async calls of each kind of load, on one ledger."""

    def __init__(self, ledger: Ledger, loop: asyncio.AbstractEventLoop, max_callers: int) -> None:
        self.tools = subjects.Tools(ledger)
        self.loop = loop
        for w in range(max_callers):  # the recorded calls the hit loads replay (sync and async tools differ)
            self._sync("hit-sync", f"w{w}")
            loop.run_until_complete(self._async("hit-async", f"w{w}"))
        self._sync("hot-sync", "m")
        loop.run_until_complete(self._async("hot-async", "m"))
        self.point = 0

    def _sync(self, thread_id: str, message_id: str) -> None:
        with tool_call(thread_id, message_id, "c"):
            self.tools.sync(subjects.ORDER_ID)

    async def _async(self, thread_id: str, message_id: str) -> None:
        async with tool_call(thread_id, message_id, "c"):
            await self.tools.aio(subjects.ORDER_ID)

    def call(self, kind: str, tag: str) -> Callable[[int, int], None]:
        """``call(worker, n)``: a sync call of ``kind`` (a fresh key each time, or the worker's recorded one)."""
        if kind == "miss":
            return lambda w, n: self._sync("miss-sync", f"{tag}-w{w}-{n}")
        return lambda w, n: self._sync("hit-sync", f"w{w}")

    def measure(self, mode: str, kind: str, callers: int, seconds: float) -> float:
        self.point += 1
        tag = f"p{self.point}"

        def key(w: int, n: int) -> tuple[str, str]:
            if kind == "miss":
                return f"miss-{mode}", f"{tag}-w{w}-{n}"
            if kind == "hit":
                return f"hit-{mode}", f"w{w}"
            return f"hot-{mode}", "m"

        if mode == "sync":
            return _threads(lambda w, n: self._sync(*key(w, n)), callers, seconds)
        return self.loop.run_until_complete(_tasks(lambda w, n: self._async(*key(w, n)), callers, seconds))

    def race(self, mode: str, callers: int, races: int) -> dict[str, Any]:
        runs_before = self.tools.runs
        times = []
        for _ in range(races):
            self.point += 1
            message_id = f"{mode}-{callers}-{self.point}"
            if mode == "sync":
                times.append(_race_threads(self.tools, callers, message_id))
            else:
                times.append(self.loop.run_until_complete(_race_tasks(self.tools, callers, message_id)))
        return {
            "median_ms": statistics.median(times) * 1e3,
            "max_ms": max(times) * 1e3,
            "races": races,
            "tool_runs": self.tools.runs - runs_before,
        }


@contextlib.contextmanager
def loaded(factory: Callable[[], Ledger], max_callers: int) -> Iterator[Load]:
    """A ledger from ``factory`` with the recorded calls the hit loads replay; closed (and its loop) at the end."""
    ledger = factory()
    loop = asyncio.new_event_loop()
    try:
        yield Load(ledger, loop, max_callers)
    finally:
        closer = getattr(ledger, "aclose", None)
        if closer is not None:
            loop.run_until_complete(closer())
        ledger.close()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


#: Where a sync tool runs when its callers are threads (sections 4 and 7).
SYNC_CALLERS = (
    "sync callers are threads: under the default timeout each tool runs in its caller's thread (the deadline is "
    "kept by the lease, no worker hand-off; only an explicit timeout= moves a sync tool called off the main "
    "thread to replaysafe's worker pool)"
)


def run(settings: Settings, scratch: Scratch, log: Callable[[str], None]) -> dict[str, Any]:
    results: dict[str, Any] = {
        "callers": list(settings.callers),
        "seconds_per_point": settings.seconds,
        "repeats": settings.repeats,
        "note": f"{SYNC_CALLERS}; async callers are tasks on one event loop",
    }
    every = subjects.ledgers(scratch, "concurrency")
    for name in ("postgres", "redis"):
        factory = every[name]
        if factory is None:
            results[name] = {"skipped": f"no {name} server answered"}
            continue
        log(f"concurrency: {name}")
        with loaded(factory, max(settings.callers)) as load:
            samples: dict[tuple[str, str, int], list[float]] = {}
            points = [(m, k, c) for m in ("sync", "async") for k in KINDS for c in settings.callers]
            for _ in range(settings.repeats):
                for point in points:
                    samples.setdefault(point, []).append(load.measure(*point, settings.seconds))
            entry: dict[str, Any] = {}
            for mode in ("sync", "async"):
                entry[mode] = {
                    str(c): {
                        **{f"{k}_per_s": statistics.median(samples[(mode, k, c)]) for k in KINDS},
                        "race": load.race(mode, c, settings.races),
                    }
                    for c in settings.callers
                }
            results[name] = entry
    return results
