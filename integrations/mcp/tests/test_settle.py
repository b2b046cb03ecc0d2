"""Settling an in-doubt MCP call with `replaysafe ledger resolve`, replayed for real through this adapter.

An MCP call records its ``CallToolResult``, so a replay reads only that: ``--result '"refunded"'`` used to be
written, said "settled", and every replay then raised ``RecordUnreadableError``. The command now knows the
shape from the ``replaysafe.result_shapes`` entry point this package declares (``replaysafe_mcp._shape``, loaded
without the MCP SDK), refuses a ``--result`` a replay could not read when the ledger shows the call is an MCP
call, and writes ``--text`` as a ``CallToolResult`` holding one text block.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import io
import json
import os
import signal
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

import replaysafe.testing
from replaysafe import CallInfo, CallKey, Record, SqliteLedger, Status, tool_call
from replaysafe._cli import main
from replaysafe_mcp import META_KEY, replay_safe_session

from mcp_harness import WAIT, HttpServer, connect, effects, kill_server, server_env, wait_for_file

CLIENT = Path(__file__).with_name("mcp_client.py")
#: The ids mcp_client.py calls refund under, and its arguments.
AGENT_CALL = CallKey("t-mcp", "msg_1", "call_1")
SECRET = "refunded-SECRET-5521"  # a result value no message may repeat


def ledger_cli(url: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`replaysafe ledger --ledger sqlite:///URL ...`, as an operator runs it, in this process as a new one would
    run it (the main suite's tests/cli.py, which this package's tests cannot import): its own stdin, stdout and
    stderr, Python's default warning filters, none of the caller's context variables, replaysafe's process-wide
    state as a fresh import has it, the exit status of its SystemExit or, for an uncaught exception, a traceback
    and 1. The entry point itself, in a process of its own, is the main suite's to prove (tests/test_cli.py,
    tests/test_ledger_cli.py); the shape's entry point loads there without the MCP SDK (the last test here)."""
    argv = ["ledger", "--ledger", f"sqlite:///{url}", *args]
    out, err = io.StringIO(), io.StringIO()
    stdin_before, sys.stdin = sys.stdin, io.StringIO(stdin)
    replaysafe.testing.reset()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.resetwarnings()  # then Python's defaults (this suite makes every warning an error)
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
            try:
                code: object = contextvars.Context().run(main, argv)
            except SystemExit as exc:  # argparse: a usage error
                code = exc.code
            except Exception:
                traceback.print_exc()
                code = 1
            if not (code is None or isinstance(code, int)):
                print(code, file=sys.stderr)
                code = 1
            gc.collect()  # what the command left to the collector is collected under its own warning filters
    finally:
        sys.stdin = stdin_before
        replaysafe.testing.reset()
    return subprocess.CompletedProcess(["replaysafe", *argv], (code or 0) & 0xFF, out.getvalue(), err.getvalue())


def record_of(path: Path, key: CallKey) -> Record:
    with SqliteLedger(path) as ledger:
        record: Record | None = ledger.get(key)
    assert record is not None
    return record


@pytest.fixture
def control(tmp_path: Path) -> Path:
    path = tmp_path / "control"
    path.mkdir()
    return path


@pytest.fixture
def server(control: Path) -> Iterator[HttpServer]:
    running = HttpServer(control, server_env()).start()
    try:
        yield running
    finally:
        running.stop()


