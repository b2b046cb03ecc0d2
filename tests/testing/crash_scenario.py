"""An agent step run in child processes by tests/testing/test_child.py (importable by name)."""

from __future__ import annotations

from pathlib import Path

from replaysafe import InDoubt, current_call, open_ledger, replay_safe, tool_call
from replaysafe.testing import kill_point


def refund_step(ledger_url: str, effects: str, in_doubt: InDoubt = "rerun", *, kill_inside: bool = False) -> str:
    """One tool call, as an agent's run loop makes it; its side effect is a line in ``effects``."""
    ledger = open_ledger(ledger_url)

    @replay_safe(ledger=ledger, in_doubt=in_doubt)
    def refund_order(order_id: str) -> str:
        with Path(effects).open("a", encoding="utf-8") as file:
            file.write(f"refund {order_id} {current_call().idempotency_key}\n")
        if kill_inside:
            kill_point("after_the_side_effect")  # the call is in doubt: claimed, not recorded
        return f"refunded {order_id}"

    with tool_call("thread-1", "msg_1", "call_1"):
        result = refund_order("o-1")
    kill_point("after_the_tool")  # recorded: a resume replays it
    ledger.close()
    return result


async def async_step(value: int) -> int:
    return value * 2


def failing_step() -> None:
    raise ValueError("the step failed")


def returns_a_set() -> object:
    return {1, 2}
