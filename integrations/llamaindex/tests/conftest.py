"""Fixtures of the LlamaIndex adapter tests: a SQLite ledger per test, a PostgreSQL schema of a test's own; the
framework's own warnings left out."""

from __future__ import annotations

import os
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from replaysafe import Ledger, SqliteLedger, open_ledger

#: Warnings LlamaIndex itself gives: on every agent it builds (its workflow lists the pydantic model's members,
#: touching attributes pydantic deprecates), and in ReActAgent's model step (it asks ``ctx.is_running``, which
#: its workflows package deprecates). Not the adapter's, and not about what the tests check.
FRAMEWORK_WARNINGS = (
    "ignore::pydantic.warnings.PydanticDeprecatedSince20",
    "ignore::pydantic.warnings.PydanticDeprecatedSince211",
    "ignore:is_running called from within a step:DeprecationWarning",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The filters above, on this folder's tests only (they run under the repository's settings too)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            for spec in FRAMEWORK_WARNINGS:
                item.add_marker(pytest.mark.filterwarnings(spec))


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SqliteLedger]:
    with SqliteLedger(tmp_path / "ledger.db") as opened:
        yield opened


#: The PostgreSQL server the ledger tests use (the repository's tests read the same variable).
POSTGRES_SERVER = os.environ.get("REPLAYSAFE_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")


@pytest.fixture
def postgres_ledger_url() -> Iterator[str]:
    """The PostgreSQL server with a fresh schema of this test's own (``?schema=``), dropped afterwards."""
    schema = f"rs_llamaindex_{uuid.uuid4().hex[:12]}"
    parts = urllib.parse.urlsplit(POSTGRES_SERVER)
    query = [*urllib.parse.parse_qsl(parts.query), ("schema", schema)]
    yield urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    with psycopg.connect(urllib.parse.urlunsplit(parts._replace(scheme="postgresql")), autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # our own generated identifier


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    """A ledger on SQLite, then on PostgreSQL (in a schema of the test's own): for the tests that run on both."""
    if request.param == "sqlite":
        with SqliteLedger(tmp_path / "ledger.db") as opened:
            yield opened
        return
    ledger = open_ledger(request.getfixturevalue("postgres_ledger_url"))
    try:
        yield ledger
    finally:
        ledger.close()
