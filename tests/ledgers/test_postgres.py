"""What only the PostgreSQL ledger (and, for expiry and closing, the other SQL one) has to prove."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
import subprocess
import sys
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
import sqlalchemy as sa
from freezegun import freeze_time

import replaysafe
from replaysafe import CallKey, LedgerError, PostgresLedger, SqliteLedger, Status, replay_safe, tool_call
from replaysafe.ledgers._sql import Step
from replaysafe.ledgers.postgres import _psycopg_url

from ..servers import libpq_url, with_driver, with_query

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
LEASE = NOW + dt.timedelta(minutes=5)
HOSTILE = [
    "plain",
    "a:b",
    ":",
    "{tag}",
    "}{",
    "*",
    "?",
    "[a-z]",
    "\\",
    "with space",
    "%3A",
    "ünï ✓ 中文 🎉",
    "x" * 1024,
    "'; DROP TABLE tool_executions; --",
    "1' OR '1'='1",
]


def _split(url: str) -> tuple[str, str]:
    """The server URL and the schema of a ``postgres_url``."""
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    schema = query.pop("schema")
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query))), schema


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresLedger]:
    with replaysafe.open_ledger(postgres_url) as ledger:
        assert isinstance(ledger, PostgresLedger)
        yield ledger


def claim(ledger: replaysafe.Ledger, key: CallKey, owner: str = "o#1", now: dt.datetime = NOW) -> bool:
    return ledger.claim(
        key, tool_name="t", args_digest="d", owner=owner, now=now, lease_expires_at=now + dt.timedelta(minutes=5)
    ).claimed


def test_hostile_ids_stay_in_their_own_record_and_thread(pg: PostgresLedger) -> None:
    """Ids with separators, glob and SQL text, unicode and 1 KB never collide or reach another thread."""
    keys = [CallKey(t, m, c) for t in HOSTILE for m, c in ((t, t), ("m", t), (t + ":", "c"))]
    keys.append(CallKey("a", "b:c", "d"))  # would collide with ("a:b", "c", "d") under naive joining
    keys.append(CallKey("a:b", "c", "d"))
    for n, key in enumerate(keys):
        assert claim(pg, key, owner=f"o#{n}")
        assert pg.complete(key, owner=f"o#{n}", status=Status.COMPLETED, result=str(n), now=NOW)
    for n, key in enumerate(keys):
        stored = pg.get(key)
        assert stored is not None and stored.key == key and stored.result == str(n)
    assert pg.get_many(keys) == {key: pg.get(key) for key in keys}
    for thread in HOSTILE:
        mine = [k for k in keys if k.thread_id == thread]
        assert sorted(r.key for r in pg.records(thread_id=thread)) == sorted(mine)
        assert pg.purge_thread(thread) == len(mine)
        assert all(pg.get(k) is None for k in mine)
    assert {r.key for r in pg.records()} == {k for k in keys if k.thread_id not in HOSTILE}


def test_a_nul_in_an_id_is_refused_and_nothing_is_stored(pg: PostgresLedger) -> None:
    """PostgreSQL text cannot hold NUL: the claim fails with a clear error and stores nothing."""
    with pytest.raises(psycopg.DataError, match="NUL"):
        claim(pg, CallKey("t", "m\x00", "c"))
    assert list(pg.records()) == []


def test_url_forms_and_bad_names(postgres_server_url: str) -> None:
    """postgresql:// and postgres:// mean psycopg 3; other drivers and non-identifiers are refused."""
    assert _psycopg_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert _psycopg_url("postgres://u@h/db").drivername == "postgresql+psycopg"
    assert _psycopg_url("postgresql+psycopg://u@h/db").drivername == "postgresql+psycopg"
    with pytest.raises(ValueError, match="psycopg 3"):
        PostgresLedger("postgresql+psycopg2://u@h/db")
    with pytest.raises(ValueError, match="not a valid SQL identifier"):
        PostgresLedger(postgres_server_url, table="x; DROP TABLE y")
    with pytest.raises(ValueError, match="not a valid SQL identifier"):
        PostgresLedger(postgres_server_url, schema='a"b')
    with pytest.raises(TypeError, match="URL or a SQLAlchemy Engine"):
        PostgresLedger(42)  # type: ignore[arg-type]
    assert "secret" not in repr(PostgresLedger("postgresql://u:secret@h/db"))


