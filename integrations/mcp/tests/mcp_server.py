"""The fastmcp server of the MCP tests, run as a subprocess: ``mcp_server.py CONTROL stdio|http [PORT]``.

Its tools append one line per run to ``CONTROL/effects`` (outside every process, so a count
survives SIGKILLs). Flag files in CONTROL steer it: with ``block`` present, ``refund`` writes
``CONTROL/started`` after its effect and waits for ``CONTROL/release``; with ``crash-after-record``
present, the server SIGKILLs itself once a keyed call's result is recorded, before it answers
(the flag is removed first, so a restarted server answers). It writes its pid to ``CONTROL/pid``.
``REPLAYSAFE_TEST_OPTIONS`` holds the middleware's options as JSON; ``REPLAYSAFE_TEST_KEYED=0``
runs the server without the middleware.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import mcp_types as mt
from fastmcp import FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import ToolResult
from mcp.types import ToolAnnotations

from replaysafe import SqliteLedger, current_call_or_none
from replaysafe_mcp import ReplaySafeMiddleware

CONTROL = Path(sys.argv[1])
WAIT = 60.0


def append(line: str) -> None:
    # O_APPEND writes of one short line are atomic across processes.
    fd = os.open(CONTROL / "effects", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class CrashAfterRecord(Middleware):
    """Outside ReplaySafeMiddleware: the result is recorded when ``call_next`` returns here."""

    async def on_call_tool(
        self,
        context: MiddlewareContext[mt.CallToolRequestParams],
        call_next: CallNext[mt.CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        result = await call_next(context)
        flag = CONTROL / "crash-after-record"
        if flag.exists():
            flag.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return result


def build() -> FastMCP:
    middleware: list[Middleware] = [CrashAfterRecord()]
    if os.environ.get("REPLAYSAFE_TEST_KEYED", "1") == "1":
        options: dict[str, Any] = json.loads(os.environ.get("REPLAYSAFE_TEST_OPTIONS", "{}"))
        middleware.append(ReplaySafeMiddleware(SqliteLedger(CONTROL / "server-ledger.db"), **options))
    server = FastMCP(os.environ.get("REPLAYSAFE_TEST_NAME", "payments"), middleware=middleware)

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
    async def refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order: the side effect the tests count."""
        call = current_call_or_none()
        append(f"refund {order_id} attempt={call.attempt if call else 0} pid={os.getpid()}")
        if (CONTROL / "block").exists():
            (CONTROL / "started").write_text(str(os.getpid()))
            deadline = time.monotonic() + WAIT
            while not (CONTROL / "release").exists() and time.monotonic() < deadline:
                await _sleep()
        return {"order_id": order_id, "amount": amount, "refund": f"re_{order_id}"}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def lookup(order_id: str) -> str:
        """Read an order: read-only, never claimed by the client."""
        append(f"lookup {order_id}")
        return f"order {order_id}"

    @server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True))
    def tag(order_id: str) -> str:
        """Tag an order: idempotent, so the client keeps the library's in-doubt default."""
        append(f"tag {order_id}")
        return f"tagged {order_id}"

    @server.tool
    def fail(order_id: str) -> str:
        """A tool whose failure reaches the client as an isError result."""
        append(f"fail {order_id}")
        raise ValueError(f"cannot process {order_id}")

    return server


async def _sleep() -> None:
    import anyio

    await anyio.sleep(0.05)


def main() -> None:
    (CONTROL / "pid").write_text(str(os.getpid()))
    server = build()
    if sys.argv[2] == "stdio":
        server.run(transport="stdio", show_banner=False)
    else:
        server.run(transport="http", host="127.0.0.1", port=int(sys.argv[3]), show_banner=False, log_level="warning")


if __name__ == "__main__":
    main()
