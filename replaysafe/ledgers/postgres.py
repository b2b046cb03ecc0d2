"""``PostgresLedger``: the ledger many workers and hosts share, in one PostgreSQL table.

SQLAlchemy owns the engine, the pool, the URL and the DDL. The protocol's
statements are plain SQL run on the pooled psycopg connection itself: a miss is
one claim-or-get statement plus one ``UPDATE``, a hit the one statement, each in
autocommit (no ``BEGIN``/``COMMIT`` round trips, no table lock). ``.aio`` runs
the same statements on psycopg's async connections, so no call blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import math
import re
import select
import sys
import typing
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg
import sqlalchemy as sa
from psycopg.pq import TransactionStatus
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.schema import CreateIndex, CreateSchema, CreateTable

from .._clock import utcnow
from .._constants import TABLE_NAME
from .._identity import key_digest
from .._records import CallKey, ClaimResult, Record, Status, expires_at
from ._options import io_timeouts, split_url_options
from ._protocol import TRANSIENT_FIX, AsyncLedger, LedgerFault, RetryPolicy, SigningKey
from ._sql import SqlLedger
from ._watchdog import watchdog

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

_DRIVER = "postgresql+psycopg"
_DIALECT: sa.Dialect = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
#: Connections one event loop may hold at once; more callers wait for one.
_ASYNC_POOL_SIZE = 10
#: Seconds a caller waits for a free async connection (then a transient error).
_ASYNC_POOL_TIMEOUT = 30.0
#: Serialises schema creation across every worker that starts at once.
_DDL_LOCK = int.from_bytes(hashlib.sha256(b"replaysafe.ledgers.postgres ddl").digest()[:8], "big", signed=True)

# The columns a ``Record`` is read from, in this order (see ``_record``).
_RECORD_COLUMNS = (
    "tool_name, args_digest, status, result, owner, attempt, created_at, updated_at, lease_expires_at, expires_at"
)


def _sql(table: str) -> dict[str, str]:
    """The protocol's statements for one (quoted, validated) table name; values are always parameters."""
    live = "(expires_at IS NULL OR expires_at > %(now)s)"
    return {
        # One statement, one round trip. A live record is read without writing or
        # locking anything (a hit stays a plain read). Otherwise the INSERT claims
        # the key, or replaces a record whose ttl ran out. When another worker's
        # INSERT commits after this statement's snapshot, neither branch returns a
        # row: the caller runs the statement again and then sees that record.
        "claim": f"""
            WITH found AS (
                SELECT {_RECORD_COLUMNS} FROM {table} WHERE call_key = %(call_key)s AND {live}
            ), claimed AS (
                INSERT INTO {table} AS t (
                    call_key, thread_id, message_id, tool_call_id, tool_name, args_digest, status, result,
                    owner, attempt, created_at, updated_at, lease_expires_at, expires_at)
                SELECT %(call_key)s, %(thread_id)s, %(message_id)s, %(tool_call_id)s, %(tool_name)s,
                    %(args_digest)s, 'running', NULL::text, %(owner)s, 1, %(now)s, %(now)s, %(lease_expires_at)s,
                    NULL::timestamptz
                WHERE NOT EXISTS (SELECT FROM found)
                ON CONFLICT (call_key) DO UPDATE SET
                    thread_id = excluded.thread_id, message_id = excluded.message_id,
                    tool_call_id = excluded.tool_call_id, tool_name = excluded.tool_name,
                    args_digest = excluded.args_digest, status = excluded.status, result = excluded.result,
                    owner = excluded.owner, attempt = excluded.attempt, created_at = excluded.created_at,
                    updated_at = excluded.updated_at, lease_expires_at = excluded.lease_expires_at,
                    expires_at = excluded.expires_at
                WHERE t.expires_at <= %(now)s
                RETURNING {_RECORD_COLUMNS}
            )
            SELECT true, {_RECORD_COLUMNS} FROM claimed
            UNION ALL
            SELECT false, {_RECORD_COLUMNS} FROM found""",
        "takeover": f"""
            UPDATE {table} SET status = 'running', result = NULL, owner = %(new_owner)s, attempt = attempt + 1,
                updated_at = %(now)s, lease_expires_at = %(lease_expires_at)s, expires_at = NULL
            WHERE call_key = %(call_key)s AND owner = %(owner)s AND attempt = %(attempt)s AND status = %(status)s""",
        # Fenced: only the claim's owner finishes it. Its own finished record matches
        # too, so a write tried again after a lost answer succeeds.
        "complete": f"""
            UPDATE {table} SET status = %(status)s, result = %(result)s, updated_at = %(now)s,
                expires_at = %(expires_at)s
            WHERE call_key = %(call_key)s AND owner = %(owner)s AND status IN ('running', %(status)s)""",
        "release": f"""
            DELETE FROM {table} WHERE call_key = %(call_key)s AND owner = %(owner)s AND status = 'running'""",
        # Fenced like complete: a lost or finished claim is left as it is.
        "renew": f"""
            UPDATE {table} SET lease_expires_at = %(lease_expires_at)s
            WHERE call_key = %(call_key)s AND owner = %(owner)s AND status = 'running'""",
        "get": f"SELECT {_RECORD_COLUMNS} FROM {table} WHERE call_key = %(call_key)s AND {live}",
        "get_many": f"SELECT call_key, {_RECORD_COLUMNS} FROM {table} WHERE call_key = ANY(%(call_keys)s) AND {live}",
    }