# --- expiry: our clock, so freezegun -----------------------------------------------------


@pytest.fixture(params=["postgres", "sqlite"])
def sql_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


def test_ttl_expiry_with_a_frozen_clock(sql_url: str) -> None:
    """A finished record counts until its ttl, then is absent, and a new claim replaces it."""
    key = CallKey("t", "m", "c")
    with replaysafe.open_ledger(sql_url, ttl=60) as ledger, freeze_time(NOW) as clock:
        assert claim(ledger, key)
        assert ledger.complete(key, owner="o#1", status=Status.COMPLETED, result="1", now=NOW)
        stored = ledger.get(key)
        assert stored is not None and stored.expires_at == NOW + dt.timedelta(seconds=60)
        clock.tick(59)
        assert ledger.get(key) is not None
        assert not claim(ledger, key, owner="o#2", now=NOW + dt.timedelta(seconds=59))
        clock.tick(2)
        later = NOW + dt.timedelta(seconds=61)
        assert ledger.get(key) is None
        assert ledger.get_many([key]) == {}
        assert list(ledger.records()) == []
        assert claim(ledger, key, owner="o#3", now=later)
        replaced = ledger.get(key)
        assert replaced is not None and (replaced.owner, replaced.attempt, replaced.expires_at) == ("o#3", 1, None)


def test_in_doubt_and_running_records_never_expire(sql_url: str) -> None:
    """Only completed and failed records get a ttl."""
    with replaysafe.open_ledger(sql_url, ttl=1) as ledger, freeze_time(NOW) as clock:
        doubt, running = CallKey("t", "m", "doubt"), CallKey("t", "m", "running")
        assert claim(ledger, doubt) and claim(ledger, running)
        assert ledger.complete(doubt, owner="o#1", status=Status.IN_DOUBT, result=None, now=NOW)
        clock.tick(3600)
        assert ledger.purge_expired() == 0  # type: ignore[attr-defined]
        assert {r.key for r in ledger.records()} == {doubt, running}


def test_purge_expired_deletes_in_bounded_batches(sql_url: str) -> None:
    """purge_expired() removes every expired record, batch by batch, and keeps the rest."""
    with replaysafe.open_ledger(sql_url, ttl=10) as ledger, freeze_time(NOW) as clock:
        for n in range(25):
            key = CallKey("old", "m", str(n))
            assert claim(ledger, key)
            assert ledger.complete(key, owner="o#1", status=Status.COMPLETED, result="1", now=NOW)
        clock.tick(11)
        fresh = CallKey("new", "m", "c")
        now = NOW + dt.timedelta(seconds=11)
        assert claim(ledger, fresh, now=now)
        assert ledger.complete(fresh, owner="o#1", status=Status.FAILED, result="{}", now=now)
        assert ledger.purge_expired(batch_size=10) == 25  # type: ignore[attr-defined]
        assert ledger.purge_expired() == 0  # type: ignore[attr-defined]
        assert [r.key for r in ledger.records()] == [fresh]
        with pytest.raises(ValueError, match="batch_size"):
            ledger.purge_expired(batch_size=0)  # type: ignore[attr-defined]


# --- schema ------------------------------------------------------------------------------

RACER = """
import sys, datetime as dt
from replaysafe import CallKey, open_ledger
now = dt.datetime.now(dt.timezone.utc)
with open_ledger(sys.argv[1]) as ledger:
    ledger.claim(CallKey("t", "m", sys.argv[2]), tool_name="t", args_digest="d", owner="o", now=now,
                 lease_expires_at=now)
"""


def test_schema_creation_raced_by_processes(postgres_url: str) -> None:
    """Six fresh processes create the same schema and table at once: all succeed."""
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER, postgres_url, str(n)], stderr=subprocess.PIPE, text=True)
        for n in range(6)
    ]
    for racer in racers:
        _, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
    with replaysafe.open_ledger(postgres_url) as ledger:
        assert len(list(ledger.records())) == 6


