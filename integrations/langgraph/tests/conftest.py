"""Fixtures of the LangGraph adapter tests: ledgers, a private Postgres schema, the child script."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from replaysafe import SqliteLedger

#: The local test server (trust auth); REPLAYSAFE_TEST_POSTGRES_URL points elsewhere.
DEFAULT_POSTGRES_URL = "postgresql://root@127.0.0.1:5432/test"


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SqliteLedger]:
    """A fresh SQLite ledger in a temporary file."""
    with SqliteLedger(tmp_path / "ledger.db") as opened:
        yield opened


@pytest.fixture
def thread_id() -> str:
    return f"thread-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A connection string whose search_path is a schema of this test's own, dropped afterwards."""
    base = os.environ.get("REPLAYSAFE_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    schema = f"rs_langgraph_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"cannot reach the Postgres server for the checkpointer tests ({exc}). Start one at 127.0.0.1:5432 "
            "(user root, database test, trust auth) or set REPLAYSAFE_TEST_POSTGRES_URL."
        )
    with admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        try:
            yield make_conninfo(base, options=f"-c search_path={schema}")
        finally:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
