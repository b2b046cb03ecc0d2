"""The agent of the two-sided MCP crash test, run as ``mcp_client.py URL LEDGER default|rerun``.

Inside ``tool_call("t-mcp", "msg_1", "call_1")`` it calls the server's ``refund`` through
``replay_safe_session`` (with ``in_doubt="rerun"``, or the default the tool's annotations give)
and prints the ``CallToolResult`` as JSON, or ``in-doubt`` when the call is refused as in doubt.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
from mcp import Client

from replaysafe import CallInDoubtError, SqliteLedger, tool_call
from replaysafe_mcp import replay_safe_session


async def main() -> None:
    url, ledger_path, policy = sys.argv[1:]
    options: dict[str, Any] = {"in_doubt": "rerun"} if policy == "rerun" else {}
    async with Client(url) as client:
        session = replay_safe_session(client, ledger=SqliteLedger(ledger_path), **options)
        try:
            async with tool_call("t-mcp", "msg_1", "call_1"):
                result = await session.call_tool("refund", {"order_id": "A1", "amount": 59.0})
        except CallInDoubtError:
            print("in-doubt")
            return
    print(result.model_dump_json(by_alias=True))


if __name__ == "__main__":
    anyio.run(main)
