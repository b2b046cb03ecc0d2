"""A LlamaIndex support agent, crash-tested offline.

Crash-test it with ``replaysafe crashtest examples/llamaindex_agent.py:main --jobs 2``.

The agent (a ``FunctionAgent``) looks an order up, then refunds it and emails the customer (two calls in one
model turn, run side by side), then answers. Its model is scripted (``replaysafe_llamaindex.testing.scripted_llm``):
fixed ids, no network. What survives a crash is LlamaIndex's own: the run's ``Context``, saved with
``Context.to_dict()`` in ``$REPLAYSAFE_CRASHTEST_DIR`` while tool calls run; a run that finds it resumes it with
``Context.from_dict()``, and the tool calls in flight run again under their ids, where ``replay_safe_agent``
replays each one that had finished. The provider calls are marked with ``@side_effect``, so the crash test
counts them.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.workflow import Context, JsonPickleSerializer
from replaysafe_llamaindex import replay_safe_agent
from replaysafe_llamaindex.testing import scripted_llm

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
#: LlamaIndex's serializer for a Context whose state holds the agent's memory (its JSON one leaves it out).
SERIALIZER = JsonPickleSerializer()


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


async def email_customer(to: str, text: str) -> str:
    """Email a customer."""
    return smtp_send(to, text)


def words(text: str) -> list[str]:
    """The memory's tokenizer: a plain function, which pickles with the Context."""
    return text.split()


def build_agent(ledger: Ledger) -> FunctionAgent:
    """The agent, wrapped: its calls are keyed by the conversation, the model's answer and the call's id."""
    agent = FunctionAgent(name="support", tools=[lookup_order, refund_order, email_customer], llm=scripted_llm(SCRIPT))
    return replay_safe_agent(agent, ledger=ledger, thread_id=CONVERSATION)


def save(path: Path, ctx: Context) -> None:
    """Save the run's Context while nothing but tool calls runs: a step that has written to the context's state
    (the model's step, the step gathering tool results) would be saved as still to run, beside its own writes."""
    data = ctx.to_dict(serializer=SERIALIZER)
    if any(worker["in_progress"] and step != "call_tool" for step, worker in data["workers"].items()):
        return
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


async def run_agent(ledger: Ledger, folder: Path) -> str:
    """Run the conversation to its answer, resuming the saved Context if there is one."""
    answered, snapshot = folder / "answer.txt", folder / "context.json"
    if answered.exists():
        return answered.read_text()
    agent = build_agent(ledger)
    if snapshot.exists():
        ctx = Context.from_dict(agent, json.loads(snapshot.read_text()), serializer=SERIALIZER)
        handler = agent.run(ctx=ctx)
    else:
        ctx = Context(agent)
        memory = ChatMemoryBuffer.from_defaults(tokenizer_fn=words)
        prompt = "Ana says order A1 arrived broken: refund it and let her know."
        handler = agent.run(user_msg=prompt, ctx=ctx, memory=memory)
    async for _ in handler.stream_events():
        save(snapshot, ctx)
    result: Any = await handler
    answered.write_text(str(result))
    return str(result)


def main() -> None:
    """The crash test's entry point: state in ``$REPLAYSAFE_CRASHTEST_DIR``, ledger from ``$REPLAYSAFE_LEDGER_URL``."""
    folder = Path(os.environ.get("REPLAYSAFE_CRASHTEST_DIR", ".llamaindex_agent"))
    folder.mkdir(parents=True, exist_ok=True)
    url = os.environ.get("REPLAYSAFE_LEDGER_URL", f"sqlite:///{folder / 'ledger.db'}")
    with open_ledger(url) as ledger:
        print(asyncio.run(run_agent(ledger, folder)))


if __name__ == "__main__":
    main()
