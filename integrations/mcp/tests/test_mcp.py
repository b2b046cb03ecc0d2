"""replaysafe-mcp against a real fastmcp server in a subprocess (stdio and streamable HTTP) and the official SDK."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, ToolAnnotations

from replaysafe import CallInfo, CallKey, SqliteLedger, Status, UnprotectedCallWarning, replay_safe, tool_call
from replaysafe_mcp import META_KEY, ReplaySafeMiddleware, in_doubt_default, replay_safe_session

from mcp_harness import WAIT, HttpServer, Transport, connect, effects, kill_server, server_env, wait_for_file

CLIENT = Path(__file__).with_name("mcp_client.py")
TRANSPORTS: list[Transport] = ["stdio", "http"]
REFUND = {"order_id": "A1", "amount": 59.0}
REFUNDED = {"order_id": "A1", "amount": 59.0, "refund": "re_A1"}


@pytest.fixture
def control(tmp_path: Path) -> Path:
    path = tmp_path / "control"
    path.mkdir()
    return path


@pytest.fixture
def client_ledger(tmp_path: Path) -> Iterator[SqliteLedger]:
    with SqliteLedger(tmp_path / "client-ledger.db") as ledger:
        yield ledger


def server_records(control: Path) -> list[Any]:
    with SqliteLedger(control / "server-ledger.db") as ledger:
        return list(ledger.records())


def key_of(thread: str, message: str, call: str, tool: str) -> str:
    return CallInfo(thread, message, call, tool, 1).idempotency_key


#: The key replay_safe_session sends for refund under ("t-srv", "msg_1", "call_1").
KEY = key_of("t-srv", "msg_1", "call_1", "refund")


class Servers:
    """Connects over one transport; for HTTP, starts (and restarts) the server process itself."""

    def __init__(self, transport: Transport, control: Path, env: dict[str, str]) -> None:
        self.transport = transport
        self.control = control
        self.env = env
        self.http = HttpServer(control, env) if transport == "http" else None

    def start(self) -> None:
        if self.http is not None:
            self.http.start()

    def connect(self) -> Any:
        return connect(self.transport, self.control, self.env, self.http.url if self.http else None)

    def kill(self) -> None:
        if self.http is not None:
            self.http.kill()
        else:
            kill_server(self.control)

    def stop(self) -> None:
        if self.http is not None:
            self.http.stop()


@pytest.fixture
def servers(request: pytest.FixtureRequest, control: Path) -> Iterator[Servers]:
    transport, options = request.param if isinstance(request.param, tuple) else (request.param, {})
    running = Servers(transport, control, server_env(options))
    running.start()
    try:
        yield running
    finally:
        running.stop()


# --- crashes of the server -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("servers", TRANSPORTS, indirect=True)
async def test_server_killed_after_recording_is_restarted_and_returns_the_recorded_result(
    servers: Servers, control: Path, client_ledger: SqliteLedger
) -> None:
    """The server ran the tool and recorded it, then died before answering; the retry is answered
    from the record: the tool ran once."""
    (control / "crash-after-record").touch()
    answered = False
    try:
        # The first attempt, sent with the key replay_safe_session sends for these ids.
        async with servers.connect() as raw:
            await raw.call_tool("refund", REFUND, meta={META_KEY: KEY})
            answered = True
    except Exception:  # the connection died with the server (over HTTP, raised when the client closes)
        pass
    assert not answered
    assert effects(control)[0].startswith("refund A1 attempt=1")

    servers.stop()
    servers.start()
    async with servers.connect() as raw:
        session = replay_safe_session(raw, ledger=client_ledger)
        async with tool_call("t-srv", "msg_1", "call_1"):
            result = await session.call_tool("refund", REFUND)
    assert result.structured_content == REFUNDED
    assert len(effects(control)) == 1  # the restarted server answered from its record
    (record,) = server_records(control)
    assert record.key == CallKey("mcp-server:payments", "refund", KEY)
    assert record.status is Status.COMPLETED
    (client_record,) = client_ledger.records()
    assert client_record.status is Status.COMPLETED


@pytest.mark.slow
@pytest.mark.parametrize(
    ("servers", "policy"),
    [(("stdio", {"in_doubt": "raise"}), "raise"), (("http", {"in_doubt": "raise"}), "raise"), ("http", "rerun")],
    indirect=["servers"],
)
async def test_server_killed_inside_the_tool_settles_the_retry_by_its_in_doubt_policy(
    servers: Servers, policy: str, control: Path, client_ledger: SqliteLedger
) -> None:
    """SIGKILL while the tool runs: the retry with the same key is in doubt on the restarted server.
    ``raise`` refuses it with an MCP error naming the call; ``rerun`` runs it as attempt 2."""
    (control / "block").touch()
    answered = False
    try:
        async with servers.connect() as raw:

            async def call() -> None:
                nonlocal answered
                await raw.call_tool("refund", REFUND, meta={META_KEY: key_of("t-doubt", "msg_1", "call_1", "refund")})
                answered = True

            async with anyio.create_task_group() as group:
                group.start_soon(call)
                await wait_for_file(control / "started")
                servers.kill()
    except Exception:  # the connection died with the server
        pass
    assert not answered
    (control / "block").unlink()
    servers.stop()
    servers.start()

    async with servers.connect() as raw:
        session = replay_safe_session(raw, ledger=client_ledger, in_doubt="rerun")
        if policy == "raise":
            with pytest.raises(MCPError, match=r"'refund'.*in doubt.*settles it"):
                async with tool_call("t-doubt", "msg_1", "call_1"):
                    await session.call_tool("refund", REFUND)
            assert [line.split(" pid=")[0] for line in effects(control)] == ["refund A1 attempt=1"]
        else:
            async with tool_call("t-doubt", "msg_1", "call_1"):
                result = await session.call_tool("refund", REFUND)
            assert result.structured_content == REFUNDED
            assert [line.split(" pid=")[0] for line in effects(control)] == [
                "refund A1 attempt=1",
                "refund A1 attempt=2",
            ]


# --- both sides: the client dies after sending ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["rerun", "default", "unkeyed-server"])
def test_client_killed_after_sending_resumes_and_the_tool_runs_once(policy: str, control: Path, tmp_path: Path) -> None:
    """The agent is SIGKILLed while the server runs its call; a new agent process resumes the call.
    With ``in_doubt="rerun"`` it sends the same key and gets the first run's result: the tool ran
    once. By default (``refund`` is destructive and not idempotent) the resumed call is refused.
    Against a server without the middleware, the same resume runs the tool a second time."""
    (control / "block").touch()
    server = HttpServer(control, server_env(keyed=policy != "unkeyed-server")).start()
    try:
        ledger = tmp_path / "agent-ledger.db"
        args = [sys.executable, str(CLIENT), server.url, str(ledger), "default" if policy == "default" else "rerun"]
        agent = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            anyio.run(wait_for_file, control / "started")
            agent.send_signal(signal.SIGKILL)
            _, stderr = agent.communicate(timeout=WAIT)
        finally:
            agent.kill()
        assert agent.returncode == -signal.SIGKILL, stderr

        resumed = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # The first request may still be running when the second arrives (which then waits for it)
        # or have finished (the second gets its record): either way the tool must not run again.
        (control / "release").touch()
        stdout, stderr = resumed.communicate(timeout=300)
        assert resumed.returncode == 0, stderr
    finally:
        server.stop()

    if policy == "unkeyed-server":
        assert [line.split(" pid=")[0] for line in effects(control)] == ["refund A1 attempt=0"] * 2
        return
    assert [line.split(" pid=")[0] for line in effects(control)] == ["refund A1 attempt=1"]
    if policy == "default":
        assert stdout.strip() == "in-doubt"
        return
    result = CallToolResult.model_validate_json(stdout)
    assert result.structured_content == REFUNDED
    (record,) = server_records(control)
    assert record.status is Status.COMPLETED
    assert record.attempt == 1
    with SqliteLedger(ledger) as agent_ledger:
        (agent_record,) = agent_ledger.records()
    assert agent_record.status is Status.COMPLETED
    assert agent_record.attempt == 2


# --- the client side ------------------------------------------------------------------------------


@pytest.mark.parametrize("servers", ["stdio"], indirect=True)
async def test_a_replay_returns_the_recorded_result_exactly_without_sending(
    servers: Servers, control: Path, client_ledger: SqliteLedger
) -> None:
    """Content blocks, structured content, isError and _meta come back equal, as a CallToolResult (an isError
    result too, with record_errors=True: recorded as it came)."""
    async with servers.connect() as raw:
        session = replay_safe_session(raw, ledger=client_ledger, record_errors=True)
        first: list[CallToolResult] = []
        again: list[CallToolResult] = []
        for results in (first, again):
            for call_id, tool, arguments in [("call_1", "refund", REFUND), ("call_2", "fail", {"order_id": "A1"})]:
                async with tool_call("t-replay", "msg_1", call_id):
                    results.append(await session.call_tool(tool, arguments))
    assert first == again
    assert [type(result) for result in again] == [CallToolResult, CallToolResult]
    assert [result.model_dump(by_alias=True) for result in again] == [r.model_dump(by_alias=True) for r in first]
    assert first[0].structured_content == REFUNDED
    assert not first[0].is_error
    assert first[1].is_error
    assert effects(control) == [effects(control)[0], "fail A1"]  # each ran once
    # The server recorded the refund under the key the client sent; the failing tool raised, so the
    # server recorded nothing for it (its isError result was recorded by the client).
    keys = [record.key.tool_call_id for record in server_records(control)]
    assert keys == [key_of("t-replay", "msg_1", "call_1", "refund")]


@pytest.mark.parametrize("servers", ["stdio"], indirect=True)
async def test_an_is_error_result_is_not_recorded_and_a_resume_sends_the_call_again(
    servers: Servers, control: Path, client_ledger: SqliteLedger
) -> None:
    """An isError result is the tool's failure: the caller gets it, the claim is released (no record), and the
    resumed run sends the call again, as every adapter treats a tool that raises (docs/adapters.md section 7)."""
    key = CallKey("t-is-error", "msg_1", "call_1")
    async with servers.connect() as raw:
        session = replay_safe_session(raw, ledger=client_ledger)
        for _ in range(2):
            async with tool_call(*key):
                result = await session.call_tool("fail", {"order_id": "A1"})
            assert isinstance(result, CallToolResult)
            assert result.is_error
            assert client_ledger.get(key) is None
    assert effects(control) == ["fail A1", "fail A1"]


@pytest.mark.parametrize("servers", ["stdio"], indirect=True)
async def test_a_call_outside_tool_call_runs_unprotected_with_the_warning(
    servers: Servers, control: Path, client_ledger: SqliteLedger
) -> None:
    """Without ids the call follows the library's rule for missing ids: a warning naming the tool, then the call
    is sent (without a key) and its result returned; nothing is recorded. It raised a bare AssertionError."""
    async with servers.connect() as raw:
        session = replay_safe_session(raw, ledger=client_ledger)
        with pytest.warns(UnprotectedCallWarning, match="refund"):
            result = await session.call_tool("refund", REFUND)
    assert isinstance(result, CallToolResult)
    assert not result.is_error
    assert [effect.split(" attempt=")[0] for effect in effects(control)] == ["refund A1"]
    assert list(client_ledger.records()) == []
    assert server_records(control) == []  # no key was sent


@pytest.mark.parametrize("servers", ["stdio"], indirect=True)
async def test_annotations_set_the_defaults_and_trust_annotations_false_ignores_them(
    servers: Servers, control: Path, client_ledger: SqliteLedger, tmp_path: Path
) -> None:
    """A readOnlyHint tool passes through (no claim, no key); ignoring the hints claims it too."""
    async with servers.connect() as raw:
        session = replay_safe_session(raw, ledger=client_ledger)
        for _ in range(2):
            async with tool_call("t-read", "msg_1", "call_1"):
                await session.call_tool("lookup", {"order_id": "A1"})
        assert effects(control) == ["lookup A1", "lookup A1"]
        assert list(client_ledger.records()) == []
        assert server_records(control) == []  # no key was sent

        with SqliteLedger(tmp_path / "distrust.db") as other:
            distrusting = replay_safe_session(raw, ledger=other, trust_annotations=False)
            for _ in range(2):
                async with tool_call("t-read", "msg_1", "call_1"):
                    await distrusting.call_tool("lookup", {"order_id": "A1"})
            assert len(list(other.records())) == 1
    assert effects(control) == ["lookup A1"] * 3


def test_options_the_adapter_sets_itself_are_refused() -> None:
    with pytest.raises(TypeError, match="serializer is set by the session"):
        replay_safe_session(object(), serializer=None)
    with pytest.raises(TypeError, match="exclude_args, name is set by the middleware"):
        ReplaySafeMiddleware(None, name="x", exclude_args=())


def test_in_doubt_defaults_follow_the_protocol_defaults_of_the_hints() -> None:
    assert in_doubt_default(None) == "raise"  # no hints: destructive, not idempotent
    assert in_doubt_default(ToolAnnotations(destructive_hint=True)) == "raise"
    assert in_doubt_default(ToolAnnotations(destructive_hint=True, idempotent_hint=True)) is None
    assert in_doubt_default(ToolAnnotations(destructive_hint=False)) is None


@pytest.mark.parametrize("servers", ["http"], indirect=True)
async def test_a_call_inside_another_protected_tool_is_keyed_by_that_call(
    servers: Servers, control: Path, client_ledger: SqliteLedger
) -> None:
    """call_tool from inside a protected tool is covered by that tool's record and carries its key."""
    async with servers.connect() as raw:
        session = replay_safe_session(raw, ledger=client_ledger)

        @replay_safe(ledger=client_ledger)
        async def refund_and_tag() -> str:
            await session.call_tool("refund", REFUND)
            tagged = await session.call_tool("tag", {"order_id": "A1"})
            return str(tagged.structured_content)

        for _ in range(2):
            async with tool_call("t-nested", "msg_1", "call_1"):
                await refund_and_tag()
    (record,) = client_ledger.records()
    assert record.tool_name == "refund_and_tag"
    outer = key_of("t-nested", "msg_1", "call_1", "refund_and_tag")
    assert sorted(r.key.tool_call_id for r in server_records(control)) == [f"{outer}:1", f"{outer}:2"]
    assert len(effects(control)) == 2


