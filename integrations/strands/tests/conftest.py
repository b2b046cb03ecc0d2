"""Fixtures of the Strands adapter tests: a SQLite ledger per test, a PostgreSQL ledger URL of a test's own."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from replaysafe import Ledger, SqliteLedger, open_ledger


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SqliteLedger]:
    with SqliteLedger(tmp_path / "ledger.db") as opened:
        yield opened


#: The local test server (trust auth); REPLAYSAFE_TEST_POSTGRES_URL points elsewhere.
POSTGRES_URL = os.environ.get("REPLAYSAFE_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")


@pytest.fixture
def postgres_ledger_url() -> Iterator[str]:
    """A PostgreSQL ledger URL whose tables live in a schema of this test's own, dropped afterwards."""
    schema = f"rs_strands_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"cannot reach the PostgreSQL server for the ledger tests ({exc}). Start one at 127.0.0.1:5432 "
            "(user root, database test, trust auth) or set REPLAYSAFE_TEST_POSTGRES_URL."
        )
    with admin:
        try:
            yield f"{POSTGRES_URL}?schema={schema}"
        finally:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


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
