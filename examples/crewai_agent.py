"""A CrewAI support crew in a persisted Flow, crash-tested offline.

Crash-test it with ``replaysafe crashtest examples/crewai_agent.py:main --jobs 2``.

The crew's agent looks an order up, then refunds it and emails the customer (two calls in one model turn,
which CrewAI runs side by side), then answers. Its LLM is scripted (``replaysafe_crewai.testing.ScriptedLLM``):
fixed ids, no network. The crew runs inside a ``Flow`` with ``@persist`` on a SQLite file in
``$REPLAYSAFE_CRASHTEST_DIR``, kicked off with the conversation's id as its state id; the Flow saves the
answer once the crew has one. CrewAI keeps nothing of a task in progress, so a run killed mid-task runs the
task again: the model plans the same calls under the same ids, and ``replay_safe_crew`` replays each call that
had finished. The provider calls are marked with ``@side_effect``, so the crash test counts them.
"""

from __future__ import annotations

import os
from pathlib import Path

for _name in ("CREWAI_DISABLE_TELEMETRY", "OTEL_SDK_DISABLED"):  # offline: no telemetry, no tracing prompt
    os.environ.setdefault(_name, "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.flow.flow import Flow, start  # noqa: E402
from crewai.flow.persistence import SQLiteFlowPersistence, persist  # noqa: E402
from crewai.tools import tool  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from replaysafe_crewai import replay_safe_crew  # noqa: E402
from replaysafe_crewai.testing import ScriptedLLM  # noqa: E402

from replaysafe import Ledger, open_ledger  # noqa: E402
from replaysafe.testing import Script, ScriptedCall, side_effect  # noqa: E402

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


@tool("lookup_order")
def lookup_order(order_id: str) -> dict[str, object]:
    """Look an order up."""
    return {"order_id": order_id, "customer": "ana@example.com", "total_cents": 4200}


@tool("refund_order")
def refund_order(order_id: str, amount_cents: int) -> str:
    """Refund an order."""
    return bank_refund(order_id, amount_cents)


@tool("email_customer")
def email_customer(to: str, text: str) -> str:
    """Email a customer."""
    return smtp_send(to, text)


def build_crew(ledger: Ledger, thread_id: str) -> Crew:
    """The crew, its agent's tools wrapped; the thread id is the Flow's persisted id."""
    agent = Agent(
        role="support",
        goal="Settle the customer's complaint",
        backstory="A support agent who can refund orders.",
        llm=ScriptedLLM(script=SCRIPT),
        tools=[lookup_order, refund_order, email_customer],
    )
    task = Task(
        description="Ana says order A1 arrived broken: refund it and let her know.",
        expected_output="What was done, in a sentence.",
        agent=agent,
    )
    return replay_safe_crew(Crew(agents=[agent], tasks=[task]), ledger=ledger, thread_id=thread_id)


class SupportState(BaseModel):
    """What the Flow persists: its id (the conversation) and the crew's answer, once there is one."""

    id: str = ""
    answer: str = ""


def run_flow(ledger: Ledger, folder: Path) -> str:
    """Run the conversation to its answer, resuming the persisted Flow if there is one."""

    @persist(SQLiteFlowPersistence(str(folder / "flows.db")))
    class SupportFlow(Flow[SupportState]):
        _skip_auto_memory = True  # CrewAI gives a Flow a vector memory (LanceDB) unless told not to: none needed

        @start()
        def handle(self) -> str:
            if not self.state.answer:  # answered already: the resume returns it
                self.state.answer = build_crew(ledger, self.state.id).kickoff().raw
            return self.state.answer

    return str(SupportFlow().kickoff(inputs={"id": CONVERSATION}))


def main() -> None:
    """The crash test's entry point: state in ``$REPLAYSAFE_CRASHTEST_DIR``, ledger from ``$REPLAYSAFE_LEDGER_URL``."""
    folder = Path(os.environ.get("REPLAYSAFE_CRASHTEST_DIR", ".crewai_agent"))
    folder.mkdir(parents=True, exist_ok=True)
    url = os.environ.get("REPLAYSAFE_LEDGER_URL", f"sqlite:///{folder / 'ledger.db'}")
    with open_ledger(url) as ledger:
        print(run_flow(ledger, folder))


if __name__ == "__main__":
    main()
