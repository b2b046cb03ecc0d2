"""The conformance kit's driver for MCP's client side (``replay_safe_session``).

The agent: a loop over the kit's script (``replaysafe_mcp.testing.play_turn``, the model's calls with fixed
provider-shaped ids) that sends each call over MCP with ``session.call_tool`` inside
``tool_call(thread, message id, tool call id)``, through ``replay_safe_session`` (the control: the SDK's
``Client`` itself). The server is a real MCP server (the official SDK's ``MCPServer``) serving the kit's tools,
connected in-process with ``mcp.Client``: a SIGKILL of the agent kills it with the agent, as a server dies
with the client's process in no deployment, but the client side sees what it sees when its process dies
after sending a call whose effect happened. The loop saves the number of finished turns in the run's folder
once each turn's calls have run; a resume plays the next turn (a turn killed midway is played again).

The session ignores the tools' annotations (``trust_annotations=False``): the kit sets the in-doubt policy
itself (``--policy``), and a tool without hints would otherwise be ``in_doubt="raise"`` whatever the policy.

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import anyio
from mcp import Client
from mcp.server.mcpserver import MCPServer

from replaysafe.testing.conformance import AgentRun
from replaysafe_mcp import replay_safe_session
from replaysafe_mcp.testing import play_turn


def server(run: AgentRun) -> MCPServer:
    """The MCP server of the kit's tools."""
    served = MCPServer("shop")
    for name, function in run.tools.items():
        served.tool(name=name)(function)
    return served


class McpClientDriver:
    #: ``tool_errors``: the MCP server answers a tool's exception with an ``isError`` result, which the session
    #: returns (recorded under ``record_errors``, replayed as it came) and the loop hands over. Approvals are not
    #: driven: MCP's client side has no approval flow of its own to hold a call back for its human.
    offers = frozenset({"tool_errors"})
    not_applicable: ClassVar[dict[str, str]] = {
        "steps": "a tool's steps run in the MCP server, in the server's process, under the server's own call "
        "(ReplaySafeMiddleware's, keyed by the idempotency key the client sends), never under the client's "
        "call that replay_safe_session protects; in this in-process test the server would see the client's "
        "call, which no deployment can. The server side is crash-tested by test_mcp.py (server SIGKILLed "
        "after recording and inside the tool, a client retrying with the same key)."
    }

    async def _run(self, run: AgentRun) -> None:
        path = run.folder / "turns.json"
        turn = json.loads(path.read_text()) if path.exists() else 0
        async with Client(server(run)) as client:
            session: Any = (
                replay_safe_session(client, ledger=run.ledger, trust_annotations=False, **run.options)
                if run.protect
                else client
            )
            while True:
                results = await play_turn(session, run.script, turn, thread_id=run.thread_id, boot=run.boot)
                if isinstance(results, str):
                    return
                # An ``isError`` result (the server's answer to a tool that raised) is handed to the model as the
                # tool's answer, as an MCP host does, and the loop goes on: ``tool_errors``.
                turn += 1
                path.write_text(json.dumps(turn))

    def run(self, run: AgentRun) -> None:
        try:
            anyio.run(self._run, run)
        except Exception as error:
            raise alone(error) from None


def alone(error: BaseException) -> BaseException:
    """The one error an exception group holds (``mcp.Client``'s task group wraps what its body raises)."""
    inner: Any = getattr(error, "exceptions", None)
    while inner is not None and len(inner) == 1:
        error = inner[0]
        inner = getattr(error, "exceptions", None)
    return error


DRIVER = McpClientDriver()
