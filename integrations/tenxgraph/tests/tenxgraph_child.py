"""Runs the refund scenario on 10xGraph's PgCheckpointer in a process of its own.

``python tenxgraph_child.py '<Spec as JSON>'``. The test SIGKILLs it through the spec's kill point
and resumes the thread in a new process. When it finishes it prints the thread's tool results and
pending interrupt as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.utils.interrupt import pending_interrupt

from replaysafe import open_ledger

from tenxgraph_scenario import Spec, build_app, run_config, run_input, tool_results


async def run(spec: Spec) -> dict[str, Any]:
    checkpointer: PgCheckpointer[Any] = PgCheckpointer(
        postgres_dsn=spec.postgres_url, redis_url=spec.redis_url, schema=spec.schema
    )
    await checkpointer.asetup()
    ledger = None if spec.variant == "unprotected" else open_ledger(spec.ledger_url)
    app = build_app(spec, checkpointer, ledger)
    try:
        if spec.mode == "invoke":
            await app.ainvoke(run_input(spec), config=run_config(spec))
        else:
            async for _chunk in app.astream(run_input(spec), config=run_config(spec)):
                pass
        state = await checkpointer.aget_state({"thread_id": spec.thread_id, "user_id": "anonymous"})
        pending = pending_interrupt(state) if state is not None else None
        return {
            "results": tool_results(state),
            "interrupt": pending.model_dump(mode="json") if pending is not None else None,
        }
    finally:
        await checkpointer.arelease()
        if ledger is not None:
            ledger.close()


def main() -> None:
    spec = Spec(**json.loads(sys.argv[1]))
    print(json.dumps(asyncio.run(run(spec))))


if __name__ == "__main__":
    main()
