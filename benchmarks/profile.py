"""Where a protected call's time goes: ``python -m benchmarks.profile [memory|sqlite|redis|postgres] [miss|hit]``.

Runs many protected calls of the benchmark's trivial tool (default settings, main
thread) under pyinstrument and prints the call tree. The profiler roughly doubles
the time of small functions: read it for proportions, and ``python -m benchmarks``
for the microseconds.
"""

from __future__ import annotations

import argparse
import time
import uuid

from replaysafe import Ledger, MemoryLedger, PostgresLedger, RedisLedger, SqliteLedger, tool_call

from . import _subjects as subjects
from ._env import Scratch


def _ledger(name: str, scratch: Scratch) -> Ledger:
    if name == "memory":
        return MemoryLedger()
    if name == "sqlite":
        return SqliteLedger(scratch.directory / "profile.db")
    if name == "postgres":
        assert scratch.postgres_url is not None, "no PostgreSQL server answered"
        return PostgresLedger(scratch.postgres_url, schema=scratch.schema)
    assert scratch.redis_url is not None, "no Redis server answered"
    return RedisLedger(scratch.redis_url, prefix=f"{scratch.prefix}:profile")


def main() -> None:
    from pyinstrument import Profiler

    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("ledger", nargs="?", default="memory", choices=("memory", "sqlite", "postgres", "redis"))
    parser.add_argument("kind", nargs="?", default="miss", choices=("miss", "hit"))
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    with Scratch.discover() as scratch:
        ledger = _ledger(args.ledger, scratch)
        tools = subjects.Tools(ledger)
        thread = f"profile-{uuid.uuid4().hex[:6]}"
        keys = [(thread, f"m{i}", "c") for i in range(args.calls)]
        if args.kind == "hit":
            keys = keys[:100]
            for key in keys:
                with tool_call(*key):
                    tools.sync(subjects.ORDER_ID)
            keys = keys * (args.calls // 100)
        profiler = Profiler(interval=0.0001)
        profiler.start()
        started = time.perf_counter()
        for key in keys:
            with tool_call(*key):
                tools.sync(subjects.ORDER_ID)
        elapsed = time.perf_counter() - started
        profiler.stop()
        ledger.close()
    print(f"{args.ledger} {args.kind}: {elapsed / len(keys) * 1e6:.1f} us per call under the profiler")
    print(profiler.output_text(unicode=True, color=False))


if __name__ == "__main__":
    main()