# --- the server side ------------------------------------------------------------------------------


@pytest.mark.parametrize("servers", [("stdio", {"wait_timeout": 1})], indirect=True)
async def test_server_dedupes_by_key_and_runs_calls_without_one_as_before(servers: Servers, control: Path) -> None:
    """Raw SDK calls: the same key twice runs once; no key runs every time; a key reused with other
    arguments and a duplicate that outwaits the first get clear MCP errors."""
    meta = {META_KEY: "order-A1-refund"}
    async with servers.connect() as session:
        first = await session.call_tool("refund", REFUND, meta=meta)
        second = await session.call_tool("refund", REFUND, meta=meta)
        assert first == second
        assert len(effects(control)) == 1

        await session.call_tool("tag", {"order_id": "A1"})
        await session.call_tool("tag", {"order_id": "A1"})
        assert effects(control)[1:] == ["tag A1", "tag A1"]

        with pytest.raises(MCPError, match="other arguments") as mismatch:
            await session.call_tool("refund", {"order_id": "B2", "amount": 1.0}, meta=meta)
        assert mismatch.value.code == -32602

        (control / "block").touch()
        blocked = {META_KEY: "order-A2-refund"}
        arguments = {"order_id": "A2", "amount": 5.0}
        async with anyio.create_task_group() as group:
            results: list[CallToolResult] = []

            async def call() -> None:
                results.append(await session.call_tool("refund", arguments, meta=blocked))

            group.start_soon(call)
            await wait_for_file(control / "started")
            with pytest.raises(MCPError, match="still running") as busy:
                await session.call_tool("refund", arguments, meta=blocked)
            assert busy.value.code == -32001
            (control / "release").touch()
        assert results[0].structured_content == {**arguments, "refund": "re_A2"}
        assert await session.call_tool("refund", arguments, meta=blocked) == results[0]
    assert [line.split(" attempt")[0] for line in effects(control)] == ["refund A1", "tag A1", "tag A1", "refund A2"]


