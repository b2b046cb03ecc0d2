"""A stand-alone process for the crash tests of undo: ``python tests/undo_child.py``.

Every side effect (the refund, and its compensation, the cancel) is a line appended to EFFECTS
(outside the process) with the idempotency key and attempt the call handed it, so the test counts
what really happened.

``call LEDGER_URL EFFECTS THREAD POLICY``: call ``refund`` once under fixed ids; print its result as JSON.

``undo LEDGER_URL EFFECTS THREAD POLICY POINT``: ``ledger.undo`` the ``refund`` call; SIGKILL this process
inside the compensation, after its side effect, when POINT is ``inside-undo``; else print what the undo
did as JSON (an error raised is printed by the interpreter, which exits 1).

POLICY is the tool's ``in_doubt`` (``rerun`` or ``raise``), which its compensation follows.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from child import append  # tests/, this script's own directory

from replaysafe import CallKey, current_call, open_ledger, replay_safe, tool_call

MESSAGE, CALL = "msg_1", "call_1"


def tools(url: str, effects: str, policy: str, point: str) -> tuple[object, object]:
    ledger = open_ledger(url)

    def cancel_refund(receipt: dict[str, str]) -> str:
        info = current_call()
        append(effects, f"cancel {info.idempotency_key} {info.attempt} {receipt['id']}")
        if point == "inside-undo":
            os.kill(os.getpid(), signal.SIGKILL)
        return f"cancelled {receipt['id']}"

    @replay_safe(ledger=ledger, in_doubt=policy, undo=cancel_refund)  # type: ignore[arg-type]
    def refund(order_id: str) -> dict[str, str]:
        info = current_call()
        append(effects, f"refund {info.idempotency_key} {info.attempt} re_{order_id}")
        return {"id": f"re_{order_id}"}

    return ledger, refund


def call(url: str, effects: str, thread: str, policy: str) -> None:
    _, refund = tools(url, effects, policy, "none")
    with tool_call(thread, MESSAGE, CALL):
        print(json.dumps({"result": refund("1042")}), flush=True)  # type: ignore[operator]


def undo(url: str, effects: str, thread: str, policy: str, point: str) -> None:
    ledger, _ = tools(url, effects, policy, point)
    done = ledger.undo(CallKey(thread, MESSAGE, CALL))  # type: ignore[attr-defined]
    print(json.dumps([[item.tool_name, item.outcome, item.result] for item in done]), flush=True)


if __name__ == "__main__":
    command, *argv = sys.argv[1:]
    {"call": call, "undo": undo}[command](*argv)
