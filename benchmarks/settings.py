"""How long each section runs: the full run (for people) and ``--quick`` (a smoke run)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Settings:
    quick: bool
    #: Calls per configuration per round (section 1-3).
    block: int
    #: Paired rounds per server ledger, and for the memory ledger (cheap, so more of them).
    rounds: int
    memory_rounds: int
    #: Rounds run and thrown away first (connections, caches, prepared statements).
    warmup: int
    #: Section 4: concurrent callers, seconds per measurement, repeats (median taken), races per point.
    callers: tuple[int, ...]
    seconds: float
    repeats: int
    races: int
    #: Section 8: sync callers (threads) for the thread scaling, seconds per point, repeats (paired per repeat).
    threads: tuple[int, ...]
    thread_seconds: float
    thread_repeats: int
    #: Section 5: records already in each ledger; rounds; records per memory-footprint sample.
    scale_sizes: tuple[int, ...]
    scale_rounds: int
    memory_records: int
    #: Section 6: parallel calls per node; rounds; reads of N records per block.
    parallel_sizes: tuple[int, ...]
    parallel_rounds: int
    parallel_block: int
    #: Section 7 (10xGraph's PgCheckpointer, async, in a Python 3.12 subprocess): rounds; calls per block.
    tenxgraph_rounds: int
    tenxgraph_block: int
    #: Section 9 (each adapter against its framework alone, in the adapter's environment): rounds; tool calls
    #: per run of the agent (one per model turn).
    adapter_rounds: int
    adapter_calls: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


FULL = Settings(
    quick=False,
    block=25,
    rounds=150,
    memory_rounds=500,
    warmup=3,
    callers=(1, 4, 16, 64),
    seconds=0.5,
    repeats=5,
    races=20,
    threads=(1, 2, 4, 8, 16),
    thread_seconds=0.3,
    thread_repeats=5,
    scale_sizes=(1_000, 100_000, 1_000_000),
    scale_rounds=80,
    memory_records=20_000,
    parallel_sizes=(1, 8, 32),
    parallel_rounds=80,
    parallel_block=10,
    tenxgraph_rounds=80,
    tenxgraph_block=10,
    adapter_rounds=200,
    adapter_calls=10,
)

QUICK = Settings(
    quick=True,
    block=10,
    rounds=6,
    memory_rounds=10,
    warmup=1,
    callers=(1, 4, 16, 64),
    seconds=0.05,
    repeats=1,
    races=2,
    threads=(1, 2, 4, 8, 16),
    thread_seconds=0.03,
    thread_repeats=2,
    scale_sizes=(100, 1_000, 10_000),
    scale_rounds=5,
    memory_records=2_000,
    parallel_sizes=(1, 8, 32),
    parallel_rounds=4,
    parallel_block=2,
    tenxgraph_rounds=4,
    tenxgraph_block=5,
    adapter_rounds=3,
    adapter_calls=3,
)
