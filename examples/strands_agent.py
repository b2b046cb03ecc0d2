"""A Strands Agents support agent, crash-tested offline.

Crash-test it with ``replaysafe crashtest examples/strands_agent.py:main --jobs 2``.

The agent looks an order up, then refunds it and emails the customer (two calls in one model turn, which
Strands runs side by side), then answers. Its model is scripted (``replaysafe_strands.testing.ScriptedModel``):
Bedrock's toolUseIds, fixed message ids, no network. Its conversation is a ``FileSessionManager`` in
``$REPLAYSAFE_CRASHTEST_DIR``: Strands saves the model's toolUse message before the turn's tools run, and their
results once all of them have run. A run that finds the session continues it with no new prompt: Strands runs
the pending turn's calls again under the same ids, and ``ReplaySafeHooks`` replays each one that had finished.
The provider calls are marked with ``@side_effect``, so the crash test counts them.
"""

from __future__ import annotations

import os
from pathlib import Path

from replaysafe_strands import ReplaySafeHooks
from replaysafe_strands.testing import ScriptedModel
from strands import Agent, tool
from strands.session import FileSessionManager

from replaysafe import Ledger, open_ledger
from replaysafe.testing import Script, ScriptedCall, side_effect

CONVERSATION = "support-order-A1"
SCRIPT = Script(
    (
        (ScriptedCall("lookup_order", {"order_id": "A1"}),),
        (
            ScriptedCall("refund_order", {"order_id": "A1", "amount_cents": 4200}),
            ScriptedCall("email_customer", {"to": "ana@example.com", "text": "Your refund of 42.00 is on its way."}),
        ),
        "Order A1 is refunded and Ana has been told.",
    ),
    name="support-order-A1",
)


@side_effect
def bank_refund(order_id: str, amount_cents: int) -> str:
    """The payment provider's refund: money moves (counted by the crash test)."""
    return f"re_{order_id}_{amount_cents}"


@side_effect
def smtp_send(to: str, text: str) -> str:
    """The mail provider: a customer gets an email (counted by the crash test)."""
    return f"queued for {to}"


@tool
def lookup_order(order_id: str) -> dict[str, object]:
    """Look an order up."""
    return {"order_id": order_id, "customer": "ana@example.com", "total_cents": 4200}


@tool
def refund_order(order_id: str, amount_cents: int) -> str:
    """Refund an order."""
    return bank_refund(order_id, amount_cents)


@tool
async def email_customer(to: str, text: str) -> str:
    """Email a customer."""
    return smtp_send(to, text)


def build_agent(ledger: Ledger, folder: Path) -> Agent:
    """The agent on its saved session; the thread id is the session's (``support-order-A1/default``)."""
    model = ScriptedModel(SCRIPT)  # among the hooks too: it gives its messages fixed ids
    return Agent(
        model=model,
        tools=[lookup_order, refund_order, email_customer],
        hooks=[model, ReplaySafeHooks(ledger)],
        session_manager=FileSessionManager(session_id=CONVERSATION, storage_dir=str(folder / "sessions")),
        callback_handler=None,
    )


def run_agent(ledger: Ledger, folder: Path) -> str:
    """Run the conversation to its answer, continuing the saved session if there is one."""
    agent = build_agent(ledger, folder)
    last = agent.messages[-1] if agent.messages else None
    if last is not None and last["role"] == "assistant" and not any("toolUse" in b for b in last["content"]):
        return "".join(block.get("text", "") for block in last["content"])  # answered already
    result = agent(None if agent.messages else "Ana says order A1 arrived broken: refund it and let her know.")
    return str(result).strip()


def main() -> None:
    """The crash test's entry point: state in ``$REPLAYSAFE_CRASHTEST_DIR``, ledger from ``$REPLAYSAFE_LEDGER_URL``."""
    folder = Path(os.environ.get("REPLAYSAFE_CRASHTEST_DIR", ".strands_agent"))
    folder.mkdir(parents=True, exist_ok=True)
    url = os.environ.get("REPLAYSAFE_LEDGER_URL", f"sqlite:///{folder / 'ledger.db'}")
    with open_ledger(url) as ledger:
        print(run_agent(ledger, folder))


if __name__ == "__main__":
    main()
