"""replaysafe.http: Idempotency-Key headers on outgoing requests, against a real local provider."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests

from replaysafe import CallInfo, MemoryLedger, Status, open_ledger, replay_safe, tool_call
from replaysafe._request_keys import _next_ordinal
from replaysafe.http import (
    IdempotencyKeyAdapter,
    aadd_idempotency_key,
    add_idempotency_key,
    aidempotency_key_hook,
    idempotency_key_hook,
    next_request_key,
    request_idempotency_key,
)

CHILD = Path(__file__).with_name("http_child.py")
WAIT = 60.0


class Provider(ThreadingHTTPServer):
    """A payment provider that dedupes ``POST``/``PATCH`` by ``Idempotency-Key``, as Stripe does.

    ``received`` lists every request as ``(method, Idempotency-Key, X-Request-Key)``; ``performed``
    the keys of the requests that did something. With ``hold_after=n`` the provider, once it has
    performed its n-th request, sets ``held`` and keeps the answer until ``release`` is set.
    """

    daemon_threads = True

    def __init__(self, hold_after: int | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.received: list[tuple[str, str | None, str | None]] = []
        self.performed: list[str | None] = []
        self.answers: dict[str, dict[str, Any]] = {}
        self.hold_after = hold_after
        self.held = threading.Event()
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Provider

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"null")
        key = self.headers.get("Idempotency-Key")
        server = self.server
        hold = False
        with server.lock:
            server.received.append((self.command, key, self.headers.get("X-Request-Key")))
            if key is not None and key in server.answers:
                answer = {**server.answers[key], "replayed": True}
            else:
                server.performed.append(key)
                answer = {"charge": len(server.performed), "body": body, "replayed": False}
                if key is not None:
                    server.answers[key] = answer
                hold = server.hold_after == len(server.performed)
        if hold:  # the effect happened; the agent dies before it hears of it
            server.held.set()
            server.release.wait(WAIT)
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_POST = do_PATCH = do_PUT = do_DELETE = do_GET = _handle  # noqa: N815 - http.server names them

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def provider() -> Iterator[Provider]:
    with Provider() as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server
        finally:
            server.release.set()
            server.shutdown()
            thread.join(WAIT)


def keys(provider: Provider) -> list[str | None]:
    return [key for _, key, _ in provider.received]


def call_key(thread: str, tool_name: str, message_id: str = "msg_1", tool_call_id: str = "call_1") -> str:
    return CallInfo(thread, message_id, tool_call_id, tool_name, 1).idempotency_key


# --- the crash: SIGKILL after the request is sent, before the result is recorded --------------


@pytest.mark.slow
@pytest.mark.parametrize("client", ["httpx", "httpx-async", "requests"])
def test_sigkill_while_the_provider_answers_then_resume_performs_each_request_once(
    client: str, sqlite_url: str
) -> None:
    """The agent dies after its second POST was performed; attempt 2 sends both keys again: deduped."""
    with Provider(hold_after=2) as provider:
        serving = threading.Thread(target=provider.serve_forever, daemon=True)
        serving.start()
        try:
            args = [sys.executable, str(CHILD), client, sqlite_url, provider.url, "t-http"]
            agent = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                assert provider.held.wait(WAIT), "the provider never received the second request"
                agent.send_signal(signal.SIGKILL)
                _, stderr = agent.communicate(timeout=WAIT)
            finally:
                agent.kill()
            assert agent.returncode == -signal.SIGKILL, stderr
            provider.release.set()

            resumed = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
            assert resumed.returncode == 0, resumed.stderr
        finally:
            provider.release.set()
            provider.shutdown()
            serving.join(WAIT)

    key = call_key("t-http", "charge_twice")
    assert keys(provider) == [f"{key}:1", f"{key}:2", f"{key}:1", f"{key}:2"]
    assert provider.performed == [f"{key}:1", f"{key}:2"]  # two requests received twice, performed once each
    answers = json.loads(resumed.stdout)
    assert [(a["charge"], a["replayed"]) for a in answers] == [(1, True), (2, True)]
    ledger = open_ledger(sqlite_url)
    (record,) = ledger.records()
    assert record.status is Status.COMPLETED
    assert record.attempt == 2


@pytest.mark.slow
def test_without_the_hook_the_same_crash_performs_the_requests_twice(sqlite_url: str) -> None:
    """The same crash and resume with a client that sends no key: the provider cannot dedupe."""
    with Provider(hold_after=2) as provider:
        serving = threading.Thread(target=provider.serve_forever, daemon=True)
        serving.start()
        try:
            args = [sys.executable, str(CHILD), "plain", sqlite_url, provider.url, "t-plain"]
            agent = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                assert provider.held.wait(WAIT)
                agent.send_signal(signal.SIGKILL)
                agent.communicate(timeout=WAIT)
            finally:
                agent.kill()
            provider.release.set()
            resumed = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
            assert resumed.returncode == 0, resumed.stderr
        finally:
            provider.release.set()
            provider.shutdown()
            serving.join(WAIT)
    assert len(provider.received) == 4
    assert len(provider.performed) == 4


# --- which requests get a key ------------------------------------------------------------------


def test_post_and_patch_get_the_key_other_methods_and_set_headers_do_not(provider: Provider) -> None:
    """Only POST and PATCH are keyed; a header the caller set is kept and takes no ordinal."""

    @replay_safe(ledger=MemoryLedger())
    def tool() -> None:
        with httpx.Client(event_hooks={"request": [add_idempotency_key]}, trust_env=False) as http:
            http.get(f"{provider.url}/charges")
            http.put(f"{provider.url}/charges", json={})
            http.delete(f"{provider.url}/charges")
            http.post(f"{provider.url}/charges", json={}, headers={"idempotency-key": "mine"})
            http.post(f"{provider.url}/charges", json={})
            http.patch(f"{provider.url}/charges", json={})

    with tool_call("t-methods", "msg_1", "call_1"):
        tool()
    key = call_key("t-methods", "tool")
    assert provider.received == [
        ("GET", None, None),
        ("PUT", None, None),
        ("DELETE", None, None),
        ("POST", "mine", None),
        ("POST", f"{key}:1", None),
        ("PATCH", f"{key}:2", None),
    ]


def test_outside_a_protected_call_nothing_is_added(provider: Provider) -> None:
    """A request outside a protected call (or in a tool run without ids) carries no key."""
    with httpx.Client(event_hooks={"request": [add_idempotency_key]}, trust_env=False) as http:
        http.post(f"{provider.url}/charges", json={})
    with requests.Session() as session:
        session.trust_env = False
        session.mount("http://", IdempotencyKeyAdapter())
        session.post(f"{provider.url}/charges", json={}, timeout=WAIT)
    assert keys(provider) == [None, None]
    assert next_request_key() is None


def test_ordinals_restart_for_each_execution_so_a_retry_sends_the_same_keys(provider: Provider) -> None:
    """A tool that fails after its requests is run again: the second execution sends the same keys."""
    runs: list[int] = []

    @replay_safe(ledger=MemoryLedger())
    def flaky() -> str:
        with requests.Session() as session:
            session.trust_env = False
            session.mount("http://", IdempotencyKeyAdapter())
            for n in (1, 2):
                session.post(f"{provider.url}/charges", json={"n": n}, timeout=WAIT)
        runs.append(1)
        if len(runs) == 1:
            raise ConnectionError("the answer was lost")
        return "done"

    with tool_call("t-retry", "msg_1", "call_1"):
        with pytest.raises(ConnectionError):
            flaky()
        assert flaky() == "done"
    key = call_key("t-retry", "flaky")
    assert keys(provider) == [f"{key}:1", f"{key}:2", f"{key}:1", f"{key}:2"]
    assert len(provider.performed) == 2


def test_two_calls_get_distinct_keys(provider: Provider) -> None:
    """The key belongs to the call: another tool call id gives other keys."""

    @replay_safe(ledger=MemoryLedger())
    def charge() -> None:
        with httpx.Client(event_hooks={"request": [add_idempotency_key]}, trust_env=False) as http:
            http.post(f"{provider.url}/charges", json={})

    for tool_call_id in ("call_1", "call_2"):
        with tool_call("t-two", "msg_1", tool_call_id):
            charge()
    assert keys(provider) == [
        request_idempotency_key(CallInfo("t-two", "msg_1", call_id, "charge", 1), 1) for call_id in ("call_1", "call_2")
    ]
    assert len(set(keys(provider))) == 2


def test_the_header_name_is_configurable(provider: Provider) -> None:
    """idempotency_key_hook(name) and IdempotencyKeyAdapter(header=...) set another header."""

    @replay_safe(ledger=MemoryLedger())
    def tool() -> None:
        hook = idempotency_key_hook("X-Request-Key")
        with httpx.Client(event_hooks={"request": [hook]}, trust_env=False) as http:
            http.post(f"{provider.url}/charges", json={})
        with requests.Session() as session:
            session.trust_env = False
            session.mount("http://", IdempotencyKeyAdapter(header="X-Request-Key", methods=["PUT"]))
            session.post(f"{provider.url}/charges", json={}, timeout=WAIT)
            session.put(f"{provider.url}/charges", json={}, timeout=WAIT)

    with tool_call("t-name", "msg_1", "call_1"):
        tool()
    key = call_key("t-name", "tool")
    assert provider.received == [("POST", None, f"{key}:1"), ("POST", None, None), ("PUT", None, f"{key}:2")]


async def test_async_requests_in_concurrent_tasks_get_distinct_keys(provider: Provider) -> None:
    """Requests sent from tasks the tool starts share one counter: no two carry the same key."""
    custom = aidempotency_key_hook("X-Request-Key")

    @replay_safe(ledger=MemoryLedger())
    async def fan_out() -> None:
        async with httpx.AsyncClient(event_hooks={"request": [aadd_idempotency_key, custom]}, trust_env=False) as http:

            async def post(n: int) -> None:
                await http.post(f"{provider.url}/charges", json={"n": n})

            await asyncio.gather(*(asyncio.ensure_future(post(n)) for n in range(4)))

    async with tool_call("t-fan", "msg_1", "call_1"):
        await fan_out()
    key = call_key("t-fan", "fan_out")
    assert sorted(k for k in keys(provider) if k is not None) == [f"{key}:{n}" for n in (1, 3, 5, 7)]
    assert sorted(r[2] for r in provider.received if r[2] is not None) == [f"{key}:{n}" for n in (2, 4, 6, 8)]


async def test_sibling_tasks_share_their_counter_whatever_other_calls_key_meanwhile(provider: Provider) -> None:
    """Two tasks of one tool send a keyed request each, with 300 other calls' keyed requests in between (more than
    any table of recent executions would hold): the second request never reuses the first's key, so a provider that
    dedupes by the header performs both."""
    first_sent, others_done = asyncio.Event(), asyncio.Event()

    @replay_safe(ledger=MemoryLedger())
    async def other_call(n: int) -> None:
        request = httpx.Request("POST", f"{provider.url}/x")
        await aadd_idempotency_key(request)

    @replay_safe(ledger=MemoryLedger())
    async def two_charges() -> None:
        async with httpx.AsyncClient(event_hooks={"request": [aadd_idempotency_key]}, trust_env=False) as http:

            async def first() -> None:
                await http.post(f"{provider.url}/charges", json={"n": 1})
                first_sent.set()

            async def second() -> None:
                await others_done.wait()
                await http.post(f"{provider.url}/charges", json={"n": 2})

            await asyncio.gather(first(), second())

    async def others() -> None:
        await first_sent.wait()
        for n in range(300):
            async with tool_call(f"t-other-{n}", "msg_1", "call_1"):
                await other_call(n)
        others_done.set()

    async with tool_call("t-siblings", "msg_1", "call_1"):
        await asyncio.gather(two_charges(), others())
    key = call_key("t-siblings", "two_charges")
    assert keys(provider) == [f"{key}:1", f"{key}:2"]
    assert len(provider.performed) == 2


def test_a_request_key_needs_a_running_call() -> None:
    """Ordinals are numbered per execution: a CallInfo made by hand has none, and says how to number by hand."""
    with pytest.raises(TypeError, match=r"request_idempotency_key\(call, n\)"):
        _next_ordinal(CallInfo("t", "m", "c", "tool", 1))


def test_importing_replaysafe_imports_neither_client() -> None:
    """httpx and requests stay optional: `import replaysafe` (and replaysafe.http) loads neither."""
    code = (
        "import sys, replaysafe, replaysafe.http\n"
        "assert 'httpx' not in sys.modules, 'httpx'\n"
        "assert 'requests' not in sys.modules, 'requests'\n"
        "replaysafe.http.IdempotencyKeyAdapter\n"
        "assert 'requests' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="header"):
        idempotency_key_hook("")
    with pytest.raises(ValueError, match="methods"):
        IdempotencyKeyAdapter(methods=[])
    with pytest.raises(ValueError, match="start at 1"):
        request_idempotency_key(CallInfo("t", "m", "c", "tool", 1), 0)
