"""Child process of the Agents SDK resume and crash tests.

Usage: ``agents_child.py start|resume|resume-and-crash STATE LEDGER EFFECTS VARIANT``

``start`` runs the agent until both tool calls wait for approval and writes ``RunState.to_json()``
to STATE. ``resume`` loads STATE in this new process, approves the calls, runs to the end and prints
the run's output and tool outputs as JSON. ``resume-and-crash`` does the same but is SIGKILLed inside
``send_email``, after ``refund_order`` returned.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, cast

from agents import Runner, RunState
from agents.items import ToolCallOutputItem

from replaysafe import SqliteLedger

from agents_scenario import RUN_CONFIG, THREAD, Variant, build_agent, calls_step, done_step


async def start(ledger: SqliteLedger, state: Path, effects: Path, variant: Variant) -> None:
    agent = build_agent(ledger, effects, [calls_step(1)], variant, needs_approval=True)
    result = await Runner.run(
        agent, "Refund order A1 and tell bob", context={"thread_id": THREAD}, run_config=RUN_CONFIG
    )
    assert len(result.interruptions) == 2
    await asyncio.to_thread(state.write_text, json.dumps(result.to_state().to_json()))


async def resume(ledger: SqliteLedger, state: Path, effects: Path, variant: Variant, *, crash: bool) -> dict[str, Any]:
    """Approve the pending calls of the stored state and run on; the output and each call's output."""
    agent = build_agent(ledger, effects, [done_step(1)], variant, needs_approval=True, crash_in_email=crash)
    stored = json.loads(await asyncio.to_thread(state.read_text))
    run_state = await RunState.from_json(agent, stored)
    for interruption in run_state.get_interruptions():
        run_state.approve(interruption)
    result = await Runner.run(agent, run_state, run_config=RUN_CONFIG)
    outputs = {
        str(cast(dict[str, Any], item.raw_item)["call_id"]): item.output
        for item in result.new_items
        if isinstance(item, ToolCallOutputItem)
    }
    return {"output": result.final_output, "outputs": outputs}


def main() -> None:
    mode, state, ledger_path, effects, variant = sys.argv[1:]
    with SqliteLedger(ledger_path) as ledger:
        if mode == "start":
            asyncio.run(start(ledger, Path(state), Path(effects), cast(Variant, variant)))
        else:
            crash = mode == "resume-and-crash"
            print(
                json.dumps(asyncio.run(resume(ledger, Path(state), Path(effects), cast(Variant, variant), crash=crash)))
            )


if __name__ == "__main__":
    main()
