"""A support agent whose tools are served over MCP, crash-tested offline.

    replaysafe crashtest examples/mcp_agent.py:main --jobs 2

The model is a script (``replaysafe_mcp.testing.play_turn``) that asks for the calls a model would, with
fixed provider-shaped ids; each call goes over MCP through ``replay_safe_session``, inside the model's ids.
The MCP server (the official SDK's ``MCPServer``) runs in this process for the test, connected with
``mcp.Client``; yours is ``Client(url)`` or ``Client(StdioServerParameters(...))``. The number of finished
turns is saved under ``$REPLAYSAFE_CRASHTEST_DIR``: a run that was killed plays its last turn again, and the
calls that finished replay from the ledger. The tools' MCP annotations set the in-doubt defaults: the
refund (destructive, not idempotent) is refused as in doubt rather than sent twice; the lookup (read-only)
is never claimed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from replaysafe_mcp import replay_safe_session
from replaysafe_mcp.testing import play_turn

from replaysafe import open_ledger
from replaysafe.testing import Script, ScriptedCall, side_effect

#: What the model asks for: look the order up and refund it, then tell the customer.
SCRIPT = Script(
    (
        (ScriptedCall("lookup_order", {"order_id": "1042"}),),
        (
            ScriptedCall("refund_order", {"order_id": "1042"}),
            ScriptedCall("send_email", {"to": "ana@example.com", "body": "Your refund is on its way."}),
        ),
        "Order 1042 is refunded and Ana has been told.",
    ),
    name="mcp-support-1042",
)

server = MCPServer("shop")


@side_effect
def payments_refund(order_id: str) -> str:
    """The payment provider's API call: the side effect the crash test counts."""
    return f"re_{order_id}"


@side_effect
def mail_send(to: str, body: str) -> str:
    """The mail provider's API call."""
    return f"sent to {to}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup_order(order_id: str) -> dict[str, Any]:
    """Read an order."""
    return {"order_id": order_id, "amount": 59.0, "status": "paid"}


@server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
def refund_order(order_id: str) -> str:
    """Refund an order in full."""
    return payments_refund(order_id)


@server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False))
def send_email(to: str, body: str) -> str:
    """Email a customer."""
    return mail_send(to, body)


async def agent(folder: Path) -> None:
    saved = folder / "turns.json"
    turn = json.loads(saved.read_text()) if saved.exists() else 0
    with open_ledger(os.environ.get("REPLAYSAFE_LEDGER_URL", f"sqlite:///{folder / 'ledger.db'}")) as ledger:
        async with Client(server) as client:
            session = replay_safe_session(client, ledger=ledger)
            while True:
                results = await play_turn(session, SCRIPT, turn, thread_id="support-1042")
                if isinstance(results, str):
                    print(results)
                    return
                turn += 1
                saved.write_text(json.dumps(turn))  # once the turn's calls have run


def main() -> None:
    try:
        anyio.run(agent, Path(os.environ.get("REPLAYSAFE_CRASHTEST_DIR", ".")))
    except Exception as error:  # mcp.Client's task group wraps what its body raises: raise the error itself
        while len(getattr(error, "exceptions", ())) == 1:
            error = error.exceptions[0]  # type: ignore[attr-defined]
        raise error from None


if __name__ == "__main__":
    main()