def _utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.timezone.utc)


def _record(key: CallKey, row: Sequence[Any]) -> Record:
    """A ``Record`` from a row of ``_RECORD_COLUMNS``."""
    return Record(
        key=key,
        tool_name=row[0],
        args_digest=row[1],
        status=Status(row[2]),
        result=row[3],
        owner=row[4],
        attempt=row[5],
        created_at=_utc(row[6]),
        updated_at=_utc(row[7]),
        lease_expires_at=_utc(row[8]),
        expires_at=_utc(row[9]) if row[9] is not None else None,
    )


def _params(key: CallKey, **values: Any) -> dict[str, Any]:
    return {"call_key": key_digest(*key), **values}


def _claim_params(
    key: CallKey, tool_name: str, args_digest: str, owner: str, now: dt.datetime, lease_expires_at: dt.datetime
) -> dict[str, Any]:
    thread_id, message_id, tool_call_id = key
    return _params(
        key,
        thread_id=thread_id,
        message_id=message_id,
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        args_digest=args_digest,
        owner=owner,
        now=now,
        lease_expires_at=lease_expires_at,
    )


def _takeover_params(record: Record, owner: str, now: dt.datetime, lease_expires_at: dt.datetime) -> dict[str, Any]:
    return _params(
        record.key,
        new_owner=owner,
        owner=record.owner,
        attempt=record.attempt,
        status=record.status.value,
        now=now,
        lease_expires_at=lease_expires_at,
    )


def _has_input(fileno: int) -> bool:
    """Whether the server sent something to an idle connection (a shutdown notice, or EOF)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fileno, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fileno], [], [], 0)[0])  # pragma: no cover - Windows


def _usable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """A pooled connection is usable when idle and the server has not hung up on it.

    After a server restart every pooled connection is dead, but the client learns
    it only when it next reads. The server's goodbye (or the socket's EOF) is
    already readable, so a zero-timeout poll finds it without a round trip.
    """
    if conn.closed or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    try:
        return not _has_input(conn.fileno())
    except (OSError, ValueError, psycopg.Error):
        return False


def _psycopg_url(url: str | sa.URL) -> sa.URL:
    """``postgresql://`` (or ``postgres://``) as SQLAlchemy's psycopg 3 URL; other drivers are refused."""
    parsed = sa.make_url(url)
    if parsed.drivername in ("postgres", "postgresql", "postgresql+psycopg_async"):
        parsed = parsed.set(drivername=_DRIVER)
    if parsed.drivername != _DRIVER:
        raise ValueError(
            f"PostgresLedger needs the psycopg 3 driver, got {parsed.render_as_string(hide_password=True)!r}: "
            "use a postgresql:// or postgresql+psycopg:// URL (pip install 'replaysafe-tools[postgres]')"
        )
    return parsed


# The ledger's own URL options; libpq's (sslmode, application_name, ...) stay in the URL.
# ``connect_timeout`` is both: the ledger reads it and hands it to libpq.
_LEDGER_OPTIONS: dict[str, Any] = {
    "table": str,
    "schema": str,
    "ttl": float,
    "connect_timeout": float,
    "io_timeout": float,
}
_LIBPQ_OPTIONS = frozenset(option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults())
#: Seconds the client waits past ``statement_timeout`` before it cuts a connection
#: that does not answer (the server's own cancel is the clean way out, when it runs).
_CUT_GRACE = 1.0

