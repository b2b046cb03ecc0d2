"""Finding, or starting, the PostgreSQL and Redis servers that the tests talk to.

Discovery order for each: the environment variable (``REPLAYSAFE_TEST_POSTGRES_URL``
/ ``REPLAYSAFE_TEST_REDIS_URL``), then the machine's local server (127.0.0.1:5432,
user ``root``, database ``test``; 127.0.0.1:6379), then a throwaway server started
from ``initdb``/``pg_ctl`` or ``redis-server`` in a temporary directory on a free
port. Tests never stop or restart a server they did not start.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path

import psycopg
import redis

POSTGRES_ENV = "REPLAYSAFE_TEST_POSTGRES_URL"
REDIS_ENV = "REPLAYSAFE_TEST_REDIS_URL"
LOCAL_POSTGRES = "postgresql://root@127.0.0.1:5432/test"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def with_query(url: str, **params: str) -> str:
    """``url`` with ``params`` added to its query string."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True) + list(params.items())
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def with_driver(url: str, driver: str) -> str:
    """A ``postgresql://`` URL with a SQLAlchemy-style driver: ``postgresql+asyncpg://``."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(scheme=f"postgresql+{driver}"))


def libpq_url(url: str) -> str:
    """A SQLAlchemy-style URL (``postgresql+psycopg://``) as psycopg's own ``connect()`` takes it."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(scheme="postgresql"))


def postgres_answers(url: str) -> bool:
    try:
        with psycopg.connect(libpq_url(url), connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def redis_answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def postgres_binary(name: str) -> str | None:
    """``initdb``/``pg_ctl``: on the PATH, or in Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = glob.glob(f"/usr/lib/postgresql/*/bin/{name}")
    candidates.sort(key=lambda path: int(Path(path).parts[-3]) if Path(path).parts[-3].isdigit() else 0)
    return candidates[-1] if candidates else None


def _wait_until(check: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up within {timeout:g}s")


class PostgresServer:
    """A throwaway PostgreSQL cluster in a temporary directory, on a free port.

    PostgreSQL refuses to run as root, so under root it runs as the ``postgres``
    user (which Debian's packages create).
    """

    def __init__(self) -> None:
        self.initdb = postgres_binary("initdb")
        self.pg_ctl = postgres_binary("pg_ctl")
        if self.initdb is None or self.pg_ctl is None:
            raise FileNotFoundError("initdb/pg_ctl not found (install postgresql, or set " + POSTGRES_ENV + ")")
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres").pw_name
            except KeyError:
                raise FileNotFoundError("running as root and no 'postgres' user to run PostgreSQL as") from None
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="replaysafe-pg-"))
        self.data = self.dir / "data"
        self.url = f"postgresql://root@127.0.0.1:{self.port}/postgres"
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run(
            self.initdb, "-D", str(self.data), "-U", "root", "-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C"
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.dir}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n"
            )

    def _run(self, *command: str) -> None:
        subprocess.run(command, check=True, capture_output=True, user=self.user, cwd=self.dir, timeout=120)

    def start(self) -> None:
        assert self.pg_ctl is not None
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-t", "60", "start")
        _wait_until(lambda: postgres_answers(self.url), f"PostgreSQL on port {self.port}")

    def stop(self) -> None:
        assert self.pg_ctl is not None
        self._run(self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisServer:
    """A throwaway ``redis-server`` in a temporary directory, on a free port.

    No persistence unless ``persistent`` (an append-only file, fsynced on every write,
    so that the data survives a restart as in a production setup).
    """

    def __init__(self, *, persistent: bool = False) -> None:
        self.persistence = ["--appendonly", "yes", "--appendfsync", "always"] if persistent else ["--appendonly", "no"]
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise FileNotFoundError("redis-server not found (install redis-server, or set " + REDIS_ENV + ")")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="replaysafe-redis-"))
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert self.binary is not None
        self._process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *self.persistence,
             "--dir", str(self.dir), "--logfile", str(self.dir / "log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_until(lambda: redis_answers(self.url), f"redis-server on port {self.port}")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=30)
            self._process = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisClusterNodes:
    """A throwaway Redis Cluster: six ``redis-server --cluster-enabled yes`` nodes on free ports in a
    temporary directory (three primaries, a replica each), made one by ``redis-cli --cluster create``."""

    def __init__(self, nodes: int = 6) -> None:
        self.server = shutil.which("redis-server")
        self.cli = shutil.which("redis-cli")
        if self.server is None or self.cli is None:
            raise FileNotFoundError("redis-server and redis-cli are needed for a local Redis Cluster")
        self.dir = Path(tempfile.mkdtemp(prefix="replaysafe-redis-cluster-"))
        # Each node also listens on a cluster bus port; both are chosen free (the default, port + 10000, may not be).
        self.ports = [(free_port(), free_port()) for _ in range(nodes)]
        self.url = f"redis://127.0.0.1:{self.ports[0][0]}"
        self._processes: list[subprocess.Popen[bytes]] = []

    def _node(self, port: int, bus: int) -> subprocess.Popen[bytes]:
        assert self.server is not None
        home = self.dir / str(port)
        home.mkdir()
        return subprocess.Popen(
            [self.server, "--port", str(port), "--cluster-port", str(bus), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-config-file", str(home / "nodes.conf"),
             "--cluster-node-timeout", "5000", "--save", "", "--appendonly", "no", "--dir", str(home),
             "--logfile", str(home / "log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def start(self) -> None:
        assert self.server is not None and self.cli is not None
        for index, (port, bus) in enumerate(self.ports):
            # A port found free may be taken before the node binds it (by another test's server, or as the local
            # port of some process's outgoing connection: free ports are ephemeral ones): a node that exits at
            # once is started again on other ports.
            for _ in range(5):
                process = self._node(port, bus)
                _wait_until(
                    lambda port=port, process=process: (
                        process.poll() is not None or redis_answers(f"redis://127.0.0.1:{port}")
                    ),
                    f"redis-server on port {port}",
                )
                if process.poll() is None:
                    break
                port, bus = free_port(), free_port()
            self._processes.append(process)
            self.ports[index] = (port, bus)
        self.url = f"redis://127.0.0.1:{self.ports[0][0]}"
        for port, _ in self.ports:
            _wait_until(lambda port=port: redis_answers(f"redis://127.0.0.1:{port}"), f"redis-server on port {port}")
        nodes = [f"127.0.0.1:{port}" for port, _ in self.ports]
        subprocess.run(
            [self.cli, "--cluster", "create", *nodes, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        _wait_until(self._ready, "the Redis Cluster's cluster_state:ok on every node", timeout=60)

    def _ready(self) -> bool:
        for port, _ in self.ports:
            client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
            try:
                info = client.cluster("info")
            except redis.RedisError:
                return False
            finally:
                client.close()
            if not (isinstance(info, dict) and info.get("cluster_state") == "ok"):  # redis-py parses CLUSTER INFO
                return False
        return True

    def destroy(self) -> None:
        for process in self._processes:
            process.terminate()
        for process in self._processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgresWireCounter:
    """A TCP proxy in front of PostgreSQL that counts the client's protocol round trips.

    Every round trip of the frontend/backend protocol ends with a ``Sync`` (extended
    query) or is one ``Query`` (simple query) message, so counting those counts the
    round trips, whatever the client library does above the socket. Connect with
    ``sslmode=disable`` so the proxy can read the messages.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.messages: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def round_trips(self) -> int:
        with self._lock:
            return self.messages["S"] + self.messages["Q"]

    def reset(self) -> None:
        with self._lock:
            self.messages.clear()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(timeout=10)

    def _accept(self) -> None:
        self._listener.settimeout(0.1)  # so that close() is noticed
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            server = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, server]
            for thread in (
                threading.Thread(target=self._frontend, args=(client, server), daemon=True),
                threading.Thread(target=self._pump, args=(server, client), daemon=True),
            ):
                self._threads.append(thread)
                thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _frontend(self, client: socket.socket, server: socket.socket) -> None:
        """Forward the client's bytes, counting its messages once the startup packet is through."""
        buffer = b""
        started = False
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                buffer += data
                while True:
                    if not started:  # untyped: SSLRequest, GSSENCRequest or StartupMessage
                        if len(buffer) < 8:
                            break
                        length, code = struct.unpack("!ii", buffer[:8])
                        if len(buffer) < length:
                            break
                        buffer = buffer[length:]
                        started = code not in (80877103, 80877104)
                        continue
                    if len(buffer) < 5:
                        break
                    kind, length = buffer[:1].decode(), struct.unpack("!i", buffer[1:5])[0]
                    if len(buffer) < 1 + length:
                        break
                    buffer = buffer[1 + length :]
                    with self._lock:
                        self.messages[kind] += 1
                # Counted before forwarded: the reply, and the test's read of the count, come after.
                server.sendall(data)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)


#: How many Redis keys ``shared_state`` reads at most (the shared server holds only what running tests made).
SHARED_REDIS_SCAN_LIMIT = 200_000
#: A namespace of one test's own: a schema or key prefix named ``rs`` then a word or two and a random hex token
#: (``rs_1f2e3d4c5b6a``, ``rs-test-1f2e3d4c5b6a``, ``rs_langgraph_...``), at the start of a name or of a part of a
#: Redis key. Several runs may share the servers at once, so what is in such a namespace is another test's.
PER_TEST_NAMESPACE = re.compile(r"(?:\A|:)rs[_-](?:[a-z]+[_-])*[0-9a-f]{12}")


def shared_state(postgres_url: str, redis_url: str) -> set[str]:
    """What the shared servers hold outside the tests' own namespaces: PostgreSQL schemas and tables outside the
    system's, and Redis keys.

    The suite compares it before and after a run (``tests/conftest.py``): a test keeps to a schema and a key
    prefix of its own (``PER_TEST_NAMESPACE``), so tests in parallel workers never share a record.
    """
    found: set[str] = set()
    with psycopg.connect(libpq_url(postgres_url), connect_timeout=10, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_namespace n LEFT JOIN pg_class c ON c.relnamespace = n.oid "
            "AND c.relkind IN ('r', 'p', 'v', 'm', 'S') WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') "
            "AND n.nspname NOT LIKE 'pg\\_%'"
        ).fetchall()
    found.update(
        f"postgresql schema {schema}" + (f", table {table}" if table else "")
        for schema, table in rows
        if not PER_TEST_NAMESPACE.search(schema)
    )
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    try:
        for count, raw in enumerate(client.scan_iter(count=1000)):
            if count >= SHARED_REDIS_SCAN_LIMIT:
                break
            name = raw.decode(errors="backslashreplace")
            if not PER_TEST_NAMESPACE.search(name):
                found.add(f"redis key {name}")
    finally:
        client.close()
    return found