def test_schema_creation_raced_by_threads(postgres_url: str) -> None:
    """Eight ledgers in eight threads create the same schema at once: all succeed."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def racer(n: int) -> None:
        try:
            with replaysafe.open_ledger(postgres_url) as ledger:
                barrier.wait()
                claim(ledger, CallKey("t", "m", str(n)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_ddl_applied_by_hand_with_create_schema_off(postgres_url: str) -> None:
    """An operator applies ddl() through their migrations; the ledger then creates nothing itself."""
    server, schema = _split(postgres_url)
    ledger = PostgresLedger(server, schema=schema, create_schema=False)
    statements = ledger.ddl()
    assert statements[0] == f"CREATE SCHEMA IF NOT EXISTS {schema}"
    assert any("PRIMARY KEY (call_key)" in s for s in statements)
    assert statements[-1].startswith(f"CREATE OR REPLACE FUNCTION {schema}.tool_executions_try_claim(")
    with psycopg.connect(libpq_url(server), autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[call-overload]
    with ledger:
        assert claim(ledger, CallKey("t", "m", "c"))
        assert not claim(ledger, CallKey("t", "m", "c"))  # a replay reads the record


def test_a_replay_reads_its_record_and_locks_or_writes_nothing(postgres_url: str) -> None:
    """A replay's claim finds the live record and never reaches the claim function: an ``INSERT ... ON
    CONFLICT DO UPDATE`` that skips a live row still locks it (its ``xmax``), a write on every replay."""
    server, schema = _split(postgres_url)
    key = CallKey("t", "m", "c")
    version = psycopg.sql.SQL("SELECT xmin::text, xmax::text FROM {} WHERE thread_id = 't'").format(
        psycopg.sql.Identifier(schema, "tool_executions")
    )
    with PostgresLedger(server, schema=schema) as ledger, psycopg.connect(libpq_url(server)) as conn:
        assert claim(ledger, key)
        assert ledger.complete(key, owner="o#1", status=Status.COMPLETED, result="r", now=NOW)
        before = conn.execute(version).fetchall()
        conn.rollback()
        for _ in range(3):
            replayed = ledger.claim(key, tool_name="t", args_digest="d", owner="o#2", now=NOW, lease_expires_at=LEASE)
            assert not replayed.claimed
            assert (replayed.record.status, replayed.record.owner) == (Status.COMPLETED, "o#1")
        assert conn.execute(version).fetchall() == before
        assert before[0][1] == "0"


def _table_of_an_earlier_version(server: str, schema: str) -> None:
    """The schema, table and indexes of ``ddl()``, without the claim function (a deployment made before it)."""
    with psycopg.connect(libpq_url(server), autocommit=True) as conn:
        for statement in PostgresLedger(server, schema=schema).ddl():
            if "FUNCTION" not in statement:
                conn.execute(statement)  # type: ignore[call-overload]


def test_a_table_without_its_claim_function_gets_it_with_create_schema(postgres_url: str) -> None:
    """An existing deployment upgrades by itself when the ledger may create: the function is made on first use."""
    server, schema = _split(postgres_url)
    _table_of_an_earlier_version(server, schema)
    with PostgresLedger(server, schema=schema) as ledger:
        assert claim(ledger, CallKey("t", "m", "c"))
        assert not claim(ledger, CallKey("t", "m", "c"))


def test_an_earlier_versions_claim_function_is_left_for_its_workers(postgres_url: str) -> None:
    """A table made by a version whose function was ``<table>_claim`` (a set-returning one, which
    ``CREATE OR REPLACE`` cannot turn into this one) gets its own function beside it; the old one is
    left as it is, for that version's workers still running against the table."""
    server, schema = _split(postgres_url)
    _table_of_an_earlier_version(server, schema)
    old = psycopg.sql.Identifier(schema, "tool_executions_claim")
    definition = psycopg.sql.SQL("SELECT pg_get_functiondef({}::regproc)").format(
        psycopg.sql.Literal(f"{schema}.tool_executions_claim")
    )
    with psycopg.connect(libpq_url(server), autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL(
                "CREATE FUNCTION {}(text, text, text, text, text, text, text, timestamptz, timestamptz) "
                "RETURNS TABLE (claimed boolean) LANGUAGE sql AS 'SELECT true'"
            ).format(old)
        )
        before = conn.execute(definition).fetchall()
        with PostgresLedger(server, schema=schema) as ledger:
            assert claim(ledger, CallKey("t", "m", "c"))
            assert not claim(ledger, CallKey("t", "m", "c"))
        assert conn.execute(definition).fetchall() == before


