"""A stand-alone process for the crash tests of steps, pauses and chosen keys: ``python tests/steps_child.py``.

Every side effect is a line appended to EFFECTS (outside the process), with the idempotency
key and attempt the call handed it, so the test counts what really happened.

``steps LEDGER_URL EFFECTS THREAD POINT``: call ``fulfil`` (two steps: ``charge`` then
``ship``) and SIGKILL itself at POINT: ``between-steps`` (charge recorded, ship not
started), ``inside-second-step`` (after ship's side effect, before it returns), or
``none``; print the result as JSON.

``pause LEDGER_URL EFFECTS THREAD ANSWER [STEP]``: call ``refund_and_confirm`` (a ``refund`` step,
named STEP when given, as a deploy may rename it; then a pause until ANSWER is not ``-``). On the
pause, SIGKILL itself: the paused record is all the next process has. Otherwise print the result
as JSON (an error raised is printed by the interpreter, which exits 1).

``args LEDGER_URL EFFECTS THREAD MESSAGE CALL POINT``: call ``refund`` (``key="args"``)
under the given message and call ids; SIGKILL itself after the record if POINT is
``after-record``, else print the result.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from child import append  # tests/, this script's own directory

from replaysafe import current_call, open_ledger, replay_safe, tool_call


def effect(path: str, what: str) -> None:
    info = current_call()
    append(path, f"{what} {info.idempotency_key} {info.attempt}")


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def steps(url: str, effects: str, thread: str, point: str) -> None:
    ledger = open_ledger(url)

    @replay_safe(ledger=ledger)
    def charge(order_id: str) -> str:
        effect(effects, "charge")
        return f"ch_{order_id}"

    @replay_safe(ledger=ledger)
    def ship(order_id: str) -> str:
        effect(effects, "ship")
        if point == "inside-second-step":
            kill()
        return f"sh_{order_id}"

    @replay_safe(ledger=ledger)
    def fulfil(order_id: str) -> str:
        charged = charge(order_id)
        if point == "between-steps":
            kill()
        return f"{charged} {ship(order_id)}"

    with tool_call(thread, "msg_1", "call_1"):
        print(json.dumps({"result": fulfil("1042")}), flush=True)


class NeedsApproval(Exception):
    pass


def pause(url: str, effects: str, thread: str, answer: str, step: str = "refund") -> None:
    ledger = open_ledger(url)

    @replay_safe(ledger=ledger, name=step)
    def refund(order_id: str) -> str:
        effect(effects, step)
        return f"re_{order_id}"

    @replay_safe(ledger=ledger, pause_on=NeedsApproval)
    def refund_and_confirm(order_id: str) -> str:
        receipt = refund(order_id)
        if answer == "-":
            raise NeedsApproval("waiting for a human")
        return f"{receipt} {answer}"

    with tool_call(thread, "msg_1", "call_1"):
        try:
            result = refund_and_confirm("1042")
        except NeedsApproval:
            kill()
    print(json.dumps({"result": result}), flush=True)


def args(url: str, effects: str, thread: str, message: str, call: str, point: str) -> None:
    ledger = open_ledger(url)

    @replay_safe(ledger=ledger, key="args")
    def refund(order_id: str, amount: float) -> str:
        effect(effects, "refund")
        return f"Refunded {amount:.2f} for order {order_id}"

    with tool_call(thread, message, call):
        result = refund("1042", 59.0)
    if point == "after-record":
        kill()
    print(json.dumps({"result": result}), flush=True)


if __name__ == "__main__":
    command, *argv = sys.argv[1:]
    {"steps": steps, "pause": pause, "args": args}[command](*argv)