_AUTH_FIX = "PostgreSQL refused the login: fix the user or password in the URL, or the server's pg_hba.conf."
_DATABASE_FIX = "The database in the URL does not exist: create it, or fix the URL's database name."
_PRIVILEGE_FIX = (
    "The ledger's role lacks a privilege: GRANT it CREATE (and USAGE) on the schema, or have an owner create the "
    "table from ledger.ddl() and pass create_schema=False; the role then needs SELECT, INSERT, UPDATE and DELETE "
    "on the table."
)
#: What the ledger needs on each kind of object PostgreSQL names in "permission denied for <kind> <name>".
_PRIVILEGES = {
    "database": ("CREATE", "DATABASE", "to create the ledger's schema (create_schema=True)"),
    "schema": ("USAGE, CREATE", "SCHEMA", "to reach the ledger's table and, with create_schema=True, create it"),
    "table": ("SELECT, INSERT, UPDATE, DELETE", "TABLE", "to claim, record, read and delete calls"),
}
_DENIED = re.compile(r"permission denied for (database|schema|table) (.+)")
_MISSING_TABLE_FIX = (
    "The ledger's table or schema does not exist: pass create_schema=True, or apply ledger.ddl() (a migration)."
)
_URL_FIX = "The connection settings are invalid: fix the postgresql:// URL or its options."
_SQL_FIX = "PostgreSQL refused a ledger statement: check that the table matches ledger.ddl() (no foreign table)."
# SQLSTATEs and classes that pass: connection exceptions, shutdowns, overload, timeouts, conflicts.
_TRANSIENT_CLASSES = ("08", "53", "40")
_TRANSIENT_STATES = frozenset(
    {
        "57P01",  # admin_shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up)
        "57P05",  # idle_session_timeout
        "57014",  # query_canceled: statement_timeout
        "55P03",  # lock_not_available: lock_timeout
        "25006",  # read_only_sql_transaction: a standby, during a failover
        "58000",  # system_error
        "58030",  # io_error
        "XX000",  # internal_error
    }
)
# A server that answered a connection with FATAL refused it for good, except in these states.
_PASSING_FATALS = ("starting up", "shutting down", "in recovery", "too many clients", "connection slots", "not yet")


def _privilege_fix(primary: str, role: str | None) -> str:
    """The grant a "permission denied" names: the privilege, the object and the role, or the general fix."""
    denied = _DENIED.fullmatch(primary.strip())
    if denied is None:
        return _PRIVILEGE_FIX
    kind, name = denied[1], denied[2]
    privilege, keyword, why = _PRIVILEGES[kind]
    return (
        f"The ledger's role{f' {role}' if role else ''} lacks {privilege} on {kind} {name}, needed {why}: run "
        f"GRANT {privilege} ON {keyword} {name} TO {role or '<the role>'}; or have an owner apply ledger.ddl() and "
        "pass create_schema=False, the role then needs USAGE on the schema and SELECT, INSERT, UPDATE and DELETE "
        "on the table."
    )


