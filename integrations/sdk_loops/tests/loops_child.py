"""Child process of the SDK-loop crash tests.

Usage: ``loops_child.py SDK crash|run OUTPUT LEDGER EFFECTS VARIANT sync|async``

Loads the model output persisted as JSON in OUTPUT with its SDK's pydantic model, runs its tool
calls with ``run_tool_calls`` (or ``arun_tool_calls``) and prints the results as JSON. With
``crash`` the process is SIGKILLed inside ``send_email``, after ``refund_order`` returned.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, cast

from anthropic.types import Message

from replaysafe import SqliteLedger
from replaysafe_sdk_loops import anthropic as anthropic_loop
from replaysafe_sdk_loops import openai as openai_loop

from loops_scenario import LEASE, THREAD, Sdk, Variant, build_tools, load


def main() -> None:
    sdk, mode, output, ledger_path, effects, variant, flavour = sys.argv[1:]
    asynchronous = flavour == "async"
    tools = build_tools(
        Path(effects), cast(Variant, variant), crash_in_email=mode == "crash", asynchronous=asynchronous
    )
    model_output = load(cast(Sdk, sdk), Path(output).read_text())
    with SqliteLedger(ledger_path) as ledger:
        results: list[Any]
        if isinstance(model_output, Message):
            if asynchronous:
                coroutine = anthropic_loop.arun_tool_calls(
                    model_output, tools, thread_id=THREAD, ledger=ledger, lease=LEASE
                )
                results = asyncio.run(coroutine)
            else:
                results = anthropic_loop.run_tool_calls(
                    model_output, tools, thread_id=THREAD, ledger=ledger, lease=LEASE
                )
        elif asynchronous:
            results = asyncio.run(
                openai_loop.arun_tool_calls(model_output, tools, thread_id=THREAD, ledger=ledger, lease=LEASE)
            )
        else:
            results = openai_loop.run_tool_calls(model_output, tools, thread_id=THREAD, ledger=ledger, lease=LEASE)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
