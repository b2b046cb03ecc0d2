"""A support agent written by hand on the OpenAI SDK (Chat Completions), crash-tested offline.

    replaysafe crashtest examples/sdk_loops_agent.py:main --jobs 2

The model is the SDK's own ``OpenAI`` client answering from a script (``replaysafe_sdk_loops.testing``),
with the ids the API would give (``chatcmpl-…``, ``call_…``): no network, no key. The loop saves each
completion before running its tool calls, and the conversation after them, in ``$REPLAYSAFE_CRASHTEST_DIR``;
a run that finds a saved completion with its tools pending processes it again, and ``run_tool_calls`` replays
the calls that finished before the crash.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from openai.types.chat import ChatCompletion
from replaysafe_sdk_loops.openai import run_tool_calls
from replaysafe_sdk_loops.testing import scripted_openai

from replaysafe import current_call, open_ledger
from replaysafe.testing import Script, ScriptedCall, side_effect

#: What the model asks for: look the order up and refund it, then tell the customer.
SCRIPT = Script(
    (
        (ScriptedCall("lookup_order", {"order_id": "1042"}), ScriptedCall("refund_order", {"order_id": "1042"})),
        (ScriptedCall("send_email", {"to": "ana@example.com", "body": "Your refund is on its way."}),),
        "Order 1042 is refunded and Ana has been told.",
    ),
    name="support-1042",
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {p: {"type": "string"} for p in params}, "required": params},
        },
    }
    for name, description, params in [
        ("lookup_order", "Read an order.", ["order_id"]),
        ("refund_order", "Refund an order in full.", ["order_id"]),
        ("send_email", "Email a customer.", ["to", "body"]),
    ]
]


@side_effect
def payments_refund(order_id: str, idempotency_key: str) -> str:
    """The payment provider's API call: the side effect the crash test counts."""
    return f"re_{order_id}"


@side_effect
def mail_send(to: str, body: str) -> str:
    """The mail provider's API call."""
    return f"sent to {to}"


def lookup_order(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "amount": 59.0, "status": "paid"}


def refund_order(order_id: str) -> str:
    return payments_refund(order_id, current_call().idempotency_key)  # the provider dedupes on the key too


def send_email(to: str, body: str) -> str:
    return mail_send(to, body)


def main() -> None:
    folder = Path(os.environ.get("REPLAYSAFE_CRASHTEST_DIR", "."))
    ledger = open_ledger(os.environ.get("REPLAYSAFE_LEDGER_URL", f"sqlite:///{folder / 'ledger.db'}"))
    client = scripted_openai(SCRIPT)  # yours: openai.OpenAI()
    tools = {"lookup_order": lookup_order, "refund_order": refund_order, "send_email": send_email}
    saved = folder / "conversation.json"
    state: dict[str, Any] = (
        json.loads(saved.read_text())
        if saved.exists()
        else {"messages": [{"role": "user", "content": "Please refund order 1042."}], "pending": None}
    )
    with ledger:
        while True:
            if state["pending"] is None:
                completion = client.chat.completions.create(model="gpt-5", messages=state["messages"], tools=TOOLS)
                state["pending"] = completion.model_dump_json()
                saved.write_text(json.dumps(state))  # before any tool runs
            completion = ChatCompletion.model_validate_json(state["pending"])
            message = completion.choices[0].message
            results = run_tool_calls(completion, tools, thread_id="support-1042", ledger=ledger)
            state["messages"] += [message.model_dump(exclude_none=True), *results]
            state["pending"] = None
            saved.write_text(json.dumps(state))
            if not message.tool_calls:
                print(message.content)
                return


if __name__ == "__main__":
    main()