def _diagnose(exc: BaseException, role: str | None = None) -> LedgerFault:
    """One place that tells a passing PostgreSQL fault from a misconfiguration, by SQLSTATE."""
    cause = getattr(exc, "orig", None) or exc
    if isinstance(cause, (TimeoutError, sa_exc.TimeoutError, sa_exc.DisconnectionError, ConnectionError)):
        return LedgerFault(True, TRANSIENT_FIX)
    if not isinstance(cause, psycopg.Error):
        return LedgerFault(False, _URL_FIX if isinstance(cause, (sa_exc.ArgumentError, ValueError)) else _SQL_FIX)
    state = cause.sqlstate or ""
    if state.startswith("28"):
        return LedgerFault(False, _AUTH_FIX)
    if state == "3D000":
        return LedgerFault(False, _DATABASE_FIX)
    if state == "42501":
        return LedgerFault(False, _privilege_fix(getattr(cause.diag, "message_primary", None) or "", role))
    if state in ("42P01", "3F000"):
        return LedgerFault(False, _MISSING_TABLE_FIX)
    if state.startswith(_TRANSIENT_CLASSES) or state in _TRANSIENT_STATES:
        return LedgerFault(True, TRANSIENT_FIX)
    if state:
        return LedgerFault(False, _SQL_FIX)
    # No SQLSTATE: libpq failed to connect or lost the connection.
    if isinstance(cause, psycopg.OperationalError):
        text = str(cause)
        if "FATAL:" not in text or any(passing in text for passing in _PASSING_FATALS):
            return LedgerFault(True, TRANSIENT_FIX)  # refused, reset, timed out, or the server is busy
        if "database" in text and "does not exist" in text:
            return LedgerFault(False, _DATABASE_FIX)
        if "permission denied" in text:
            return LedgerFault(False, _PRIVILEGE_FIX)
        return LedgerFault(False, _AUTH_FIX)  # role, password, pg_hba.conf
    if isinstance(cause, psycopg.InterfaceError):
        return LedgerFault(True, TRANSIENT_FIX)  # a connection closed under us
    return LedgerFault(False, _URL_FIX if isinstance(cause, psycopg.ProgrammingError) else _SQL_FIX)


def _is_async_engine(value: object) -> bool:
    # sqlalchemy.ext.asyncio needs greenlet; whoever built an AsyncEngine has imported it.
    module = sys.modules.get("sqlalchemy.ext.asyncio")
    return module is not None and isinstance(value, module.AsyncEngine)


