"""Child process of the crash tests: run one agent turn, or resume it after a crash.

``crash``: the model emits ``refund_order`` and ``send_email`` as two parallel tool
calls; ``send_email`` waits until the refund has returned (and, with the adapter, been
recorded), then SIGKILLs its own process before it sends anything. ``resume``: a new
process continues the same thread with ``invoke(None, config)``.

Both tools append a line to the effects file when they act, so the parent counts
side effects. Tools run one at a time (``max_concurrency=1``): with ``create_agent`` the
refund's own result, which LangGraph saves in the background once its task is done,
is still queued behind ``send_email`` when the kill lands. ``--kill-when saved`` (SQLite,
sync) lets the tools run side by side, as LangGraph runs them by default, and kills only
once LangGraph has saved the refund's result in the checkpointer. ``durability="sync"``
makes sure the model's message is checkpointed before any tool runs, so the resume replays
the same model output: the precondition of any ledger.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.prebuilt import ToolNode

import replaysafe
from replaysafe import CallKey, SqliteLedger, Status
from replaysafe_langgraph import ReplaySafeMiddleware, replay_safe_tool_node

from _langgraph_fakes import agent_graph, final_answer, refund_and_email, scripted, state_graph, summary

#: The default lease: a killed owner on this machine is detected at once, without waiting for it.
LEASE = None
#: How long send_email waits for the refund before giving up (a broken test, not a timing check).
WAIT_FOR_REFUND = 60.0
EXIT_REFUND_NEVER_FINISHED = 3


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["crash", "resume"])
    parser.add_argument("--graph", choices=["toolnode", "agent"], required=True)
    parser.add_argument("--checkpointer", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--mode", choices=["sync", "async"], required=True)
    parser.add_argument(
        "--tools",
        choices=["off", "plain", "decorated"],
        required=True,
        help="off: no adapter; plain: undecorated tools protected by the adapter; "
        "decorated: @replay_safe tools keyed by the adapter",
    )
    parser.add_argument("--checkpoint-url", required=True, help="SQLite file or Postgres URL")
    parser.add_argument("--ledger", required=True, help="SqliteLedger file")
    parser.add_argument("--effects", required=True, help="file the tools append a line to per side effect")
    parser.add_argument("--thread", required=True)
    parser.add_argument("--in-doubt", help="the run's in_doubt setting, in config['configurable']")
    parser.add_argument(
        "--kill-when",
        choices=["returned", "saved"],
        default="returned",
        help="returned: once the refund returned (and was recorded, with the adapter), tools run one at a time; "
        "saved: once LangGraph saved the refund's result in the checkpointer (SQLite), tools side by side",
    )
    return parser.parse_args()


def effect(path: Path, line: str) -> None:
    with path.open("a") as file:
        file.write(line + "\n")


def make_tools(args: argparse.Namespace, ledger: SqliteLedger | None) -> list[BaseTool]:
    effects = Path(args.effects)
    refund_key = CallKey(args.thread, "msg-turn1-tools", "call_1")

    def refund_has_returned() -> bool:
        lines = effects.read_text().splitlines() if effects.exists() else []
        if not any(line.startswith("refund_order") for line in lines):
            return False
        if args.kill_when == "saved":
            return refund_is_saved(args)
        if ledger is None:
            return True
        record = ledger.get(refund_key)
        return record is not None and record.status is Status.COMPLETED

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        effect(effects, f"refund_order {order_id}")
        return f"refunded {order_id}"

    def send_email(to: str) -> str:
        """Email the customer."""
        if args.phase == "crash":
            deadline = time.monotonic() + WAIT_FOR_REFUND
            while not refund_has_returned():
                if time.monotonic() > deadline:
                    os._exit(EXIT_REFUND_NEVER_FINISHED)
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        effect(effects, f"send_email {to}")
        return f"sent to {to}"

    if args.tools == "decorated":
        return [
            tool(replaysafe.replay_safe(lease=LEASE)(refund_order)),
            tool(replaysafe.replay_safe(lease=LEASE)(send_email)),
        ]
    return [tool(refund_order), tool(send_email)]


def refund_is_saved(args: argparse.Namespace) -> bool:
    """Whether LangGraph saved the refund's result: a pending write of the thread's last checkpoint holds it."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(args.checkpoint_url) as saver:  # a connection of its own
        saved = saver.get_tuple({"configurable": {"thread_id": args.thread}})
    return saved is not None and any("refunded A1" in repr(value) for _, _, value in saved.pending_writes or ())


@contextlib.contextmanager
def sync_checkpointer(args: argparse.Namespace) -> Iterator[BaseCheckpointSaver[Any]]:
    if args.checkpointer == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        with SqliteSaver.from_conn_string(args.checkpoint_url) as saver:
            yield saver
    else:
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(args.checkpoint_url) as saver:
            saver.setup()
            yield saver


@contextlib.asynccontextmanager
async def async_checkpointer(args: argparse.Namespace) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    if args.checkpointer == "sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(args.checkpoint_url) as saver:
            yield saver
    else:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        async with AsyncPostgresSaver.from_conn_string(args.checkpoint_url) as saver:
            await saver.setup()
            yield saver


def build(args: argparse.Namespace, ledger: SqliteLedger | None, checkpointer: BaseCheckpointSaver[Any]) -> Any:
    # The crash run's model answers turn 1 with the two calls; the resumed run's model
    # is only ever asked for the final answer (asking it again would fail the run).
    model = scripted(refund_and_email(1)) if args.phase == "crash" else scripted(final_answer(1))
    tools = make_tools(args, ledger)
    adapter = args.tools != "off"
    if args.graph == "toolnode":
        node = replay_safe_tool_node(tools, ledger=ledger, lease=LEASE) if adapter else ToolNode(tools)
        return state_graph(model, node, checkpointer)
    middleware = [ReplaySafeMiddleware(ledger, lease=LEASE)] if adapter else []
    return agent_graph(model, tools, middleware, checkpointer)


def main() -> None:
    args = parse()
    ledger = SqliteLedger(args.ledger) if args.tools != "off" else None
    config: Any = {"configurable": {"thread_id": args.thread}}
    if args.kill_when == "returned":
        config["max_concurrency"] = 1
    if args.in_doubt:
        config["configurable"]["in_doubt"] = args.in_doubt
    request = {"messages": [HumanMessage("Refund order A1 and tell the customer.", id="human-turn1")]}
    if args.mode == "sync":
        with sync_checkpointer(args) as checkpointer:
            graph = build(args, ledger, checkpointer)
            if args.phase == "crash":
                graph.invoke(request, config, durability="sync")
                sys.exit("the crash run finished: send_email should have killed it")
            out = graph.invoke(None, config)
    else:

        async def run() -> Any:
            async with async_checkpointer(args) as checkpointer:
                graph = build(args, ledger, checkpointer)
                if args.phase == "crash":
                    await graph.ainvoke(request, config, durability="sync")
                    sys.exit("the crash run finished: send_email should have killed it")
                return await graph.ainvoke(None, config)

        out = asyncio.run(run())
    print(json.dumps(summary(out["messages"])))


if __name__ == "__main__":
    main()
