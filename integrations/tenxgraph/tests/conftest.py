"""Fixtures of the 10xGraph adapter tests: a private Postgres schema, a thread id, a child-process spec."""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from psycopg import sql

from tenxgraph_scenario import Spec

#: The local test servers (trust auth); REPLAYSAFE_TEST_POSTGRES_URL / _REDIS_URL point elsewhere.
POSTGRES_URL = os.environ.get("REPLAYSAFE_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("REPLAYSAFE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def schema() -> Iterator[str]:
    """A schema of this test's own for 10xGraph's checkpointer tables (and a Postgres ledger), dropped after."""
    name = f"rs_tenx_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"cannot reach the Postgres server for the checkpointer tests ({exc}). Start one at 127.0.0.1:5432 "
            "(user root, database test, trust auth) or set REPLAYSAFE_TEST_POSTGRES_URL."
        )
    with admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        try:
            yield name
        finally:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def thread_id() -> Iterator[str]:
    """A thread id no other test uses; the checkpointer's Redis keys of this thread are deleted after."""
    thread = f"rs-tenx-{uuid.uuid4().hex}"
    yield thread
    client = redis.Redis.from_url(REDIS_URL)
    with client:
        # Only this thread's own keys (state_cache:<thread>:<user>, ...): never a flush.
        keys = list(client.scan_iter(match=f"*{thread}*"))
        if keys:
            client.delete(*keys)


@pytest.fixture
def make_spec(schema: str, thread_id: str, tmp_path: Path) -> Callable[..., Spec]:
    """A child-process spec on this test's schema and thread, a SQLite ledger and an effects file."""
    base = Spec(
        postgres_url=POSTGRES_URL,
        schema=schema,
        redis_url=REDIS_URL,
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        thread_id=thread_id,
        effects=str(tmp_path / "effects.txt"),
    )

    def make(**changes: Any) -> Spec:
        return dataclasses.replace(base, **changes)

    return make