class PostgresLedger(SqlLedger):
    """A ledger in one PostgreSQL table, shared by every worker that points at it.

    ``url_or_engine`` is a URL (``postgresql://user@host/db``) or an existing
    SQLAlchemy ``Engine`` / ``AsyncEngine`` with the psycopg driver, whose pool is
    then shared and never disposed by ``close()``. With ``create_schema=True`` the
    schema (``schema=``, created if missing), table and indexes are created on
    first use; ``ddl()`` gives the statements to apply by hand instead.

    ``table``, ``schema``, ``ttl``, ``connect_timeout`` and ``io_timeout`` may also be
    URL options (``?schema=ledger``); an argument wins over the URL. Connections the
    ledger opens wait ``connect_timeout`` seconds to connect; each statement gets
    ``io_timeout`` on the server (``statement_timeout``, half of it as
    ``lock_timeout``), TCP keepalives and ``tcp_user_timeout`` bound a half-open
    connection, and a statement with no answer ``io_timeout`` + 1 s after it started
    has its connection cut, so a stalled server gives a ``LedgerError``. An engine
    passed in keeps its own connection settings; the last bound applies to it too.
    """

    transient_errors: tuple[type[BaseException], ...] = (
        *SqlLedger.transient_errors,
        psycopg.OperationalError,
    )

    def __init__(
        self,
        url_or_engine: str | sa.URL | Engine | AsyncEngine,
        *,
        table: str | None = None,
        schema: str | None = None,
        ttl: float | None = None,
        create_schema: bool = True,
        connect_timeout: float | None = None,
        io_timeout: float | None = None,
        retry: RetryPolicy | None = None,
        signing_key: SigningKey | None = None,
    ) -> None:
        if isinstance(url_or_engine, (str, sa.URL)):
            text = url_or_engine if isinstance(url_or_engine, str) else url_or_engine.render_as_string(False)
            url_or_engine, from_url = split_url_options(text, _LEDGER_OPTIONS, _LIBPQ_OPTIONS, "PostgresLedger")
            table = table if table is not None else from_url.get("table")
            schema = schema if schema is not None else from_url.get("schema")
            ttl = ttl if ttl is not None else from_url.get("ttl")
            connect_timeout = connect_timeout if connect_timeout is not None else from_url.get("connect_timeout")
            io_timeout = io_timeout if io_timeout is not None else from_url.get("io_timeout")
        self.connect_timeout, self.io_timeout = io_timeouts(connect_timeout, io_timeout)
        engine: Engine | None = None
        self._async_engine: AsyncEngine | None = None
        if isinstance(url_or_engine, Engine):
            engine = url_or_engine
            if engine.url.drivername != _DRIVER:
                raise ValueError(
                    f"PostgresLedger needs an engine with the psycopg 3 driver ({_DRIVER}://...), "
                    f"got {engine.url.drivername}"
                )
            url = engine.url
        elif _is_async_engine(url_or_engine):
            self._async_engine = typing.cast("AsyncEngine", url_or_engine)
            url = _psycopg_url(self._async_engine.url)
        elif isinstance(url_or_engine, (str, sa.URL)):
            url = _psycopg_url(url_or_engine)
        else:
            raise TypeError(
                f"PostgresLedger takes a postgresql:// URL or a SQLAlchemy Engine/AsyncEngine, "
                f"not {type(url_or_engine).__name__}"
            )
        super().__init__(
            engine,
            url=url,
            table=table if table is not None else TABLE_NAME,
            schema=schema,
            ttl=ttl,
            create_schema=create_schema,
            retry=retry,
            signing_key=signing_key,
        )
        self._statements = _sql(self._quoted_table())
        self._aio_pg: _AsyncPostgresLedger | None = None

    def __repr__(self) -> str:
        url = self._url.render_as_string(hide_password=True) if isinstance(self._url, sa.URL) else "?"
        return f"PostgresLedger({url!r}, table={self.table.fullname!r})"

    def _quoted_table(self) -> str:
        return _DIALECT.identifier_preparer.format_table(self.table)

    # --- engine, schema and connections --------------------------------------------

    def _create_engine(self) -> Engine:
        # Autocommit: each protocol statement is its own transaction, with no
        # BEGIN/COMMIT round trips around it. No pre-ping either (a round trip per
        # checkout): dead connections are found by _usable() instead.
        engine = sa.create_engine(
            self._url,  # type: ignore[arg-type]
            isolation_level="AUTOCOMMIT",
            connect_args=self._connect_params(),
        )

        @sa.event.listens_for(engine, "checkout")
        def _discard_dead(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
            if not _usable(dbapi_connection):
                raise sa_exc.DisconnectionError("the server closed this pooled connection")  # the pool reconnects

        # The statements SQLAlchemy runs (DDL, records(), delete(), purges) get the
        # same client-side bound as the protocol's own (see _cursor).
        @sa.event.listens_for(engine, "before_cursor_execute")
        def _arm(conn: Any, _cursor: Any, _statement: Any, _params: Any, _context: Any, _many: Any) -> None:
            fileno = conn.connection.driver_connection.fileno()
            conn.info["replaysafe_deadline"] = watchdog.arm(fileno, self._cut_after)[0]

        @sa.event.listens_for(engine, "after_cursor_execute")
        def _disarm(conn: Any, *_: Any) -> None:
            token = conn.info.pop("replaysafe_deadline", None)
            if token is not None:
                watchdog.disarm(token)

        @sa.event.listens_for(engine, "handle_error")
        def _disarm_on_error(context: Any) -> None:
            if context.connection is not None:
                _disarm(context.connection)

        return engine

    @property
    def _cut_after(self) -> float:
        """Seconds after which a statement with no answer has its connection cut."""
        return self.io_timeout + _CUT_GRACE

    def _connect_params(self) -> dict[str, Any]:
        """libpq settings that bound every wait of a connection the ledger opens; the URL's own win."""
        given = set(self._url.query) if isinstance(self._url, sa.URL) else set()
        io_ms = max(1, round(self.io_timeout * 1000))
        params: dict[str, Any] = {
            "connect_timeout": max(2, math.ceil(self.connect_timeout)),  # libpq counts whole seconds, 2 at least
            "keepalives": 1,
            "keepalives_idle": max(1, math.ceil(self.io_timeout / 2)),
            "keepalives_interval": max(1, math.ceil(self.io_timeout / 6)),
            "keepalives_count": 3,
            # Unacknowledged data for this long drops the connection (a half-open one).
            "tcp_user_timeout": io_ms,
        }
        params = {name: value for name, value in params.items() if name not in given}
        # Our own integers only: no value from outside reaches the options string.
        options = f"-c statement_timeout={io_ms} -c lock_timeout={max(1, io_ms // 2)}"
        if "options" in given and isinstance(self._url, sa.URL):
            options = f"{options} {self._url.query['options']}"  # the URL's settings come last, so they win
        params["options"] = options
        return params

    def diagnose(self, exc: BaseException) -> LedgerFault:
        return _diagnose(exc, getattr(self._url, "username", None))

    def _no_answer(self) -> str:
        return (
            f"PostgreSQL gave no answer within {self._cut_after:g}s (io_timeout={self.io_timeout:g}); the "
            "connection was cut"
        )

    def _create_table(self, engine: Engine) -> None:
        with engine.connect() as conn:
            # A real transaction, so the advisory lock is held until the DDL commits:
            # concurrent CREATE ... IF NOT EXISTS can otherwise fail on the catalog.
            conn = conn.execution_options(isolation_level="READ COMMITTED")
            with conn.begin():
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_DDL_LOCK)))
                for statement in self._ddl_elements():
                    conn.execute(statement)

    def _ddl_elements(self) -> list[Any]:
        elements: list[Any] = []
        if self.table.schema is not None:
            elements.append(CreateSchema(self.table.schema, if_not_exists=True))
        elements.append(CreateTable(self.table, if_not_exists=True))
        elements += [CreateIndex(index, if_not_exists=True) for index in self.table.indexes]
        return elements

    def ddl(self, dialect: sa.Dialect | None = None) -> list[str]:
        """The statements that create the schema, table and indexes, for an operator's migrations."""
        dialect = dialect or _DIALECT
        return [str(element.compile(dialect=dialect)).strip() for element in self._ddl_elements()]

    def _checkout(self) -> PoolProxiedConnection:
        """A pooled connection for the protocol's statements.

        An engine of our own discards dead connections at checkout (see
        ``_create_engine``); a shared engine's pool is checked here.
        """
        for _ in range(16):
            fairy = self.engine.raw_connection()
            if self._owns_engine or _usable(fairy.driver_connection):  # type: ignore[arg-type]
                return fairy
            fairy.invalidate()  # dead since a server restart: discard it, take the next
        return self.engine.raw_connection()

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[psycopg.Cursor[Any]]:
        fairy = self._checkout()
        conn: psycopg.Connection[Any] = fairy.driver_connection  # type: ignore[assignment]
        # A shared engine may not be in autocommit: switch it for our statement
        # (a local setting, no round trip) and back before the pool gets it again.
        restore = not conn.autocommit
        try:
            if restore:
                conn.autocommit = True
            with watchdog.guard(conn.fileno(), self._cut_after) as deadline, conn.cursor() as cursor:
                try:
                    yield cursor
                except psycopg.Error as exc:
                    if deadline.expired:
                        raise TimeoutError(self._no_answer()) from exc
                    raise
        except (psycopg.Error, TimeoutError) as exc:
            if conn.closed:
                restore = False
                fairy.invalidate(exc)  # never hand a broken connection out again
            raise
        finally:
            if restore and not conn.closed:
                conn.autocommit = False
            fairy.close()

    def _forget_parent_connections(self) -> None:
        super()._forget_parent_connections()
        if self._aio_pg is not None:
            self._aio_pg._forget_parent_connections()

    def close(self) -> None:
        """Close the connections this ledger opened; a shared engine is left as it is."""
        if self._aio_pg is not None:
            self._aio_pg.close()
        super().close()

    async def aclose(self) -> None:
        """``close()`` for async code."""
        self.close()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # --- the protocol ----------------------------------------------------------------

    @property
    def aio(self) -> AsyncLedger:
        if self._aio_pg is None:
            self._aio_pg = _AsyncPostgresLedger(self)
        return self._aio_pg

    def claim(
        self,
        key: CallKey,
        *,
        tool_name: str,
        args_digest: str,
        owner: str,
        now: dt.datetime,
        lease_expires_at: dt.datetime,
    ) -> ClaimResult:
        params = _claim_params(key, tool_name, args_digest, owner, now, lease_expires_at)
        with self._cursor() as cursor:
            while True:
                row = cursor.execute(self._statements["claim"], params).fetchone()
                if row is not None:
                    return ClaimResult(_record(key, row[1:]), bool(row[0]))

    def takeover(self, record: Record, *, owner: str, now: dt.datetime, lease_expires_at: dt.datetime) -> Record | None:
        with self._cursor() as cursor:
            cursor.execute(self._statements["takeover"], _takeover_params(record, owner, now, lease_expires_at))
            if cursor.rowcount != 1:
                return None
        return record.taken_over_by(owner, now, lease_expires_at)

    def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: dt.datetime) -> bool:
        with self._cursor() as cursor:
            cursor.execute(self._statements["complete"], self._complete_params(key, owner, status, result, now))
            return cursor.rowcount == 1

    def _complete_params(
        self, key: CallKey, owner: str, status: Status, result: str | None, now: dt.datetime
    ) -> dict[str, Any]:
        expiry = expires_at(status, now, self.ttl)
        return _params(key, owner=owner, status=status.value, result=result, now=now, expires_at=expiry)

    def release(self, key: CallKey, *, owner: str) -> bool:
        with self._cursor() as cursor:
            cursor.execute(self._statements["release"], _params(key, owner=owner))
            return cursor.rowcount == 1

    def renew(self, key: CallKey, *, owner: str, lease_expires_at: dt.datetime) -> bool:
        with self._cursor() as cursor:
            cursor.execute(self._statements["renew"], _params(key, owner=owner, lease_expires_at=lease_expires_at))
            return cursor.rowcount == 1

    def get(self, key: CallKey) -> Record | None:
        with self._cursor() as cursor:
            row = cursor.execute(self._statements["get"], _params(key, now=utcnow())).fetchone()
        return _record(key, row) if row is not None else None

    def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        by_digest = {key_digest(*key): key for key in keys}
        if not by_digest:
            return {}
        with self._cursor() as cursor:
            rows = cursor.execute(
                self._statements["get_many"], {"call_keys": list(by_digest), "now": utcnow()}
            ).fetchall()
        return {by_digest[row[0]]: _record(by_digest[row[0]], row[1:]) for row in rows}


