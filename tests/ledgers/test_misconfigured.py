"""Misconfiguration fails closed: a permanent ledger fault raises whatever ``on_ledger_error`` says.

Each case is real: a URL option the ledger does not know, a SQLite file in a
missing directory, a missing table with creation disabled, a PostgreSQL role
without CREATE (a throwaway role, dropped afterwards), a login the server
refuses. The tools use the default policy (``on_ledger_error="warn"``), under
which a transient fault would run them unprotected: a permanent one must not.
"""

from __future__ import annotations

import asyncio
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from replaysafe import (
    CallKey,
    LedgerError,
    PostgresLedger,
    RedisLedger,
    SqliteLedger,
    open_ledger,
    replay_safe,
    tool_call,
)
from replaysafe.ledgers import Ledger, RetryPolicy

from ..servers import RedisServer, free_port, libpq_url, with_driver

ONE_TRY = RetryPolicy(attempts=1)


def _split(url: str) -> tuple[str, str]:
    """The server URL without the fixture's ``?schema=`` option, and the schema."""
    parts = urllib.parse.urlsplit(url)
    schema = urllib.parse.parse_qs(parts.query)["schema"][0]
    return urllib.parse.urlunsplit(parts._replace(query="")), schema


def _fails_closed(ledger: Ledger, *fix_words: str) -> LedgerError:
    """Under the default policy, a sync and an async call raise LedgerError naming the fix; the tool never runs."""
    runs: list[str] = []

    @replay_safe(ledger=ledger)
    def refund(order: str) -> str:
        runs.append(order)
        return "refunded"

    @replay_safe(ledger=ledger)
    async def arefund(order: str) -> str:
        runs.append(order)
        return "refunded"

    with tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c"), pytest.raises(LedgerError) as raised:
        refund("card-4111")

    async def call() -> None:
        async with tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c"):
            await arefund("card-4111")

    with pytest.raises(LedgerError) as araised:
        asyncio.run(call())
    assert runs == []
    for error in (raised.value, araised.value):
        assert error.permanent
        assert not error.transient
        assert "refund" in str(error)
        assert "card-4111" not in str(error)
        for word in fix_words:
            assert word in str(error)
    return raised.value


# --- URL options --------------------------------------------------------------------


def test_the_readmes_schema_url_works_with_the_postgres_ledger(postgres_url: str) -> None:
    """``PostgresLedger("postgresql://...?schema=...")`` puts the table in that schema."""
    server, schema = _split(postgres_url)
    with PostgresLedger(f"{server}?schema={schema}&table=calls") as ledger:

        @replay_safe(ledger=ledger)
        def refund() -> str:
            return "refunded"

        with tool_call("t", "m", "c"):
            assert refund() == "refunded"
    with psycopg.connect(libpq_url(server), autocommit=True) as conn:
        count = conn.execute(f"SELECT count(*) FROM {schema}.calls").fetchone()  # our own generated identifier
    assert count == (1,)


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "redis"])
def test_an_unknown_url_option_is_refused_at_construction(
    backend: str, tmp_path: Path, postgres_server_url: str, redis_server_url: str
) -> None:
    """A misspelt option raises at once, naming the option, never its value; known driver options pass."""
    base = {
        "sqlite": f"sqlite:///{tmp_path / 'l.db'}",
        "postgres": postgres_server_url,
        "redis": redis_server_url,
    }[backend]
    url = f"{base}?shcema=secret-value"
    with pytest.raises(ValueError, match="unknown URL option 'shcema'") as raised:
        open_ledger(url)
    assert "secret-value" not in str(raised.value)
    with pytest.raises(ValueError, match="wrong type"):
        open_ledger(f"{base}?ttl=soon")
    if backend != "sqlite":
        driver_option = "application_name=rs" if backend == "postgres" else "health_check_interval=5"
        open_ledger(f"{base}?{driver_option}&io_timeout=3&connect_timeout=2").close()


def test_timeouts_come_from_arguments_or_the_url(postgres_server_url: str, redis_server_url: str) -> None:
    """Defaults, URL options and arguments (which win) for both server ledgers; nonsense is refused."""
    for backend in (PostgresLedger, RedisLedger):
        base = postgres_server_url if backend is PostgresLedger else redis_server_url
        default = backend(base)
        assert (default.connect_timeout, default.io_timeout) == (5.0, 15.0)
        from_url = backend(f"{base}?connect_timeout=3&io_timeout=4")
        assert (from_url.connect_timeout, from_url.io_timeout) == (3.0, 4.0)
        assert backend(f"{base}?io_timeout=4", io_timeout=7).io_timeout == 7.0
        for bad in (0, -1, True, "5"):
            with pytest.raises(ValueError, match="io_timeout"):
                backend(base, io_timeout=bad)  # type: ignore[arg-type]


