"""A LangGraph support agent, crash-tested offline: ``replaysafe crashtest examples/langgraph_agent.py:main``.

A ``create_agent`` agent refunds an order, then emails the customer (two model turns, two tools, each calling a
provider), with ``ReplaySafeMiddleware`` protecting its tool calls. Its model is scripted
(``replaysafe_langgraph.testing.scripted_chat_model``): it answers as a real one would, with OpenAI-shaped ids,
and the same way in every process, so a crashed run and the run that resumes it see the same calls. Use your own
model in production (``"openai:gpt-5"``, ``ChatAnthropic(...)``): the rest is the agent as it runs there.

``main()`` follows the crash test's contract: the agent keeps its checkpoints in ``$REPLAYSAFE_CRASHTEST_DIR`` and
resumes the thread from them (``invoke(None)``) when a crash interrupted it; its ledger is
``$REPLAYSAFE_LEDGER_URL``. Outside a crash test, ``python examples/langgraph_agent.py`` runs it once in a
temporary directory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langgraph.checkpoint.sqlite import SqliteSaver
from replaysafe_langgraph import ReplaySafeMiddleware
from replaysafe_langgraph.testing import scripted_chat_model

from replaysafe import current_call, open_ledger
from replaysafe.testing import Script, ScriptedCall, side_effect

# --- the providers: each call moves money or sends mail (the crash test counts them) ----------------------------


@side_effect
def payments_refund(order_id: str, amount_cents: int, idempotency_key: str) -> str:
    return f"re_{order_id}_{amount_cents}"


@side_effect
def mail_send(to: str, subject: str, idempotency_key: str) -> str:
    return f"em_{to}"


# --- the agent's tools --------------------------------------------------------------------------------------------


def refund_order(order_id: str, amount_cents: int) -> str:
    """Refund an order, in full or in part (amount in cents)."""
    # The key replaysafe gives this call: the provider refuses a second refund under it.
    refund = payments_refund(order_id, amount_cents, idempotency_key=current_call().idempotency_key)
    return f"refund {refund} issued"


def send_email(to: str, subject: str) -> str:
    """Email the customer."""
    return f"email {mail_send(to, subject, idempotency_key=current_call().idempotency_key)} sent"


#: What the model does: refund, then (once it has seen the refund) tell the customer, then answer.
SCRIPT = Script(
    (
        (ScriptedCall("refund_order", {"order_id": "A1042", "amount_cents": 2599}),),
        (ScriptedCall("send_email", {"to": "ana@example.com", "subject": "Your refund for order A1042"}),),
        "Order A1042 is refunded and Ana has been told.",
    ),
    name="support-a1042",
)
THREAD = {"configurable": {"thread_id": "support-ana-a1042"}}


def run_agent(folder: Path, ledger_url: str) -> Any:
    """Run the support thread to its end, resuming it from its checkpoint if a crash interrupted it."""
    with (
        open_ledger(ledger_url) as ledger,
        SqliteSaver.from_conn_string(str(folder / "checkpoints.db")) as checkpointer,
    ):
        agent = create_agent(
            scripted_chat_model(SCRIPT),
            [refund_order, send_email],
            system_prompt="You are a support agent. Refund what the customer is owed, then tell them.",
            middleware=[ReplaySafeMiddleware(ledger)],
            checkpointer=checkpointer,
        )
        saved = agent.get_state(THREAD)
        if not saved.values:  # a new thread
            request = {"messages": [("user", "Order A1042 arrived broken: please refund it and let me know.")]}
            agent.invoke(request, THREAD, durability="sync")
        elif saved.next:  # a crash interrupted it: run the step it was at again, from its checkpoint
            agent.invoke(None, THREAD, durability="sync")
        return agent.get_state(THREAD).values["messages"][-1].content


def main() -> None:
    """The crash test's entry point."""
    run_agent(Path(os.environ["REPLAYSAFE_CRASHTEST_DIR"]), os.environ["REPLAYSAFE_LEDGER_URL"])


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        print(run_agent(Path(directory), f"sqlite:///{Path(directory) / 'ledger.db'}"))
