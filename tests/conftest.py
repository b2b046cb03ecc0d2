"""Fixtures shared by every test: one ``ledger`` fixture, parametrised over all backends.

Adding a backend to the whole semantic suite is one line in ``LEDGER_BACKENDS``:
its name and where a fresh store of it is, as a URL ``open_ledger`` opens (so a
test can resume in a new process on the same store). The built-in backends also
have a ``<backend>_url`` fixture giving that URL.
"""

from __future__ import annotations

import gc
import os
import uuid
import warnings
from collections.abc import Callable, Iterator

import psycopg
import pytest
import redis

import replaysafe
import replaysafe.testing
from replaysafe.ledgers import Ledger, MemoryLedger

from . import servers

#: The backends the shared suite runs on, one line each: the URL of a fresh, empty store (a server
#: backend takes a fixture that gives it a schema or key prefix of its own and removes it afterwards).
LEDGER_BACKENDS: dict[str, Callable[[pytest.FixtureRequest], str]] = {
    "memory": lambda request: "memory://",
    "sqlite": lambda request: f"sqlite:///{request.getfixturevalue('tmp_path') / 'ledger.db'}",
    "postgres": lambda request: str(request.getfixturevalue("postgres_url")),
    "redis": lambda request: str(request.getfixturevalue("redis_url")),
}
#: Backends that survive the process, for crash and multi-process tests.
DURABLE_BACKENDS = [b for b in LEDGER_BACKENDS if b != "memory"]


@pytest.fixture
def memory_url(request: pytest.FixtureRequest) -> str:
    return LEDGER_BACKENDS["memory"](request)


@pytest.fixture
def sqlite_url(request: pytest.FixtureRequest) -> str:
    return LEDGER_BACKENDS["sqlite"](request)


#: Set to 1 to skip, rather than fail, the tests of a backend whose server is missing (ignored under CI).
ALLOW_SKIP_ENV = "REPLAYSAFE_TEST_ALLOW_SKIP"


def _unavailable(reason: str) -> None:
    """Fail a test whose server is missing: a green run must have proven every backend.

    Skipping is an explicit opt-in ($REPLAYSAFE_TEST_ALLOW_SKIP=1), never taken under CI.
    """
    if os.environ.get(ALLOW_SKIP_ENV) == "1" and not os.environ.get("CI"):
        pytest.skip(reason)
    pytest.fail(f"{reason}. Set {ALLOW_SKIP_ENV}=1 to skip these tests instead (not under CI).", pytrace=False)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """A PostgreSQL server: $REPLAYSAFE_TEST_POSTGRES_URL, the local one, or a throwaway one."""
    url = os.environ.get(servers.POSTGRES_ENV)
    if url:
        if not servers.postgres_answers(url):
            _unavailable(f"{servers.POSTGRES_ENV} names a PostgreSQL server that does not answer")
        yield url
        return
    if servers.postgres_answers(servers.LOCAL_POSTGRES):
        yield servers.LOCAL_POSTGRES
        return
    try:
        server = servers.PostgresServer()
        server.start()
    except (OSError, RuntimeError, servers.subprocess.SubprocessError) as exc:
        _unavailable(
            f"no PostgreSQL server: set {servers.POSTGRES_ENV}=postgresql://user@host/db, run one on 127.0.0.1:5432 "
            f"(user root, database test), or install initdb/pg_ctl ({exc})"
        )
    try:
        yield server.url
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """A Redis server: $REPLAYSAFE_TEST_REDIS_URL, the local one, or a throwaway one."""
    url = os.environ.get(servers.REDIS_ENV)
    if url:
        if not servers.redis_answers(url):
            _unavailable(f"{servers.REDIS_ENV} names a Redis server that does not answer")
        yield url
        return
    if servers.redis_answers(servers.LOCAL_REDIS):
        yield servers.LOCAL_REDIS
        return
    try:
        server = servers.RedisServer()
        server.start()
    except (OSError, RuntimeError) as exc:
        _unavailable(
            f"no Redis server: set {servers.REDIS_ENV}=redis://host:6379/0, run one on 127.0.0.1:6379, "
            f"or install redis-server ({exc})"
        )
    try:
        yield server.url
    finally:
        server.destroy()