def test_a_missing_claim_function_without_create_schema_fails_closed(postgres_url: str) -> None:
    """create_schema=False on a table made before the claim function: the error names the function and the fix."""
    server, schema = _split(postgres_url)
    _table_of_an_earlier_version(server, schema)
    with PostgresLedger(server, schema=schema, create_schema=False) as ledger:

        @replay_safe(ledger=ledger, on_ledger_error="raise")
        def tool() -> int:
            return 1

        with tool_call("t", "m", "c"), pytest.raises(LedgerError, match=r"claim function.*ledger\.ddl\(\)") as raised:
            tool()
        assert raised.value.permanent


def test_a_missing_table_without_create_schema_fails_closed(postgres_url: str) -> None:
    """create_schema=False and no table: the protected call fails with a LedgerError that says what to check."""
    server, schema = _split(postgres_url)
    with PostgresLedger(server, schema=schema, create_schema=False) as ledger:

        @replay_safe(ledger=ledger, on_ledger_error="raise")
        def tool() -> int:
            return 1

        with tool_call("t", "m", "c"), pytest.raises(LedgerError, match=r"create_schema=True, or apply ledger\.ddl"):
            tool()


# --- shared engines ---------------------------------------------------------------------


def test_a_shared_engine_is_used_and_left_open(postgres_url: str) -> None:
    """Given the app's Engine, the ledger shares its pool, restores its settings, and never disposes it."""
    server, schema = _split(postgres_url)
    engine = sa.create_engine(_psycopg_url(server), pool_size=2)  # not autocommit
    try:
        with PostgresLedger(engine, schema=schema) as ledger:
            key = CallKey("t", "m", "c")
            assert claim(ledger, key)
            assert ledger.complete(key, owner="o#1", status=Status.COMPLETED, result="1", now=NOW)
            assert ledger.engine is engine
        assert engine.pool.checkedin() >= 1  # not disposed
        with engine.connect() as conn:
            assert conn.connection.driver_connection.autocommit is False  # type: ignore[union-attr]
            count = conn.execute(sa.text(f"SELECT count(*) FROM {schema}.tool_executions")).scalar()
        assert count == 1
    finally:
        engine.dispose()


def test_an_engine_with_another_driver_is_refused(postgres_server_url: str) -> None:
    """The ledger's statements need psycopg 3; an engine of another driver is refused up front."""
    engine = sa.create_engine("sqlite://")
    with pytest.raises(ValueError, match="psycopg 3"):
        PostgresLedger(engine)
    engine.dispose()


async def test_a_shared_async_engine_is_used_and_left_open(postgres_url: str) -> None:
    """Given the app's AsyncEngine, .aio borrows its pool, and close() does not dispose it."""
    import sqlalchemy.ext.asyncio as asyncio_ext

    server, schema = _split(postgres_url)
    engine = asyncio_ext.create_async_engine(_psycopg_url(server))
    try:
        async with PostgresLedger(engine, schema=schema) as ledger:
            key = CallKey("t", "m", "c")
            assert (await ledger.aio.claim(key, tool_name="t", args_digest="d", owner="o", now=NOW,
                                           lease_expires_at=LEASE)).claimed  # fmt: skip
            assert await ledger.aio.complete(key, owner="o", status=Status.COMPLETED, result="1", now=NOW)
            stored = await ledger.aio.get(key)
            assert stored is not None and stored.result == "1"
        async with engine.connect() as conn:
            assert (await conn.execute(sa.text("SELECT 1"))).scalar() == 1
    finally:
        await engine.dispose()


async def test_an_applications_asyncpg_pool_is_borrowed_and_left_open(postgres_url: str) -> None:
    """Given the app's asyncpg pool, .aio borrows its connections, and close() leaves the pool open;
    sync operations connect with the URL, on psycopg."""
    server, schema = _split(postgres_url)
    pool = await asyncpg.create_pool(libpq_url(server), min_size=0, max_size=2)
    try:
        async with PostgresLedger(server, schema=schema, asyncpg_pool=pool) as ledger:
            key = CallKey("t", "m", "c")
            assert (await ledger.aio.claim(key, tool_name="t", args_digest="d", owner="o", now=NOW,
                                           lease_expires_at=LEASE)).claimed  # fmt: skip
            assert pool.get_size() == 1  # the claim's connection, the pool's own
            assert await ledger.aio.complete(key, owner="o", status=Status.COMPLETED, result="1", now=NOW)
            stored = ledger.get(key)  # psycopg
            assert stored is not None and stored.result == "1"
            replayed = await ledger.aio.claim(key, tool_name="t", args_digest="d", owner="o#2", now=NOW,
                                              lease_expires_at=LEASE)  # fmt: skip
            assert not replayed.claimed and replayed.record == stored
        assert await pool.fetchval("SELECT 1") == 1
    finally:
        await pool.close()


