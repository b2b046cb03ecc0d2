"""The README's quick start as an agent ``replaysafe crashtest`` can prove.

    replaysafe crashtest examples/quickstart_agent.py:main --jobs 2

A loop over the model's tool calls (fixed ids, as a scripted model gives), each run under the
call's ids with ``@replay_safe``; the conversation is saved after each turn under
``$REPLAYSAFE_CRASHTEST_DIR``, so a run that is killed resumes from the last saved turn.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from replaysafe import current_call, open_ledger, replay_safe, tool_call
from replaysafe.testing import side_effect

#: The model's tool calls, turn by turn: (message id, tool call id, order id, amount).
TURNS = [("msg_7", "call_1", "1042", 59.0), ("msg_8", "call_1", "1043", 12.5)]


@side_effect
def payment_provider_refund(order_id: str, amount: float, idempotency_key: str) -> str:
    """The provider's API call: the side effect the crash test counts."""
    return f"re_{order_id}"


def main() -> None:
    folder = Path(os.environ.get("REPLAYSAFE_CRASHTEST_DIR", "."))
    ledger = open_ledger(os.environ.get("REPLAYSAFE_LEDGER_URL", f"sqlite:///{folder / 'ledger.db'}"))

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str, amount: float) -> str:
        key = current_call().idempotency_key  # same on every attempt: hand it to the provider
        return payment_provider_refund(order_id, amount, key)

    saved = folder / "conversation.json"
    done: list[str] = json.loads(saved.read_text()) if saved.exists() else []
    with ledger:
        for message_id, tool_call_id, order_id, amount in TURNS:
            if message_id in done:
                continue
            with tool_call(thread_id="t1", message_id=message_id, tool_call_id=tool_call_id):
                refund_order(order_id, amount)
            done.append(message_id)
            saved.write_text(json.dumps(done))


if __name__ == "__main__":
    main()
