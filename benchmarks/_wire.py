"""Round trips counted on the wire: a TCP relay between a client and its server.

A round trip is the client sending and then the server answering: the relay counts
each turn of a connection from client bytes to server bytes. It sees what the
server sees, whatever the client library does above its socket (pipelines, a
statement sent as several protocol messages in one write, a pool's checks), so the
ledger and the floors are counted alike. Used for Redis and PostgreSQL, before the
timed rounds (the relay is never in the timed path).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any


class Relay:
    """Forwards connections from a free local port to ``host:port``, counting round trips."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self.round_trips = 0
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, name="bench-relay", daemon=True).start()

    def count(self, action: Callable[[], Any]) -> int:
        """Round trips ``action`` makes through the relay."""
        with self._lock:
            before = self.round_trips
        action()
        with self._lock:
            return self.round_trips - before

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._upstream)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, server]
            turn = ["server"]  # who spoke last on this connection

            def pump(source: socket.socket, sink: socket.socket, side: str, turn: list[str] = turn) -> None:
                while True:
                    try:
                        data = source.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        with contextlib.suppress(OSError):
                            sink.shutdown(socket.SHUT_WR)
                        return
                    with self._lock:
                        if side == "server" and turn[0] == "client":
                            self.round_trips += 1
                        turn[0] = side
                    try:
                        sink.sendall(data)
                    except OSError:
                        return  # the relay closed its sockets (close()) while bytes were in flight

            threading.Thread(target=pump, args=(client, server, "client"), daemon=True).start()
            threading.Thread(target=pump, args=(server, client, "server"), daemon=True).start()


@contextlib.contextmanager
def relayed(url: str) -> Iterator[tuple[Relay, str]]:
    """A relay to the server ``url`` names, and the same URL through the relay."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    assert port is not None, f"the benchmark needs an explicit port in {url!r}"
    relay = Relay(host, port)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@127.0.0.1:{relay.port}" if user else f"127.0.0.1:{relay.port}"
    try:
        yield relay, urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    finally:
        relay.close()
