"""A stand-alone process for the approvals' crash and race tests, run as ``python tests/approvals_child.py``.

``run LEDGER_URL EFFECTS THREAD KILL``: call ``refund_order("A1", 30)`` (``needs_approval=True``, its side
effect a line in EFFECTS) under fixed ids and print how it ended as JSON: ``{"result": ...}``, or
``{"error": <type name>, "may_have_run": ...}``. With KILL ``inside``, SIGKILL itself inside the tool,
after the side effect (no ``finally``, no ``atexit``).

``race LEDGER_URL EFFECTS THREAD``: print ``ready``, wait for a line on stdin (the parent's go, once
every racer is ready), then call as ``run`` does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from child import append  # tests/, this script's own directory

from replaysafe import ReplaySafeError, open_ledger, replay_safe, tool_call


def call(url: str, effects: str, thread: str, kill: str) -> dict[str, Any]:
    ledger = open_ledger(url)

    @replay_safe(ledger=ledger, needs_approval=True)
    def refund_order(order_id: str, amount: int) -> str:
        append(effects, f"refund {order_id} {amount} pid={os.getpid()}")
        if kill == "inside":
            os.kill(os.getpid(), signal.SIGKILL)
        return f"re_{order_id}_{amount}"

    try:
        with tool_call(thread, "msg_1", "call_1"):
            return {"result": refund_order("A1", 30)}
    except ReplaySafeError as exc:
        return {"error": type(exc).__name__, "may_have_run": getattr(exc, "may_have_run", None)}
    finally:
        ledger.close()


def main(argv: list[str]) -> None:
    command, url, effects, thread = argv[:4]
    if command == "race":
        print("ready", flush=True)
        sys.stdin.readline()
        kill = "none"
    else:
        kill = argv[4]
    print(json.dumps(call(url, effects, thread, kill)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
