"""The ledger suite runs on every backend and on each driver of one: PostgreSQL's ``.aio`` on asyncpg too, and
PostgreSQL with a Redis cache in front (``tiered``).

(The rest of the suite runs on the backends alone: a sync call on ``postgresql+asyncpg://`` is made by
psycopg, as on ``postgresql://``, so running it twice would prove nothing more.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests import servers
from tests.conftest import DURABLE_BACKENDS, LEDGER_BACKENDS
from tests.servers import PostgresServer, RedisServer

DRIVERS: dict[str, Callable[[pytest.FixtureRequest], str]] = {
    "postgres-asyncpg": lambda request: servers.with_driver(str(request.getfixturevalue("postgres_url")), "asyncpg"),
    # PostgreSQL with a Redis cache in front (``TieredLedger``): the cache's URL goes percent-encoded.
    "tiered": lambda request: servers.with_query(
        str(request.getfixturevalue("postgres_url")), cache=str(request.getfixturevalue("redis_url"))
    ),
}
BACKENDS = {**LEDGER_BACKENDS, **DRIVERS}


@pytest.fixture(params=list(BACKENDS))
def ledger_url(request: pytest.FixtureRequest) -> str:
    """A URL of each backend and driver, for a test that opens the ledger in several processes."""
    return BACKENDS[request.param](request)


@pytest.fixture(params=[*DURABLE_BACKENDS, *DRIVERS])
def durable_ledger_url(request: pytest.FixtureRequest) -> str:
    """A URL of each backend and driver that survives a process."""
    return BACKENDS[request.param](request)


def _server(kind: type[PostgresServer] | type[RedisServer]) -> Any:
    """A throwaway server on a free port, started (a test that restarts or stops one never touches the shared ones)."""
    try:
        server = kind()
    except FileNotFoundError as exc:
        pytest.fail(f"cannot start a throwaway server: {exc}")
    server.start()
    return server


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    server = _server(PostgresServer)
    yield server
    server.destroy()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = _server(RedisServer)
    yield server
    server.destroy()