async def test_a_postgresql_asyncpg_url_runs_aio_on_asyncpg_with_the_urls_settings(postgres_url: str) -> None:
    """``postgresql+asyncpg://``: .aio on asyncpg, with libpq's ``options`` as session settings (after the
    ledger's own, so they win), and every time read back as the instant written, in UTC."""
    url = with_driver(f"{postgres_url}&options=-c%20TimeZone%3DAsia/Kolkata%20-c%20application_name%3Drs", "asyncpg")
    key = CallKey("t", "m", "c")
    async with PostgresLedger(url) as ledger:
        assert (await ledger.aio.claim(key, tool_name="t", args_digest="d", owner="o", now=NOW,
                                       lease_expires_at=LEASE)).claimed  # fmt: skip
        names = "current_setting('TimeZone'), current_setting('application_name'), current_setting('statement_timeout')"
        settings = Step(f"SELECT {names}", (), lambda rows, count: tuple(rows[0]), False)
        assert await ledger.aio._run(settings) == ("Asia/Kolkata", "rs", "15s")  # type: ignore[attr-defined]
        replayed = await ledger.aio.claim(key, tool_name="t", args_digest="d", owner="o#2", now=NOW,
                                          lease_expires_at=LEASE)  # fmt: skip
        record = replayed.record
        assert (record.created_at, record.lease_expires_at) == (NOW, LEASE)
        assert record.created_at.utcoffset() == dt.timedelta(0)


def test_asyncpg_connections_close_with_their_event_loop(postgres_url: str) -> None:
    """An asyncpg connection closes only through its loop: the ledger's close them as the loop shuts
    down (``asyncio.run``), and close() later finds nothing left open (an unclosed one would warn)."""
    with PostgresLedger(with_driver(postgres_url, "asyncpg")) as ledger:

        async def use() -> Any:
            await asyncio.gather(*(ledger.aio.get(CallKey("t", "m", str(n))) for n in range(3)))
            return ledger.aio._pools[asyncio.get_running_loop()]  # type: ignore[attr-defined]

        pool = asyncio.run(use())
        assert pool.closed
        assert len(pool) == 0


def test_asyncpg_settings_that_cannot_apply_are_refused(postgres_server_url: str) -> None:
    """An asyncpg pool beside an AsyncEngine, something else as the pool, and libpq options that are not
    ``-c name=value`` settings (which asyncpg cannot take) fail at once, not at the first async call."""
    import sqlalchemy.ext.asyncio as asyncio_ext

    engine = asyncio_ext.create_async_engine(_psycopg_url(postgres_server_url))
    with pytest.raises(ValueError, match="not both"):
        PostgresLedger(engine, asyncpg_pool=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"asyncpg\.Pool"):
        PostgresLedger(postgres_server_url, asyncpg_pool=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="-c name=value"):
        PostgresLedger(with_driver(f"{postgres_server_url}?options=-d%205", "asyncpg"))


# --- async --------------------------------------------------------------------------------


async def test_async_takeover_release_and_fencing(pg: PostgresLedger) -> None:
    """.aio's takeover is a compare-and-set, and release and complete are fenced by owner."""
    key = CallKey("t", "m", "c")
    first = await pg.aio.claim(key, tool_name="t", args_digest="d", owner="a", now=NOW, lease_expires_at=NOW)
    assert first.claimed
    taken = await pg.aio.takeover(first.record, owner="b", now=NOW, lease_expires_at=LEASE)
    assert taken is not None and (taken.owner, taken.attempt) == ("b", 2)
    assert await pg.aio.takeover(first.record, owner="c", now=NOW, lease_expires_at=LEASE) is None
    assert not await pg.aio.complete(key, owner="a", status=Status.COMPLETED, result="1", now=NOW)
    assert not await pg.aio.release(key, owner="a")
    assert await pg.aio.get(key) == taken
    assert await pg.aio.release(key, owner="b")
    assert await pg.aio.get(key) is None
    assert await pg.aio.get_many([key]) == {}


