"""A Pydantic AI support agent, crash-tested offline.

Crash-test it with ``replaysafe crashtest examples/pydantic_ai_agent.py:main --jobs 2``.

The agent looks an order up, then refunds it and emails the customer (two calls in one model turn), then
answers. Its model is scripted (``replaysafe_pydantic_ai.testing.scripted_model``): fixed ids, no network.
Its message history is saved as JSON once the model has answered, before the tools run (the adapter's
README pattern), in ``$REPLAYSAFE_CRASHTEST_DIR``; a run that finds it there continues it, and the
``ReplaySafe`` capability replays each call that had finished. The provider calls are marked with
``@side_effect``, so the crash test counts them.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic_ai import Agent, ModelMessagesTypeAdapter
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from replaysafe_pydantic_ai import ReplaySafe
from replaysafe_pydantic_ai.testing import scripted_model

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


def lookup_order(order_id: str) -> dict[str, object]:
    """Look an order up."""
    return {"order_id": order_id, "customer": "ana@example.com", "total_cents": 4200}


def refund_order(order_id: str, amount_cents: int) -> str:
    """Refund an order."""
    return bank_refund(order_id, amount_cents)


def email_customer(to: str, text: str) -> str:
    """Email a customer."""
    return smtp_send(to, text)


def build_agent(ledger: Ledger) -> Agent[None, str]:
    """The agent, its tools protected by the capability (last in ``capabilities``)."""
    return Agent(
        scripted_model(SCRIPT),
        tools=[lookup_order, refund_order, email_customer],
        capabilities=[ReplaySafe(ledger)],
    )


def _answer(messages: list[ModelMessage]) -> str | None:
    """The model's final answer, if the saved conversation ends with it."""
    last = messages[-1] if messages else None
    if not isinstance(last, ModelResponse) or any(isinstance(part, ToolCallPart) for part in last.parts):
        return None
    return last.text or ""


def _save(history: Path, messages: list[ModelMessage]) -> None:
    temporary = history.with_suffix(".tmp")
    temporary.write_bytes(ModelMessagesTypeAdapter.dump_json(messages))
    temporary.replace(history)  # a kill mid-write leaves the previous history whole


async def run_agent(ledger: Ledger, history: Path, saved: list[ModelMessage]) -> str:
    """Run the conversation to its answer, continuing the ``saved`` history if there is one."""
    answer = _answer(saved)
    if answer is not None:
        return answer
    agent = build_agent(ledger)
    prompt = None if saved else "Ana says order A1 arrived broken: refund it and let her know."
    async with agent.iter(prompt, message_history=saved or None, conversation_id=CONVERSATION) as run:
        async for node in run:
            if Agent.is_call_tools_node(node):  # the model answered: persist BEFORE its tools run
                await asyncio.to_thread(_save, history, run.all_messages())
    await asyncio.to_thread(_save, history, run.all_messages())
    assert run.result is not None
    return run.result.output


def main() -> None:
    """The crash test's entry point: state in ``$REPLAYSAFE_CRASHTEST_DIR``, ledger from ``$REPLAYSAFE_LEDGER_URL``."""
    folder = Path(os.environ.get("REPLAYSAFE_CRASHTEST_DIR", ".pydantic_ai_agent"))
    folder.mkdir(parents=True, exist_ok=True)
    url = os.environ.get("REPLAYSAFE_LEDGER_URL", f"sqlite:///{folder / 'ledger.db'}")
    with open_ledger(url) as ledger:
        history = folder / "history.json"
        saved = list(ModelMessagesTypeAdapter.validate_json(history.read_bytes())) if history.exists() else []
        print(asyncio.run(run_agent(ledger, history, saved)))


if __name__ == "__main__":
    main()
