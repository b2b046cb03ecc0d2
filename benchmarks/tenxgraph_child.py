"""Section 7's measurement, run inside the 10xGraph adapter's Python 3.12 environment.

``python -m benchmarks.tenxgraph_child '<spec as JSON>'`` from the repository root (so this
checkout's ``replaysafe`` is the one imported). Both sides run in this one process, on one
event loop, against the same PostgreSQL, in paired rounds:

* **ours**: ``@replay_safe(ledger=PostgresLedger(url, schema=...))`` on an async tool, each call
  inside ``async with tool_call(thread, message, tool_call)`` (claim -> run -> record, or
  claim -> replay);
* **theirs**: what 10xGraph's ToolNode does around each tool call on ``PgCheckpointer``, through
  its own code: ``InvokeNodeHandler._get_recorded_tool_result`` (the ``tool_executions`` lookup,
  then the payload rehydrated), the tool's body, ``InvokeNodeHandler._record_tool_result`` (the
  thread row ensured, the result inserted) for a first call; the lookup alone for a replay.

It creates one schema of its own (named in the spec), drops it at the end, and prints one JSON
object: the seconds per call of every configuration, one value per round. It imports the
benchmark's own modules but none of its extras (Powertools, matplotlib): the adapter's
environment has what they need (replaysafe with psycopg, 10xgraph with redis and asyncpg).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import platform
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql
from tenxgraph.core.graph.utils.invoke_node_handler import InvokeNodeHandler
from tenxgraph.storage.checkpointer import PgCheckpointer

from replaysafe import PostgresLedger, replay_safe, tool_call

from ._stats import paired_rounds
from .overhead import raw_async

THREAD = "t"
ORDER_ID = "42"
#: Our ledger's table: not ``tool_executions``, which is PgCheckpointer's in the same schema.
LEDGER_TABLE = "replaysafe_tool_calls"


async def refund_body(order_id: str) -> dict[str, str]:
    """The tool both sides protect (the same trivial body as the other sections)."""
    return {"refunded": order_id}


class Sides:
    """Ours and theirs on one schema; ``runs`` counts tool executions (a replay must not add one)."""

    def __init__(self, ledger_url: str, dsn: str, redis_url: str, schema: str) -> None:
        self.runs = 0
        self.ledger = PostgresLedger(ledger_url, schema=schema, table=LEDGER_TABLE)
        # Redis is only its state cache; the tool ledger path never touches it.
        self.checkpointer: PgCheckpointer[Any] = PgCheckpointer(postgres_dsn=dsn, redis_url=redis_url, schema=schema)
        self.config = {"thread_id": THREAD, "user_id": "bench"}
        self.handler = InvokeNodeHandler("tools", refund_body)

        @replay_safe(ledger=self.ledger)
        async def refund(order_id: str) -> dict[str, str]:
            self.runs += 1
            return {"refunded": order_id}

        self.ours: Callable[[str], Awaitable[dict[str, str]]] = refund

    async def ours_call(self, message_id: str) -> Any:
        async with tool_call(THREAD, message_id, "c"):
            return await self.ours(ORDER_ID)

    async def theirs_call(self, message_id: str) -> Any:
        """The ToolNode's replay guard around one call (invoke_node_handler._handle_single_tool)."""
        key = f"{message_id}:c"  # its ledger key: the assistant message's id and the tool call's
        recorded = await self.handler._get_recorded_tool_result(self.checkpointer, self.config, key)
        if recorded is not None:
            return recorded
        self.runs += 1
        result = await refund_body(ORDER_ID)
        await self.handler._record_tool_result(self.checkpointer, self.config, key, result)
        return result


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    schema, calls = spec["schema"], spec["block"]
    with psycopg.connect(spec["dsn"], autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    loop = asyncio.new_event_loop()
    try:
        sides = Sides(spec["ledger_url"], spec["dsn"], spec["redis_url"], schema)
        loop.run_until_complete(sides.checkpointer.asetup())
        hits = [f"hit-{i}" for i in range(calls)]
        for message_id in hits:  # recorded once, replayed in every round
            for side in (sides.ours_call, sides.theirs_call):
                first = loop.run_until_complete(side(message_id))
                assert first == {"refunded": ORDER_ID}, first
        recorded = sides.runs
        blocks = {
            "ours.first_call": raw_async(loop, sides.ours_call, lambda r: [f"o{r}-{i}" for i in range(calls)]),
            "theirs.first_call": raw_async(loop, sides.theirs_call, lambda r: [f"x{r}-{i}" for i in range(calls)]),
            "ours.replay": raw_async(loop, sides.ours_call, lambda r: hits),
            "theirs.replay": raw_async(loop, sides.theirs_call, lambda r: hits),
        }
        per_call = paired_rounds(blocks, rounds=spec["rounds"], calls=calls, warmup=spec["warmup"])
        first_calls = 2 * calls * (spec["rounds"] + spec["warmup"])
        # Both sides did the work claimed: every first call ran once, no replay ran the tool.
        assert sides.runs == recorded + first_calls, (sides.runs, recorded, first_calls)
        loop.run_until_complete(sides.checkpointer.arelease())
        loop.run_until_complete(sides.ledger.aclose())
    finally:
        loop.close()
        with psycopg.connect(spec["dsn"], autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    return {
        "per_call_s": per_call,
        "version": importlib.metadata.version("10xgraph"),
        "python": platform.python_version(),
    }


def main() -> None:
    print(json.dumps(measure(json.loads(sys.argv[1]))))


if __name__ == "__main__":
    main()