class _AsyncPool:
    """psycopg async connections for one event loop: at most ``size`` at once, idle ones kept."""

    def __init__(self, connect: Any, size: int) -> None:
        self._connect = connect
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._slots = asyncio.Semaphore(size)
        self.closed = False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        try:
            await asyncio.wait_for(self._slots.acquire(), _ASYNC_POOL_TIMEOUT)
        except asyncio.TimeoutError:
            raise sa_exc.TimeoutError(
                f"no PostgreSQL connection free after {_ASYNC_POOL_TIMEOUT:g}s ({_ASYNC_POOL_SIZE} in use on "
                "this event loop): fewer concurrent protected calls, or check for a stuck query"
            ) from None
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            while self._idle and conn is None:
                conn = self._idle.pop()
                if not _usable(conn):
                    await conn.close()  # dead since a server restart
                    conn = None
            if conn is None:
                conn = await self._connect()
            yield conn
        finally:
            if conn is not None:
                if self.closed or not _usable(conn):
                    await conn.close()
                else:
                    self._idle.append(conn)
            self._slots.release()

    def close(self) -> None:
        self.closed = True
        while self._idle:
            # A psycopg connection closes without waiting on the loop, so this
            # works even when the loop that opened it has ended.
            conn = self._idle.pop()
            conn.pgconn.finish()