def agent(server: HttpServer, ledger: Path) -> subprocess.Popen[str]:
    """mcp_client.py: refund under AGENT_CALL, with the default the tool's hints give (in_doubt="raise")."""
    args = [sys.executable, str(CLIENT), server.url, str(ledger), "default"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_the_agent_while_its_call_runs(server: HttpServer, control: Path, ledger: Path) -> None:
    """The agent sends refund and is SIGKILLed while the server runs it: its call is in doubt."""
    (control / "block").touch()
    killed = agent(server, ledger)
    try:
        anyio.run(wait_for_file, control / "started")
        killed.send_signal(signal.SIGKILL)
        _, stderr = killed.communicate(timeout=WAIT)
    finally:
        killed.kill()
    assert killed.returncode == -signal.SIGKILL, stderr
    (control / "release").touch()  # the server finishes the refund: it happened, once
    (control / "block").unlink()


def resume(server: HttpServer, ledger: Path) -> subprocess.CompletedProcess[str]:
    resumed = agent(server, ledger)
    stdout, stderr = resumed.communicate(timeout=WAIT)
    return subprocess.CompletedProcess(resumed.args, resumed.returncode or 0, stdout, stderr)


def assert_unchanged(before: Record, after: Record) -> None:
    assert (after.status, after.result, after.attempt, after.owner, after.updated_at) == (
        before.status,
        before.result,
        before.attempt,
        before.owner,
        before.updated_at,
    )


# --- the client side: replay_safe_session ---------------------------------------------------------------


@pytest.mark.slow
def test_a_json_string_for_an_mcp_call_is_refused_and_a_call_tool_result_settles_it_so_the_replay_reads_it(
    server: HttpServer, control: Path, tmp_path: Path
) -> None:
    """The issue's case: the agent refunded A0 earlier, then died while refunding A1. `--result '"..."'` is
    refused (the finished refund shows the call records a CallToolResult), nothing is written and the resumed agent
    is still refused as in doubt (before this change: "settled", then every replay raised RecordUnreadableError).
    refund returns structured content (its output schema), so `--text` alone is refused too; a CallToolResult with
    structuredContent settles it: the resumed agent gets it as recorded, and nothing ran twice."""
    ledger = tmp_path / "agent-ledger.db"

    async def refund_a0() -> None:
        async with connect("http", control, {}, server.url) as raw:
            with SqliteLedger(ledger) as opened:
                session = replay_safe_session(raw, ledger=opened)
                async with tool_call("t-mcp", "msg_0", "call_0"):
                    await session.call_tool("refund", {"order_id": "A0", "amount": 10.0})

    anyio.run(refund_a0)
    kill_the_agent_while_its_call_runs(server, control, ledger)
    before = record_of(ledger, AGENT_CALL)

    refused = ledger_cli(ledger, "resolve", *AGENT_CALL, "--result", json.dumps(SECRET), "--yes")
    still = resume(server, ledger)  # before this change: "settled", and this replay raised RecordUnreadableError
    assert (still.returncode, still.stdout.strip()) == (0, "in-doubt"), still.stderr
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = refused.stderr
    assert "refund (thread_id='t-mcp' message_id='msg_1' tool_call_id='call_1')" in message
    assert "mcp shape (1 of the 1 finished record(s) of refund read here are mcp-shaped)" in message
    assert "a replay could not read this --result: it is a string, not a CallToolResult" in message
    assert '{"content": [{"type": "text", "text": "..."}], "isError": false}' in message  # the shape it expects
    assert "--text TEXT" in message
    assert "Nothing was changed" in message
    assert SECRET not in refused.stdout + refused.stderr
    assert "settled" not in refused.stdout
    assert_unchanged(before, record_of(ledger, AGENT_CALL))

    text_only = ledger_cli(ledger, "resolve", *AGENT_CALL, "--text", SECRET, "--yes")
    assert text_only.returncode == 2, text_only.stdout + text_only.stderr
    assert "the text alone cannot settle it" in text_only.stderr
    assert "finished call(s) of this tool found return structuredContent" in text_only.stderr
    assert SECRET not in text_only.stdout + text_only.stderr
    assert_unchanged(before, record_of(ledger, AGENT_CALL))

    refund = {"order_id": "A1", "amount": 59.0, "refund": SECRET}
    answer = {"content": [{"type": "text", "text": SECRET}], "structuredContent": refund, "isError": False}
    settled = ledger_cli(ledger, "resolve", *AGENT_CALL, "--result", json.dumps(answer), "--yes")
    assert settled.returncode == 0, settled.stdout + settled.stderr
    assert "Shape: mcp" in settled.stdout
    assert SECRET not in settled.stdout + settled.stderr
    replayed = resume(server, ledger)
    assert replayed.returncode == 0, replayed.stderr
    result = CallToolResult.model_validate_json(replayed.stdout)
    assert result == CallToolResult(content=[TextContent(type="text", text=SECRET)], structured_content=refund)
    assert [line.split(" pid=")[0] for line in effects(control)] == ["refund A0 attempt=1", "refund A1 attempt=1"]


@pytest.mark.slow
def test_a_first_mcp_call_in_doubt_says_its_shape_cannot_be_told_and_settles_with_shape_mcp(
    server: HttpServer, control: Path, tmp_path: Path
) -> None:
    """No finished call of the tool, no key space: nothing in the ledger says the call is an MCP call. The
    command says so, and names --shape mcp; --text without a shape is refused; --text --shape mcp settles it."""
    ledger = tmp_path / "agent-ledger.db"
    kill_the_agent_while_its_call_runs(server, control, ledger)
    before = record_of(ledger, AGENT_CALL)

    asked = ledger_cli(ledger, "resolve", *AGENT_CALL, "--result", json.dumps(SECRET), stdin="n\n")
    assert asked.returncode == 4, asked.stdout + asked.stderr
    assert "Shape unknown: what a replay of refund reads cannot be told here" in asked.stdout
    assert "Careful: MCP calls (replaysafe-mcp" in asked.stdout
    assert "answer no and settle it with --text TEXT --shape mcp" in asked.stdout
    assert SECRET not in asked.stdout + asked.stderr
    unnamed = ledger_cli(ledger, "resolve", *AGENT_CALL, "--text", SECRET, "--yes")
    assert unnamed.returncode == 2, unnamed.stdout + unnamed.stderr
    assert "Name the shape" in unnamed.stderr
    assert "--shape mcp" in unnamed.stderr
    assert SECRET not in unnamed.stdout + unnamed.stderr
    assert_unchanged(before, record_of(ledger, AGENT_CALL))

    settled = ledger_cli(ledger, "resolve", *AGENT_CALL, "--text", SECRET, "--shape", "mcp", "--yes", "--json")
    assert settled.returncode == 0, settled.stdout + settled.stderr
    document = json.loads(settled.stdout)
    assert (document["how"], document["shape"]) == ("text", "mcp")
    replayed = resume(server, ledger)
    assert replayed.returncode == 0, replayed.stderr
    assert CallToolResult.model_validate_json(replayed.stdout).content == [TextContent(type="text", text=SECRET)]
    assert [line.split(" pid=")[0] for line in effects(control)] == ["refund A1 attempt=1"]


# --- the server side: ReplaySafeMiddleware ----------------------------------------------------------------


@pytest.mark.slow
async def test_an_in_doubt_server_call_is_told_by_its_key_space_and_settled_in_its_shape(control: Path) -> None:
    """The server died inside refund; its call under `mcp-server:payments` is in doubt (in_doubt="raise"). The key
    space tells the shape: `--result '"..."'` is refused and the retry is still refused as in doubt. No finished
    refund shows its output schema, so `--text` says what it cannot check; a CallToolResult with structuredContent
    settles it, and the retry is answered from the record without running the tool again."""
    env = server_env({"in_doubt": "raise"})
    key = CallInfo("t-srv", "msg_1", "call_1", "refund", 1).idempotency_key
    arguments: dict[str, Any] = {"order_id": "A1", "amount": 59.0}
    (control / "block").touch()
    answered = False
    try:
        async with connect("stdio", control, env) as raw:

            async def call() -> None:
                nonlocal answered
                await raw.call_tool("refund", arguments, meta={META_KEY: key})
                answered = True

            async with anyio.create_task_group() as group:
                group.start_soon(call)
                await wait_for_file(control / "started")
                kill_server(control)
    except Exception:  # the connection died with the server
        pass
    assert not answered
    (control / "block").unlink()
    server_ledger = control / "server-ledger.db"
    server_call = CallKey("mcp-server:payments", "refund", key)
    before = record_of(server_ledger, server_call)

    refused = ledger_cli(server_ledger, "resolve", *server_call, "--result", json.dumps(SECRET), "--yes")
    async with connect("stdio", control, env) as raw:
        # Still refused as in doubt. Before this change: "settled", and the server's replay of the record failed.
        with pytest.raises(MCPError, match="in doubt"):
            await raw.call_tool("refund", arguments, meta={META_KEY: key})
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "its thread id is in the key space 'mcp-server:'" in refused.stderr
    assert "a replay could not read this --result" in refused.stderr
    assert SECRET not in refused.stdout + refused.stderr
    assert_unchanged(before, record_of(server_ledger, server_call))

    asked = ledger_cli(server_ledger, "resolve", *server_call, "--text", SECRET, stdin="n\n")
    assert asked.returncode == 4, asked.stdout + asked.stderr
    assert "Not checked: no finished call of refund is found to compare with" in asked.stdout
    assert "checks structuredContent against the tool's output schema" in asked.stdout
    assert_unchanged(before, record_of(server_ledger, server_call))

    refund = {**arguments, "refund": SECRET}
    answer = {"content": [{"type": "text", "text": SECRET}], "structuredContent": refund, "isError": False}
    settled = ledger_cli(server_ledger, "resolve", *server_call, "--result", json.dumps(answer), "--yes")
    assert settled.returncode == 0, settled.stdout + settled.stderr
    async with connect("stdio", control, env) as raw:
        replayed = await raw.call_tool("refund", arguments, meta={META_KEY: key})
    assert not replayed.is_error
    assert replayed.content == [TextContent(type="text", text=SECRET)]
    assert replayed.structured_content == refund
    assert record_of(server_ledger, server_call).status is Status.COMPLETED
    assert [line.split(" pid=")[0] for line in effects(control)] == ["refund A1 attempt=1"]


# --- the shape itself -------------------------------------------------------------------------------------


def test_the_command_loads_the_shape_without_importing_the_mcp_sdk(tmp_path: Path) -> None:
    """The entry point resolves in a process that imports neither mcp nor fastmcp."""
    code = (
        "import sys\n"
        "from replaysafe._shapes import installed\n"
        "known = installed()\n"
        "print(sorted(known.shapes), list(known.skipped))\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mcp', 'mcp_types', 'fastmcp', 'pydantic'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=os.environ, check=True
    )
    assert done.stdout.splitlines() == ["['json', 'mcp'] []", "[]"]