@pytest.mark.parametrize("servers", [("stdio", {"wait_timeout": 30})], indirect=True)
async def test_a_duplicate_arriving_while_the_first_runs_waits_for_its_result(servers: Servers, control: Path) -> None:
    """The second request with the key waits for the first and returns its result: one run."""
    meta = {META_KEY: "order-A3-refund"}
    arguments = {"order_id": "A3", "amount": 3.0}
    (control / "block").touch()
    async with servers.connect() as session:
        results: list[CallToolResult] = []

        async def call() -> None:
            results.append(await session.call_tool("refund", arguments, meta=meta))

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await wait_for_file(control / "started")
            group.start_soon(call)
            await anyio.sleep(0.5)  # let the duplicate reach the server and wait there
            (control / "release").touch()
    assert len(results) == 2
    assert results[0] == results[1]
    assert len(effects(control)) == 1


async def test_two_servers_sharing_a_ledger_keep_their_keys_apart(control: Path, tmp_path: Path) -> None:
    """The key namespace is the server's name: the same key on two servers runs on each."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "server-ledger.db").symlink_to(control / "server-ledger.db")
    meta = {META_KEY: "shared-key"}
    for directory, name in [(control, "payments"), (other, "billing")]:
        env = server_env(name=name)
        async with connect("stdio", directory, env) as session:
            await session.call_tool("tag", {"order_id": "A1"}, meta=meta)
            await session.call_tool("tag", {"order_id": "A1"}, meta=meta)
    assert effects(control) == ["tag A1"]
    assert effects(other) == ["tag A1"]
    assert sorted(record.key.thread_id for record in server_records(control)) == [
        "mcp-server:billing",
        "mcp-server:payments",
    ]
