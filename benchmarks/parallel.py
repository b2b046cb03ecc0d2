"""Section 6: a node that made N parallel tool calls, read back with one ``get_many`` or one read each.

For N = 1, 8, 32 recorded calls, per ledger and in paired rounds: ``ledger.get_many(keys)``
(one round trip), ``ledger.get(key)`` for each key, and the N calls replayed through the
decorator one after the other (which is what a resumed node does today: one claim each).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from replaysafe import CallKey, Ledger, tool_call

from . import _subjects as subjects
from ._env import Scratch
from ._stats import Block, micros, paired_rounds, ratios, summary
from .settings import Settings


def _blocks(ledger: Ledger, tools: subjects.Tools, keys: list[CallKey], repeats: int) -> dict[str, Block]:
    def get_many(r: int) -> float:
        start = time.perf_counter()
        for _ in range(repeats):
            found = ledger.get_many(keys)
        elapsed = time.perf_counter() - start
        assert len(found) == len(keys)
        return elapsed

    def get_each(r: int) -> float:
        start = time.perf_counter()
        for _ in range(repeats):
            for key in keys:
                ledger.get(key)
        return time.perf_counter() - start

    def replay_each(r: int) -> float:
        start = time.perf_counter()
        for _ in range(repeats):
            for key in keys:
                with tool_call(*key):
                    tools.sync(subjects.ORDER_ID)
        return time.perf_counter() - start

    return {"get_many": get_many, "get_each": get_each, "replay_each": replay_each}


def run(settings: Settings, scratch: Scratch, log: Callable[[str], None]) -> dict[str, Any]:
    results: dict[str, Any] = {
        "sizes": list(settings.parallel_sizes),
        "note": "per node: the time to read N records; replay_each is N decorated replays, one claim each",
    }
    for name, factory in subjects.ledgers(scratch, "parallel").items():
        if factory is None:
            results[name] = {"skipped": f"no {name} server answered"}
            continue
        log(f"parallel: {name}")
        ledger = factory()
        try:
            tools = subjects.Tools(ledger)
            blocks: dict[str, Block] = {}
            for n in settings.parallel_sizes:
                keys = [CallKey(f"node-{n}", "msg", f"call_{i}") for i in range(n)]
                for key in keys:
                    with tool_call(*key):
                        tools.sync(subjects.ORDER_ID)
                for config, block in _blocks(ledger, tools, keys, settings.parallel_block).items():
                    blocks[f"{n}.{config}"] = block
            per_node = paired_rounds(
                blocks, rounds=settings.parallel_rounds, calls=settings.parallel_block, warmup=settings.warmup
            )
            results[name] = {
                str(n): {
                    **{
                        f"{config}_us": micros(per_node[f"{n}.{config}"])
                        for config in ("get_many", "get_each", "replay_each")
                    },
                    "get_each_vs_get_many": summary(ratios(per_node, f"{n}.get_each", f"{n}.get_many")),
                    "replay_each_vs_get_many": summary(ratios(per_node, f"{n}.replay_each", f"{n}.get_many")),
                }
                for n in settings.parallel_sizes
            }
        finally:
            ledger.close()
    return results
