"""The ledger suite runs on every backend and on each driver of one: PostgreSQL's ``.aio`` on asyncpg too.

(The rest of the suite runs on the backends alone: a sync call on ``postgresql+asyncpg://`` is made by
psycopg, as on ``postgresql://``, so running it twice would prove nothing more.)
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests import servers
from tests.conftest import DURABLE_BACKENDS, LEDGER_BACKENDS

DRIVERS: dict[str, Callable[[pytest.FixtureRequest], str]] = {
    "postgres-asyncpg": lambda request: servers.with_driver(str(request.getfixturevalue("postgres_url")), "asyncpg"),
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
