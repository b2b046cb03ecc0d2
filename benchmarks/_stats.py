"""Paired rounds and their statistics.

The machine's speed swings within seconds, so configurations are never timed one
after the other: every round runs a short block of each (in a shuffled order),
and a ratio is taken inside each round. The median over the rounds, with the
10th-90th percentile of the per-round values as the spread, is what is reported.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._progress import progress

#: Runs one block of calls for round ``r`` and returns the seconds the calls took
#: (setup such as building the block's keys happens before its timer starts).
Block = Callable[[int], float]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linearly interpolated."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median and the p10-p90 spread of per-round values."""
    if not values:
        return {"median": math.nan, "p10": math.nan, "p90": math.nan, "n": 0}
    return {
        "median": statistics.median(values),
        "p10": percentile(values, 10),
        "p90": percentile(values, 90),
        "n": len(values),
    }


def paired_rounds(
    blocks: Mapping[str, Block], *, rounds: int, calls: int, warmup: int = 2, seed: int = 1
) -> dict[str, list[float]]:
    """Seconds per call of every block, one value per round; all blocks run in every round."""
    shuffler = random.Random(seed)
    names = list(blocks)
    per_call: dict[str, list[float]] = {name: [] for name in names}
    for r in progress.rounds(range(-warmup, rounds), rounds + warmup):
        shuffler.shuffle(names)
        for name in names:
            elapsed = blocks[name](r + warmup)  # round numbers stay >= 0, so keys never repeat
            if r >= 0:
                per_call[name].append(elapsed / calls)
    return per_call


def ratios(per_call: Mapping[str, Sequence[float]], numerator: str, denominator: str) -> list[float]:
    """The per-round ratio of two configurations' times."""
    return [a / b for a, b in zip(per_call[numerator], per_call[denominator], strict=True) if b > 0]


def excess_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """The per-round ratio of two series of per-round values (a round whose denominator is not positive is left out)."""
    return [a / b for a, b in zip(numerators, denominators, strict=True) if b > 0]


def differences(per_call: Mapping[str, Sequence[float]], minuend: str, subtrahend: str) -> list[float]:
    """The per-round difference of two configurations' times (seconds per call)."""
    return [a - b for a, b in zip(per_call[minuend], per_call[subtrahend], strict=True)]


def micros(values: Sequence[float]) -> dict[str, float]:
    """``summary`` of values given in seconds, in microseconds."""
    return {k: (v * 1e6 if k != "n" else v) for k, v in summary(values).items()}


def timed(function: Callable[[], Any]) -> float:
    """Seconds one call of ``function`` took."""
    start = time.perf_counter()
    function()
    return time.perf_counter() - start
