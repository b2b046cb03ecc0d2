"""Section 8: thread scaling, 1 to 16 sync callers on many keys, on every ledger.

Each point is the calls per second of N threads each calling its own keys (``miss``:
a fresh key every call; ``hit``: each thread replays its own recorded call) for a
fixed time. In every repeat the thread counts of one ledger and kind run one after
the other in a shuffled order, so the ratio to one thread is taken between points
measured moments apart; the median over the repeats is reported. The target:
throughput does not fall as callers grow, read as calls/s at the most threads over
calls/s at one thread >= 1.0.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from typing import Any

from . import _subjects as subjects
from ._env import Scratch
from ._stats import summary
from .concurrency import SYNC_CALLERS, loaded
from .settings import Settings

KINDS = ("miss", "hit")


def run(settings: Settings, scratch: Scratch, log: Callable[[str], None]) -> dict[str, Any]:
    counts = settings.threads
    results: dict[str, Any] = {
        "threads": list(counts),
        "seconds_per_point": settings.thread_seconds,
        "repeats": settings.thread_repeats,
        "note": SYNC_CALLERS,
    }
    shuffler = random.Random(7)
    for name, factory in subjects.ledgers(scratch, "threads").items():
        if factory is None:
            results[name] = {"skipped": f"no {name} server answered"}
            continue
        log(f"threads: {name}")
        with loaded(factory, max(counts)) as load:
            samples: dict[tuple[str, int], list[float]] = {(k, n): [] for k in KINDS for n in counts}
            for _ in range(settings.thread_repeats):
                for kind in KINDS:
                    for n in shuffler.sample(counts, len(counts)):
                        samples[(kind, n)].append(load.measure("sync", kind, n, settings.thread_seconds))
        results[name] = {
            kind: {
                "per_s": {str(n): statistics.median(samples[(kind, n)]) for n in counts},
                "most_vs_one": summary(
                    [
                        most / one
                        for most, one in zip(samples[(kind, counts[-1])], samples[(kind, counts[0])], strict=True)
                        if one
                    ]
                ),
            }
            for kind in KINDS
        }
    return results