class _AsyncPostgresLedger:
    """``PostgresLedger.aio``: the same statements on psycopg's async connections.

    Built from a URL or ``Engine``, it keeps a small pool of its own per event loop,
    connecting with the engine's URL (``connect_args`` given to ``create_engine``
    are not seen). Built from an ``AsyncEngine``, it borrows that engine's pool.
    """

    def __init__(self, ledger: PostgresLedger) -> None:
        self._ledger = ledger
        self._statements = ledger._statements
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AsyncPool] = weakref.WeakKeyDictionary()
        # Pools a forked child inherited: kept, never used or closed (the parent's sockets).
        self._orphans: list[_AsyncPool] = []

    async def _ready(self) -> None:
        if not self._ledger._schema_ready:
            # The sync engine creates the schema once, in a worker thread.
            await asyncio.to_thread(lambda: self._ledger.engine)

    @contextlib.asynccontextmanager
    async def _cursor(self) -> AsyncIterator[psycopg.AsyncCursor[Any]]:
        await self._ready()
        async with self._connection() as conn:
            with watchdog.guard(conn.fileno(), self._ledger._cut_after) as deadline:
                try:
                    async with conn.cursor() as cursor:
                        yield cursor
                except psycopg.Error as exc:
                    if deadline.expired:
                        raise TimeoutError(self._ledger._no_answer()) from exc
                    raise

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._ledger._async_engine is not None:
            async with self._borrowed() as conn:
                yield conn
            return
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None or pool.closed:
            pool = self._pools[loop] = _AsyncPool(self._connect, _ASYNC_POOL_SIZE)
            # When the loop is gone, so is the pool's use: close its connections then
            # (the finalizer's reference keeps the pool alive until it has).
            weakref.finalize(loop, pool.close)
        async with pool.connection() as conn:
            yield conn

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        engine = self._ledger.engine
        cargs, cparams = engine.dialect.create_connect_args(engine.url)
        ours = self._ledger._connect_params() if self._ledger._owns_engine else {}  # a shared engine's are its own
        params = {**cparams, **ours, "autocommit": True}
        return await psycopg.AsyncConnection.connect(*cargs, **params)

    @contextlib.asynccontextmanager
    async def _borrowed(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection from the application's ``AsyncEngine`` pool, in autocommit while we use it."""
        engine = self._ledger._async_engine
        assert engine is not None
        async with engine.connect() as connection:
            fairy = await connection.get_raw_connection()
            if not _usable(fairy.driver_connection):  # type: ignore[arg-type]
                await connection.invalidate()  # dead since a server restart: the next access reconnects
                fairy = await connection.get_raw_connection()
            conn: psycopg.AsyncConnection[Any] = fairy.driver_connection  # type: ignore[assignment]
            restore = not conn.autocommit
            if restore:
                await conn.set_autocommit(True)
            try:
                yield conn
            except psycopg.Error:
                if conn.closed:
                    restore = False
                    await connection.invalidate()  # never back into the application's pool
                raise
            finally:
                if restore and not conn.closed:
                    await conn.set_autocommit(False)

    def close(self) -> None:
        for pool in list(self._pools.values()):
            pool.close()
        self._pools.clear()

    def _forget_parent_connections(self) -> None:
        self._orphans += self._pools.values()
        self._pools = weakref.WeakKeyDictionary()

    async def claim(
        self,
        key: CallKey,
        *,
        tool_name: str,
        args_digest: str,
        owner: str,
        now: dt.datetime,
        lease_expires_at: dt.datetime,
    ) -> ClaimResult:
        params = _claim_params(key, tool_name, args_digest, owner, now, lease_expires_at)
        async with self._cursor() as cursor:
            while True:
                await cursor.execute(self._statements["claim"], params)
                row = await cursor.fetchone()
                if row is not None:  # else: a concurrent claim committed after our snapshot, look again
                    return ClaimResult(_record(key, row[1:]), bool(row[0]))

    async def takeover(
        self, record: Record, *, owner: str, now: dt.datetime, lease_expires_at: dt.datetime
    ) -> Record | None:
        async with self._cursor() as cursor:
            await cursor.execute(self._statements["takeover"], _takeover_params(record, owner, now, lease_expires_at))
            if cursor.rowcount != 1:
                return None
        return record.taken_over_by(owner, now, lease_expires_at)

    async def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: dt.datetime) -> bool:
        params = self._ledger._complete_params(key, owner, status, result, now)
        async with self._cursor() as cursor:
            await cursor.execute(self._statements["complete"], params)
            return cursor.rowcount == 1

    async def release(self, key: CallKey, *, owner: str) -> bool:
        async with self._cursor() as cursor:
            await cursor.execute(self._statements["release"], _params(key, owner=owner))
            return cursor.rowcount == 1

    async def renew(self, key: CallKey, *, owner: str, lease_expires_at: dt.datetime) -> bool:
        params = _params(key, owner=owner, lease_expires_at=lease_expires_at)
        async with self._cursor() as cursor:
            await cursor.execute(self._statements["renew"], params)
            return cursor.rowcount == 1

    async def get(self, key: CallKey) -> Record | None:
        async with self._cursor() as cursor:
            await cursor.execute(self._statements["get"], _params(key, now=utcnow()))
            row = await cursor.fetchone()
        return _record(key, row) if row is not None else None

    async def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        by_digest = {key_digest(*key): key for key in keys}
        if not by_digest:
            return {}
        async with self._cursor() as cursor:
            await cursor.execute(self._statements["get_many"], {"call_keys": list(by_digest), "now": utcnow()})
            rows = await cursor.fetchall()
        return {by_digest[row[0]]: _record(by_digest[row[0]], row[1:]) for row in rows}
