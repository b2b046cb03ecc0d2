"""A ledger operation whose reply is lost in transit, for real: a TCP proxy in front of
Redis that drops the server's reply (the command ran) or the client's request (it did
not), then closes the connection, as a network failure does.

A claim that landed but whose reply was lost is released afterwards (fenced by owner);
a finishing write that failed is kept and written once the ledger answers. Every wait
is bounded: a regression fails within seconds instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator

import pytest

from replaysafe import CallKey, LedgerError, RedisLedger, Status, open_ledger, replay_safe, tool_call
from replaysafe._records import Record
from replaysafe.ledgers import RetryPolicy


class FaultyProxy:
    """Forwards TCP between clients and one server; ``mode`` says what to lose.

    ``forward``: nothing. ``drop_reply_once``: the next reply is dropped (its command ran),
    then every request is dropped (``drop_requests``) until ``mode`` is set back.
    ``fail_scripts`` (set by ``fail_scripts()``): script calls (``EVALSHA``: claims and
    finishing writes, not a connection's handshake) first lose their replies (they ran), then
    are lost themselves (they did not), then are answered that the script is not loaded (as by
    a restarted or failed-over server), then are refused with the server's own ACL error, as
    after a permission revoked meanwhile; other commands pass.
    """

    DENIED = b"-NOPERM User default has no permissions to run the 'evalsha' command\r\n"
    NOSCRIPT = b"-NOSCRIPT No matching script. Please use EVAL.\r\n"

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.mode = "forward"
        self._replies_to_drop = self._requests_to_drop = self._noscripts = 0
        self._script_sent = False
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, "request"), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, "reply"), daemon=True).start()

    def fail_scripts(self, *, replies: int = 0, requests: int = 0, noscripts: int = 0) -> None:
        """The next ``replies`` script calls run but lose their replies, the ``requests`` after them
        are lost, the ``noscripts`` after those are answered NOSCRIPT, and every one after those is
        refused (until ``mode`` is set back)."""
        with self._lock:
            self._replies_to_drop, self._requests_to_drop, self._script_sent = replies, requests, False
            self._noscripts = noscripts
            self.mode = "fail_scripts"

    def _lose(self, direction: str, data: bytes) -> bool:
        with self._lock:
            if self.mode == "fail_scripts":
                script = direction == "request" and b"EVALSHA" in data.upper()
                if script and self._replies_to_drop:
                    self._script_sent = True  # forwarded: it runs, and its reply is lost
                    return False
                if direction == "reply" and self._script_sent:
                    self._script_sent = False
                    self._replies_to_drop -= 1
                    return True
                if script and self._requests_to_drop:
                    self._requests_to_drop -= 1
                    return True
                return False
            if direction == "reply" and self.mode == "drop_reply_once":
                self.mode = "drop_requests"
                return True
            return direction == "request" and self.mode == "drop_requests"

    def _answer(self, direction: str, data: bytes) -> bytes | None:
        """The proxy's own reply to a script call it keeps from the server, if any."""
        if direction != "request" or b"EVALSHA" not in data.upper():
            return None
        with self._lock:
            if self.mode != "fail_scripts" or self._replies_to_drop or self._requests_to_drop:
                return None
            if self._noscripts:
                self._noscripts -= 1
                return self.NOSCRIPT
            return self.DENIED

    def _pump(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if self._lose(direction, data):
                    break  # lost in transit: the connection dies with it
                answer = self._answer(direction, data)
                if answer is not None:
                    source.sendall(answer)  # answered by the proxy: the server never sees it
                    continue
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for end in self._sockets:
            with contextlib.suppress(OSError):
                end.close()


@pytest.fixture
def proxied(redis_url: str) -> Iterator[tuple[RedisLedger, RedisLedger, FaultyProxy]]:
    """A ledger through the proxy (one attempt per operation), and one straight to the server."""
    parts = urllib.parse.urlsplit(redis_url)
    proxy = FaultyProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    through = urllib.parse.urlunsplit(parts._replace(netloc=f"127.0.0.1:{proxy.port}"))
    with open_ledger(through, retry=RetryPolicy(attempts=1)) as faulty, open_ledger(redis_url) as direct:
        assert isinstance(faulty, RedisLedger) and isinstance(direct, RedisLedger)
        faulty.get(CallKey("warm", "up", "-"))  # connected and its scripts loaded
        yield faulty, direct, proxy
    proxy.close()


def eventually(direct: RedisLedger, key: CallKey, done: Callable[[Record | None], bool]) -> Record | None:
    """The record once ``done`` holds for it; gives up after 20 s (the pending writes retry within 5 s)."""
    deadline = time.monotonic() + 20
    record = direct.get(key)
    while not done(record) and time.monotonic() < deadline:
        time.sleep(0.05)
        record = direct.get(key)
    return record


def written_later(direct: RedisLedger, proxy: FaultyProxy, key: CallKey, tool: Callable[[], str]) -> None:
    """The call's record, left running while its finishing write failed, is completed once the
    proxy forwards again; the next call then replays it (``tool`` must not run again)."""
    running = direct.get(key)
    assert running is not None and running.status is Status.RUNNING
    proxy.mode = "forward"
    record = eventually(direct, key, lambda r: r is not None and r.status is Status.COMPLETED)
    assert record is not None and record.status is Status.COMPLETED
    with tool_call(*key):
        assert tool() == "refunded"  # replayed from the record written late


def invite(ledger: RedisLedger, key: CallKey, runs: list[int], *, asynchronous: bool) -> Callable[[], str]:
    """A call of a protected ``send_invite`` under ``key`` (sync, or async in a loop of its own),
    failing closed; each run of the tool is counted in ``runs``."""

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    def send_invite() -> str:
        runs.append(1)
        return "sent"

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    async def asend_invite() -> str:
        return send_invite.__wrapped__()  # type: ignore[attr-defined,no-any-return]

    async def call_async() -> str:
        async with tool_call(*key):
            return await asend_invite()

    def call() -> str:
        if asynchronous:
            return asyncio.run(call_async())
        with tool_call(*key):
            return send_invite()

    return call


def test_a_claim_whose_reply_was_lost_is_released(proxied: tuple[RedisLedger, RedisLedger, FaultyProxy]) -> None:
    faulty, direct, proxy = proxied
    key, runs = CallKey(f"thread-{uuid.uuid4().hex[:8]}", "msg_1", "call_1"), []

    @replay_safe(ledger=faulty, on_ledger_error="raise")
    def send_invite() -> str:
        runs.append(1)
        return "sent"

    proxy.mode = "drop_reply_once"
    with tool_call(*key), pytest.raises(LedgerError):
        send_invite()
    assert runs == []
    landed = direct.get(key)
    assert landed is not None and landed.status is Status.RUNNING  # the claim ran; only its reply was lost
    proxy.mode = "forward"  # the ledger answers again
    assert eventually(direct, key, lambda r: r is None) is None
    with tool_call(*key):
        assert send_invite() == "sent"
    assert runs == [1]


def test_a_failed_finishing_write_is_kept_and_written_later(
    proxied: tuple[RedisLedger, RedisLedger, FaultyProxy],
) -> None:
    faulty, direct, proxy = proxied
    key, runs = CallKey(f"thread-{uuid.uuid4().hex[:8]}", "msg_1", "call_1"), []

    @replay_safe(ledger=faulty)
    def refund() -> str:
        runs.append(1)
        proxy.mode = "drop_requests"  # the tool ran; its record cannot be written
        return "refunded"

    with tool_call(*key):
        assert refund() == "refunded"
    written_later(direct, proxy, key, refund)
    assert runs == [1]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    ("attempts", "lost", "noscripts"),
    [(3, 1, 0), (1, 0, 0), (1, 0, 1)],
    ids=["the-ledgers-retry", "the-clients-own-retry", "the-clients-own-retry-then-a-script-reload"],
)
def test_a_claim_whose_reply_was_lost_is_released_when_its_retry_then_fails_for_good(
    proxied: tuple[RedisLedger, RedisLedger, FaultyProxy], asynchronous: bool, attempts: int, lost: int, noscripts: int
) -> None:
    """A first try that failed transiently may have landed, whatever the retry's error says after
    it: before, a retry refused for good (here an ACL error) left the landed claim running under
    its live owner until the lease ran out, because only the last error was looked at. The claim
    runs and its reply is lost; then either redis-py's own immediate retry is lost too (a
    transient failure of the ledger's attempt) and the ledger's retry is refused, or, with one
    ledger attempt, redis-py's immediate retry is refused, inside that attempt; or that retry finds
    the script not loaded (a failed-over server), and the ledger's own send after reloading it is
    refused."""
    faulty, direct, proxy = proxied
    faulty.retry = RetryPolicy(attempts=attempts)
    key, runs = CallKey(f"thread-{uuid.uuid4().hex[:8]}", "msg_1", "call_1"), []

    call = invite(faulty, key, runs, asynchronous=asynchronous)
    proxy.fail_scripts(replies=1, requests=lost, noscripts=noscripts)
    with pytest.raises(LedgerError) as raised:
        call()
    assert raised.value.permanent and "NoPermissionError" in str(raised.value)  # the retry's error
    assert runs == []
    landed = direct.get(key)
    assert landed is not None and landed.status is Status.RUNNING  # the first try landed
    proxy.mode = "forward"  # the permission is back: the release kept for later goes through
    assert eventually(direct, key, lambda r: r is None) is None
    assert call() == "sent"
    assert runs == [1]


@pytest.mark.parametrize(
    ("attempts", "lost"),
    [(3, 2), (1, 1)],
    ids=["the-ledgers-retry", "the-clients-own-retry"],
)
def test_a_finishing_write_is_kept_when_its_retry_then_fails_for_good(
    proxied: tuple[RedisLedger, RedisLedger, FaultyProxy], attempts: int, lost: int
) -> None:
    """The finishing write's request is lost with its connection, then its retry is refused for
    good: it is kept and written once the ledger takes it. The retry that is refused is the
    ledger's (the first attempt's own immediate retry by redis-py lost too: a transient failure),
    or, with one ledger attempt, redis-py's, inside that attempt: before, the permanent error
    alone was looked at there, and the write was dropped."""
    faulty, direct, proxy = proxied
    faulty.retry = RetryPolicy(attempts=attempts)
    key, runs = CallKey(f"thread-{uuid.uuid4().hex[:8]}", "msg_1", "call_1"), []

    @replay_safe(ledger=faulty)
    def refund() -> str:
        runs.append(1)
        proxy.fail_scripts(requests=lost)  # the tool ran; its record's write is lost, then refused
        return "refunded"

    with tool_call(*key):
        assert refund() == "refunded"  # on_ledger_error="warn": logged, the result returned
    written_later(direct, proxy, key, refund)
    assert runs == [1]