def test_schema_names_are_isolated(postgres_server_url: str) -> None:
    """Two schemas on one server are two ledgers."""
    schemas = [f"rs_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    try:
        ledgers = [PostgresLedger(postgres_server_url, schema=s) for s in schemas]
        assert claim(ledgers[0], CallKey("t", "m", "c"))
        assert claim(ledgers[1], CallKey("t", "m", "c"))
        for ledger in ledgers:
            ledger.close()
    finally:
        with psycopg.connect(libpq_url(postgres_server_url), autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[call-overload]


# --- prepared statements and the ledger's own connections ---------------------------------

_PREPARED = Step("SELECT statement FROM pg_prepared_statements", (), lambda rows, count: [r[0] for r in rows], False)


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
@pytest.mark.parametrize(
    ("url_option", "prepared"), [("", True), ("prepare=false", False), ("prepare=true", True)], ids=str
)
async def test_hot_statements_are_prepared_unless_turned_off(
    postgres_url: str, url_option: str, prepared: bool, driver: str
) -> None:
    """Claim, complete and replay statements are prepared on the server by default; ``prepare=false``
    (for a pooler in transaction mode) prepares nothing, not even past psycopg's own threshold, and
    on asyncpg keeps no statement cache (its statements go unnamed)."""
    url = with_driver(f"{postgres_url}&{url_option}" if url_option else postgres_url, driver)
    async with PostgresLedger(url) as ledger:
        runs: list[str] = []

        @replay_safe(ledger=ledger)
        def refund(order: str) -> str:
            runs.append(order)
            return f"refunded {order}"

        @replay_safe(ledger=ledger)
        async def arefund(order: str) -> str:
            runs.append(order)
            return f"refunded {order}"

        for n in range(7):  # more than psycopg's prepare_threshold (5)
            for _ in range(2):  # a first call, then its replay
                with tool_call("t", f"m{n}", "c"):
                    assert refund(str(n)) == f"refunded {n}"
                async with tool_call("t", f"m{n}", "a"):
                    assert await arefund(str(n)) == f"refunded {n}"
        assert len(runs) == 14
        for statements in (ledger.run(_PREPARED), await ledger.aio._run(_PREPARED)):  # type: ignore[attr-defined]
            hot = [s for s in statements if "tool_executions" in s]
            if prepared:
                # The claim, which a replay is, and complete.
                assert any(s.startswith("SELECT CASE") and "_try_claim(" in s for s in hot)
                assert any(s.startswith("UPDATE") and "SET status" in s for s in hot)  # complete
            else:
                assert hot == []


def test_pool_size_bounds_the_connections_a_ledger_holds(postgres_url: str) -> None:
    """Threads beyond ``pool_size`` wait for a connection; the ledger never holds more."""
    with PostgresLedger(postgres_url, pool_size=2) as ledger:
        barrier = threading.Barrier(6)
        pids: set[int] = set()
        backend_pid = Step("SELECT pg_backend_pid(), pg_sleep(0.05)", (), lambda rows, count: rows[0][0], False)

        def work() -> None:
            barrier.wait()
            for _ in range(3):
                pids.add(ledger.run(backend_pid))

        threads = [threading.Thread(target=work) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert 1 <= len(pids) <= 2


def _close_while_an_operation_runs(ledger: PostgresLedger | SqliteLedger) -> None:
    """Run an operation in a thread, close the ledger while it holds its connection, let it finish."""
    in_use, closed = threading.Event(), threading.Event()

    def read_once_closed(rows: object, count: int) -> None:
        in_use.set()
        assert closed.wait(10)

    worker = threading.Thread(target=ledger.run, args=(Step("SELECT 1", (), read_once_closed, False),))
    worker.start()
    assert in_use.wait(10)
    ledger.close()
    closed.set()
    worker.join(10)
    assert not worker.is_alive()


def test_a_connection_in_use_when_the_ledger_closes_is_closed_when_given_back(postgres_url: str) -> None:
    """close() while an operation holds a connection: it is closed when it comes back, never kept open."""
    ledger = PostgresLedger(postgres_url)
    used: list[psycopg.Connection[object]] = []
    original = ledger._pool.get

    def get() -> object:
        held = original()
        used.append(held[0])
        return held

    ledger._pool.get = get  # type: ignore[method-assign]
    _close_while_an_operation_runs(ledger)
    assert used[0].closed, "the connection came back after close() and was kept open"
    assert len(ledger._pool) == 0  # nor put into the pool a later use opens
    ledger.close()


def test_a_sqlite_connection_in_use_when_the_ledger_closes_is_closed_when_given_back(tmp_path: Path) -> None:
    """The same on SQLite: not left idle among the connections close() closed (open until collected)."""
    ledger = SqliteLedger(tmp_path / "ledger.db")
    connections = ledger._connections
    used: list[sqlite3.Connection] = []
    original = connections.take

    def take() -> sqlite3.Connection:
        used.append(original())
        return used[-1]

    connections.take = take  # type: ignore[method-assign]
    _close_while_an_operation_runs(ledger)
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        used[0].execute("SELECT 1")
    assert len(connections) == 0  # nor kept among the connections a later use takes
    ledger.close()


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_pool_size_must_be_a_positive_count(postgres_url: str, size: object) -> None:
    with pytest.raises(ValueError, match="pool_size must be a positive number of connections"):
        PostgresLedger(postgres_url, pool_size=size)  # type: ignore[arg-type]


def test_a_table_name_too_long_for_its_claim_function_is_refused(postgres_server_url: str) -> None:
    """PostgreSQL cuts names at 63 bytes: two tables of 62 and 63 characters would share one claim
    function (``<table>_try_claim``) and one ledger's claims would land in the other's table."""
    longest = "t" * 53
    assert PostgresLedger(postgres_server_url, table=longest, create_schema=False).table.name == longest
    with pytest.raises(ValueError, match="longer than 53 characters"):
        PostgresLedger(postgres_server_url, table=longest + "t", create_schema=False)


@pytest.mark.parametrize("zone", [None, "Asia/Kolkata"])
def test_records_read_back_as_the_same_utc_instants_in_any_session_zone(postgres_url: str, zone: str | None) -> None:
    """The ledger's connections run in UTC (timestamps then load without a conversion); a zone the
    URL's own ``options`` set wins, and every time still reads back as the instant written, in UTC."""
    url = postgres_url if zone is None else f"{postgres_url}&options=-c%20TimeZone%3D{zone}"
    key = CallKey("t", "m", "c")
    with PostgresLedger(url) as ledger:
        assert claim(ledger, key)
        held = ledger._pool.get()
        try:
            assert held[0].execute("SHOW TimeZone").fetchone() == (zone or "UTC",)
        finally:
            ledger._pool.put(held)
        for record in (
            ledger.get(key),
            ledger.claim(key, tool_name="t", args_digest="d", owner="o#2", now=NOW, lease_expires_at=LEASE).record,
        ):
            assert record is not None
            assert (record.created_at, record.updated_at, record.lease_expires_at) == (NOW, NOW, LEASE)
            assert record.created_at.utcoffset() == dt.timedelta(0)
        ledger.purge_thread("t")


def objects(postgres_url: str, like: str) -> list[str]:
    """The tables and functions in the test's schema whose names start with ``like``."""
    server, schema = _split(postgres_url)
    with psycopg.connect(libpq_url(server), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename LIKE %s "
            "UNION ALL SELECT proname FROM pg_proc JOIN pg_namespace n ON n.oid = pronamespace "
            "WHERE n.nspname = %s AND proname LIKE %s",
            (schema, like + "%", schema, like + "%"),
        ).fetchall()
    return sorted(row[0] for row in rows)


def test_drop_removes_the_table_and_its_claim_function_and_a_new_ledger_makes_them_again(postgres_url: str) -> None:
    url = with_query(postgres_url, table="one_run")
    with replaysafe.open_ledger(url) as ledger:
        assert claim(ledger, CallKey("t", "m", "c"))
        assert objects(postgres_url, "one_run") == ["one_run", "one_run_try_claim"]
        ledger.drop()  # type: ignore[attr-defined]
        assert objects(postgres_url, "one_run") == []
        ledger.drop()  # type: ignore[attr-defined]  # dropped already: nothing to do
    with replaysafe.open_ledger(url) as again:
        assert again.get(CallKey("t", "m", "c")) is None
        assert claim(again, CallKey("t", "m", "c"))
