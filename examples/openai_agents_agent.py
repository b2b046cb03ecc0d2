"""An OpenAI Agents SDK support agent, crash-tested offline.

Crash-test it with ``replaysafe crashtest examples/openai_agents_agent.py:main --jobs 2``.

The agent looks an order up, then refunds it and emails the customer (two calls in one model turn), then
answers. Its model is scripted (``replaysafe_openai_agents.testing.scripted_model``): fixed ids, no network.
Its conversation is an ``SQLiteSession`` in ``$REPLAYSAFE_CRASHTEST_DIR``, which the SDK writes once each
turn's tools have run; a run that finds the conversation there continues it (the model is asked again from
the last saved turn, and answers with the same ids), and ``replay_safe_agent`` replays each call that had
finished. The provider calls are marked with ``@side_effect``, so the crash test counts them.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner, SQLiteSession, function_tool
from replaysafe_openai_agents import context_field, replay_safe_agent
from replaysafe_openai_agents.testing import scripted_model

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


@function_tool
def lookup_order(order_id: str) -> dict[str, object]:
    """Look an order up."""
    return {"order_id": order_id, "customer": "ana@example.com", "total_cents": 4200}


@function_tool
def refund_order(order_id: str, amount_cents: int) -> str:
    """Refund an order."""
    return bank_refund(order_id, amount_cents)


@function_tool
def email_customer(to: str, text: str) -> str:
    """Email a customer."""
    return smtp_send(to, text)


def build_agent(ledger: Ledger) -> Agent[Any]:
    """The agent, each of its tools wrapped; the thread id comes from the run's context."""
    agent: Agent[Any] = Agent(
        name="support", model=scripted_model(SCRIPT), tools=[lookup_order, refund_order, email_customer]
    )
    return replay_safe_agent(agent, ledger, thread_id=context_field("thread_id"))


async def run_agent(ledger: Ledger, folder: Path) -> str:
    """Run the conversation to its answer, continuing the saved session if there is one."""
    session = SQLiteSession(CONVERSATION, folder / "session.db")
    try:
        items = await session.get_items()
        last: Any = items[-1] if items else {}
        if last.get("role") == "assistant" and last.get("type", "message") == "message":
            return "".join(part.get("text", "") for part in last.get("content", []))  # answered already
        prompt = [] if items else "Ana says order A1 arrived broken: refund it and let her know."
        result = await Runner.run(
            build_agent(ledger),
            prompt,
            session=session,
            context={"thread_id": CONVERSATION},
            run_config=RunConfig(tracing_disabled=True),
        )
        return str(result.final_output)
    finally:
        session.close()


def main() -> None:
    """The crash test's entry point: state in ``$REPLAYSAFE_CRASHTEST_DIR``, ledger from ``$REPLAYSAFE_LEDGER_URL``."""
    folder = Path(os.environ.get("REPLAYSAFE_CRASHTEST_DIR", ".openai_agents_agent"))
    folder.mkdir(parents=True, exist_ok=True)
    url = os.environ.get("REPLAYSAFE_LEDGER_URL", f"sqlite:///{folder / 'ledger.db'}")
    with open_ledger(url) as ledger:
        print(asyncio.run(run_agent(ledger, folder)))


if __name__ == "__main__":
    main()