def test_postgres_connections_carry_the_bounds(postgres_url: str) -> None:
    """The server sees statement_timeout and lock_timeout, the socket a tcp_user_timeout and keepalives."""
    with PostgresLedger(postgres_url, io_timeout=4) as ledger, ledger.engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        assert raw.execute("SHOW statement_timeout").fetchone() == ("4s",)
        assert raw.execute("SHOW lock_timeout").fetchone() == ("2s",)
        params = raw.info.get_parameters()
        assert params["tcp_user_timeout"] == "4000"
        assert params["keepalives"] == "1"
        assert params["connect_timeout"] == "5"


def test_a_shared_redis_client_without_socket_timeout_is_warned_about(redis_server_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_server_url, socket_timeout=None)
    with pytest.warns(UserWarning, match="socket_timeout"):
        RedisLedger(client)
    client.close()


# --- permanent faults at first use -----------------------------------------------------


def test_a_sqlite_file_in_a_missing_directory_fails_closed(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    _fails_closed(SqliteLedger(missing / "ledger.db", retry=ONE_TRY), "create", str(missing))


def test_a_missing_sqlite_table_without_create_schema_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.touch()
    _fails_closed(SqliteLedger(path, create_schema=False, retry=ONE_TRY), "create_schema=True")


def test_a_missing_postgres_table_without_create_schema_fails_closed(postgres_url: str) -> None:
    server, schema = _split(postgres_url)
    with PostgresLedger(server, schema=schema, create_schema=False, retry=ONE_TRY) as ledger:
        _fails_closed(ledger, "create_schema=True", "ddl()")


def test_a_missing_postgres_database_fails_closed(postgres_server_url: str) -> None:
    parts = urllib.parse.urlsplit(postgres_server_url)
    url = urllib.parse.urlunsplit(parts._replace(path=f"/rs_missing_{uuid.uuid4().hex[:8]}"))
    with PostgresLedger(url, retry=ONE_TRY) as ledger:
        _fails_closed(ledger, "create it")


@pytest.fixture
def role_without_create(postgres_server_url: str) -> Iterator[str]:
    """A throwaway login role with no CREATE anywhere; dropped afterwards (and nothing else changed)."""
    role = f"rs_nocreate_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq_url(postgres_server_url), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN NOCREATEDB NOCREATEROLE")  # our own generated identifier
    parts = urllib.parse.urlsplit(postgres_server_url)
    host = parts.netloc.rpartition("@")[2]
    yield urllib.parse.urlunsplit(parts._replace(netloc=f"{role}@{host}"))
    with psycopg.connect(libpq_url(postgres_server_url), autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_role_without_create_fails_closed(role_without_create: str) -> None:
    """The message names the privilege, the object, the role and the other way: create_schema=False."""
    schema = f"rs_{uuid.uuid4().hex[:12]}"  # it cannot be created, so there is nothing to drop
    role = urllib.parse.urlsplit(role_without_create).username
    database = urllib.parse.urlsplit(role_without_create).path.lstrip("/")
    with PostgresLedger(role_without_create, schema=schema, retry=ONE_TRY) as ledger:
        _fails_closed(ledger, f"GRANT CREATE ON DATABASE {database} TO {role}", "create_schema=False", "ddl()")
    # No schema to create: the table goes into public, where the role may not create (PostgreSQL 15+).
    with PostgresLedger(role_without_create, table=f"rs_{uuid.uuid4().hex[:12]}", retry=ONE_TRY) as ledger:
        _fails_closed(ledger, "lacks USAGE, CREATE on schema public", f"GRANT USAGE, CREATE ON SCHEMA public TO {role}")


def test_a_login_the_postgres_server_refuses_fails_closed(postgres_server_url: str) -> None:
    parts = urllib.parse.urlsplit(postgres_server_url)
    host = parts.netloc.rpartition("@")[2]
    url = urllib.parse.urlunsplit(parts._replace(netloc=f"rs_no_such_role_{uuid.uuid4().hex[:8]}@{host}"))
    with PostgresLedger(url, retry=ONE_TRY) as ledger:
        _fails_closed(ledger, "user or password")


@pytest.mark.parametrize("fault", ["missing table", "missing database", "refused login"])
def test_faults_on_asyncpg_fail_closed_with_the_same_fixes(postgres_url: str, fault: str) -> None:
    """``.aio`` on asyncpg, reaching the server before the sync side made anything (create_schema=False):
    asyncpg's errors read as psycopg's do, by SQLSTATE, permanent and with the same fix."""
    server, schema = _split(postgres_url)
    parts = urllib.parse.urlsplit(server)
    host, suffix = parts.netloc.rpartition("@")[2], uuid.uuid4().hex[:8]
    url, words = {
        "missing table": (server, ("create_schema=True", "ddl()")),
        "missing database": (urllib.parse.urlunsplit(parts._replace(path=f"/rs_missing_{suffix}")), ("create it",)),
        "refused login": (
            urllib.parse.urlunsplit(parts._replace(netloc=f"rs_no_such_role_{suffix}@{host}")),
            ("user or password",),
        ),
    }[fault]
    with PostgresLedger(with_driver(url, "asyncpg"), schema=schema, create_schema=False, retry=ONE_TRY) as ledger:
        _fails_closed(ledger, *words)


def test_a_login_the_redis_server_refuses_fails_closed(redis_server_url: str) -> None:
    parts = urllib.parse.urlsplit(redis_server_url)
    host = parts.netloc.rpartition("@")[2]
    url = urllib.parse.urlunsplit(parts._replace(netloc=f"rs-no-such-user:wrong@{host}"))
    with RedisLedger(url, retry=ONE_TRY) as ledger:
        _fails_closed(ledger, "username or password")


# --- transient faults still follow the policy --------------------------------------------


@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_a_refused_connection_follows_the_policy(backend: str) -> None:
    """Nothing listens on the port: a transient fault, so the default policy runs the tool unprotected."""
    port = free_port()
    url = f"postgresql://root@127.0.0.1:{port}/test" if backend == "postgres" else f"redis://127.0.0.1:{port}/0"
    runs: list[int] = []
    with open_ledger(url, retry=ONE_TRY) as ledger:

        @replay_safe(ledger=ledger)
        def refund() -> str:
            runs.append(1)
            return "refunded"

        @replay_safe(ledger=ledger, on_ledger_error="raise")
        def strict_refund() -> str:
            runs.append(2)
            return "refunded"

        with tool_call("t", "m", "c"):
            assert refund() == "refunded"
        with tool_call("t", "m", "c2"), pytest.raises(LedgerError) as raised:
            strict_refund()
    assert raised.value.transient
    assert not raised.value.permanent
    assert runs == [1]


# --- check() on a broken ledger ------------------------------------------------------------


def test_check_names_the_fix_on_a_misconfigured_ledger(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with pytest.raises(LedgerError, match="check failed at claim") as raised:
        SqliteLedger(missing / "ledger.db", retry=ONE_TRY).check()
    assert not raised.value.transient
    assert f"create {missing}" in str(raised.value)


def test_check_fails_on_a_table_it_may_not_write(role_without_create: str, postgres_url: str) -> None:
    """A table the role can read but not write: the probe fails at the step that writes, naming GRANT."""
    server, schema = _split(postgres_url)
    with PostgresLedger(postgres_url) as owner:
        owner.check()  # the owner creates the schema and table
    role = urllib.parse.urlsplit(role_without_create).username
    with psycopg.connect(libpq_url(server), autocommit=True) as conn:
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")  # generated identifiers only
        conn.execute(f"GRANT SELECT ON {schema}.tool_executions TO {role}")
    parts = urllib.parse.urlsplit(role_without_create)
    url = urllib.parse.urlunsplit(parts._replace(query=f"schema={schema}"))
    with PostgresLedger(url, create_schema=False, retry=ONE_TRY) as ledger:
        with pytest.raises(LedgerError, match="check failed at claim") as raised:
            ledger.check()
        assert not raised.value.transient
        assert f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE tool_executions TO {role}" in str(raised.value)
        assert ledger.get(CallKey("t", "m", "c")) is None  # reading is allowed: only the write failed
    with psycopg.connect(libpq_url(server), autocommit=True) as conn:
        conn.execute(f"REVOKE ALL ON {schema}.tool_executions FROM {role}")
        conn.execute(f"REVOKE ALL ON SCHEMA {schema} FROM {role}")


@pytest.mark.parametrize("url", ["redis://127.0.0.1:{}/0", "postgresql+asyncpg://root@127.0.0.1:{}/test"])
async def test_acheck_reports_an_unreachable_server_as_transient(url: str) -> None:
    ledger = open_ledger(url.format(free_port()), retry=ONE_TRY, create_schema=False) if "postgres" in url else (
        RedisLedger(url.format(free_port()), retry=ONE_TRY))  # fmt: skip
    with pytest.raises(LedgerError, match="check failed at claim") as raised:
        await ledger.acheck()
    assert raised.value.transient
    await ledger.aclose()


def test_a_redis_user_without_the_ledgers_commands_fails_closed() -> None:
    """An ACL user that may not run scripts (NOPERM), on a throwaway server: permanent, names the grant."""
    import redis

    try:
        server = RedisServer()
    except FileNotFoundError as exc:
        pytest.fail(f"cannot start a throwaway Redis: {exc}")
    server.start()
    try:
        admin = redis.Redis.from_url(server.url)
        admin.acl_setuser("rs-limited", enabled=True, passwords=["+pw"], keys=["*"], commands=["+ping", "+get"])
        admin.close()
        url = server.url.replace("redis://", "redis://rs-limited:pw@")
        with RedisLedger(url, retry=ONE_TRY) as ledger:
            _fails_closed(ledger, "Grant the Redis user", "rs-limited may not run EVALSHA")
        admin = redis.Redis.from_url(server.url)
        admin.acl_setuser("rs-other-keys", enabled=True, passwords=["+pw"], keys=["other:*"], commands=["+@all"])
        admin.close()
        url = server.url.replace("redis://", "redis://rs-other-keys:pw@")
        with RedisLedger(url, prefix="calls", retry=ONE_TRY) as ledger:
            _fails_closed(ledger, "may not access the ledger's keys", "ACL SETUSER rs-other-keys ~calls:*")
    finally:
        server.destroy()
