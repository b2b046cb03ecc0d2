"""A 10xGraph support agent, crash-tested offline: ``replaysafe crashtest examples/tenxgraph_agent.py:main``.

10xGraph needs Python 3.12: run it with the adapter's environment (``integrations/tenxgraph/.venv312``).

The agent has ``ReactAgent``'s shape (a model node, a ``ToolNode``, back to the model while it asks for tools):
it refunds an order, then emails the customer (two model turns, two tools, each calling a provider), its tools
wrapped by ``replay_safe_tools``. Its model is scripted (``replaysafe_tenxgraph.testing.scripted_model``): it
answers as a real one would, with OpenAI-shaped ids, and the same way in every process, so a crashed run and
the run that resumes it see the same calls. In production, ``ReactAgent(model="openai/gpt-4o-mini",
tools=replay_safe_tools([...], ledger=ledger))`` builds the same graph around a real model.

``main()`` follows the crash test's contract: the thread lives in 10xGraph's ``SqliteCheckpointer``, a file in
``$REPLAYSAFE_CRASHTEST_DIR``, and a run that finds it there resumes it (``{"messages": []}`` on the same
``thread_id``); the ledger is ``$REPLAYSAFE_LEDGER_URL``. Outside a crash test,
``python examples/tenxgraph_agent.py`` runs it once in a temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from replaysafe_tenxgraph import replay_safe_tools
from replaysafe_tenxgraph.testing import scripted_model
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import TextBlock
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.utils.constants import END

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
THREAD = {"thread_id": "support-ana-a1042"}


def route(state: AgentState) -> str:
    """``ReactAgent``'s routing: to the tools while the model asks for them."""
    last = state.context[-1] if state.context else None
    return "TOOL" if last is not None and last.role == "assistant" and last.tools_calls else END


async def run_agent(folder: Path, ledger_url: str) -> str:
    """Run the support thread to its end, resuming it from its checkpoint if a crash interrupted it."""
    checkpointer: SqliteCheckpointer[AgentState] = SqliteCheckpointer(folder / "checkpoints.db")
    with open_ledger(ledger_url) as ledger:
        graph: StateGraph[AgentState] = StateGraph()
        graph.add_node("MAIN", scripted_model(SCRIPT))
        graph.add_node("TOOL", ToolNode(replay_safe_tools([refund_order, send_email], ledger=ledger)))
        graph.add_conditional_edges("MAIN", route, {"TOOL": "TOOL", END: END})
        graph.add_edge("TOOL", "MAIN")
        graph.set_entry_point("MAIN")
        async with graph.compile(checkpointer=checkpointer) as app:
            saved = await checkpointer.aget_state(THREAD)
            if saved is None:  # a new thread
                ask = Message.text_message("Order A1042 arrived broken: please refund it and let me know.")
                await app.ainvoke({"messages": [ask]}, config=THREAD)
            elif saved.execution_meta.current_node != END:  # a crash interrupted it: resume it where it was
                await app.ainvoke({"messages": []}, config=THREAD)
            state = await checkpointer.aget_state(THREAD)
    last = state.context[-1] if state is not None and state.context else None
    return " ".join(block.text for block in (last.content if last else []) if isinstance(block, TextBlock))


async def main() -> None:
    """The crash test's entry point."""
    await run_agent(Path(os.environ["REPLAYSAFE_CRASHTEST_DIR"]), os.environ["REPLAYSAFE_LEDGER_URL"])


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        print(asyncio.run(run_agent(Path(directory), f"sqlite:///{Path(directory) / 'ledger.db'}")))