@pytest.fixture
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """The PostgreSQL server with a fresh schema of this test's own, dropped afterwards."""
    schema = f"rs_{uuid.uuid4().hex[:12]}"
    yield servers.with_query(postgres_server_url, schema=schema)
    with psycopg.connect(servers.libpq_url(postgres_server_url), autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # our own generated identifier


@pytest.fixture
def redis_url(redis_server_url: str) -> Iterator[str]:
    """The Redis server with a fresh key prefix of this test's own, its keys deleted afterwards."""
    prefix = f"rs-test-{uuid.uuid4().hex[:12]}"
    yield servers.with_query(redis_server_url, prefix=prefix)
    client = redis.Redis.from_url(redis_server_url)
    try:
        for batch in _batched(client.scan_iter(match=f"{prefix}:*", count=1000)):
            client.delete(*batch)
    finally:
        client.close()


def _batched(names: Iterator[bytes], size: int = 500) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for name in names:
        batch.append(name)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


@pytest.fixture(params=list(LEDGER_BACKENDS))
def ledger_url(request: pytest.FixtureRequest) -> str:
    """A URL of each backend, for a test that opens the ledger in several processes."""
    return LEDGER_BACKENDS[request.param](request)


@pytest.fixture(params=DURABLE_BACKENDS)
def durable_ledger_url(request: pytest.FixtureRequest) -> str:
    """A URL of each backend that survives a process, for crash tests."""
    return LEDGER_BACKENDS[request.param](request)


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    """A fresh, empty ledger of each backend."""
    with replaysafe.open_ledger(ledger_url) as opened:
        yield opened


@pytest.fixture
def durable_ledger(durable_ledger_url: str) -> Iterator[Ledger]:
    with replaysafe.open_ledger(durable_ledger_url) as opened:
        yield opened


@pytest.fixture
def memory_ledger() -> MemoryLedger:
    return MemoryLedger()


@pytest.fixture(autouse=True)
def _isolate_global_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test sees another's default ledger, timeouts, env vars or once-per-process warnings.

    Garbage is collected as each test ends, while warnings are still errors: a connection
    left open in a reference cycle warns when it is collected, otherwise whenever the
    collector next runs, in a later test that would fail in its place.
    """
    monkeypatch.delenv("REPLAYSAFE_LEDGER_URL", raising=False)
    monkeypatch.delenv("REPLAYSAFE_DISABLED", raising=False)
    replaysafe.testing.reset()
    yield
    replaysafe.testing.reset()
    gc.collect()


@pytest.fixture
def events(replaysafe_events: list[replaysafe.Event]) -> list[replaysafe.Event]:
    """Every event emitted while the test runs (the plugin's fixture, under the suite's short name)."""
    return replaysafe_events


@pytest.fixture
def ids() -> replaysafe.tool_call:
    """A ``tool_call`` scope with ids unique to this test."""
    return replaysafe.tool_call(f"thread-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")


#: Workers per core under ``pytest -n auto``: about 40% of the suite's time is spent waiting (on leases, servers
#: and child processes), so two per core keep the cores busy (measured on 2 cores: 2, 3 and 4 workers).
WORKERS_PER_CORE = 2


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return WORKERS_PER_CORE * (os.cpu_count() or 1)


def pytest_configure(config: pytest.Config) -> None:
    # Tests assert on replaysafe's own warnings; anything else is an error (pyproject).
    warnings.filterwarnings("default", category=ResourceWarning)


def _shared_servers() -> tuple[str, str] | None:
    """The servers every worker shares (the environment's, else the local ones), if both answer."""
    postgres = os.environ.get(servers.POSTGRES_ENV) or servers.LOCAL_POSTGRES
    redis_url = os.environ.get(servers.REDIS_ENV) or servers.LOCAL_REDIS
    if servers.postgres_answers(postgres) and servers.redis_answers(redis_url):
        return postgres, redis_url
    return None


_SHARED_BEFORE = pytest.StashKey[tuple[tuple[str, str], set[str]]]()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # The rule that lets tests run in parallel: each keeps to a schema and key prefix of its own and removes
    # them. Checked once per run, by the process that runs or distributes every test (not each xdist worker).
    if hasattr(session.config, "workerinput") or session.config.option.collectonly:
        return
    shared = _shared_servers()
    if shared is not None:
        session.config.stash[_SHARED_BEFORE] = (shared, servers.shared_state(*shared))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_SHARED_BEFORE, None)
    if before is None or session.testscollected == 0:
        return
    shared, found = before
    left = sorted(servers.shared_state(*shared) - found)
    if left:
        listed = "; ".join(left[:10]) + (f"; and {len(left) - 10} more" if len(left) > 10 else "")
        session.config.get_terminal_writer().line(
            f"\nthe run left on the shared servers, outside any test's own namespace: {listed}. Every test keeps "
            "to a schema and a key prefix of its own (the postgres_url and redis_url fixtures), so that tests in "
            "parallel workers never share a record.",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_finish(session: pytest.Session) -> None:
    # What collection imported (the frameworks of every adapter among it) lives for the whole
    # run: out of the collector's sight, the collection at each test's end walks only what
    # the tests made (a few milliseconds instead of a fifth of a second).
    gc.collect()
    gc.freeze()
