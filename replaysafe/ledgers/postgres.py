"""``PostgresLedger``: the ledger many workers and hosts share, in one PostgreSQL table.

SQLAlchemy makes the schema and accepts an application's ``Engine``. The
protocol's statements (built once in ``_sql``) run on psycopg connections the
ledger holds: a miss is one claim-or-get statement plus one ``UPDATE``, a hit the
one statement, each in autocommit (no ``BEGIN``/``COMMIT`` round trips, no table
lock) and prepared on the server unless ``prepare=False``. ``.aio`` runs the same
steps on psycopg's async connections, so no call blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import math
import queue
import re
import select
import shlex
import socket
import sys
import typing
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg
import sqlalchemy as sa
from psycopg.pq import ConnStatus, ExecStatus, TransactionStatus
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine
from sqlalchemy.schema import CreateIndex, CreateSchema, CreateTable, DropTable

from .._records import ClaimResult, Record
from ._idle import IdleConnections
from ._options import given_first, io_timeouts, split_url_options
from ._protocol import TRANSIENT_FIX, AsyncLedger, AsyncStoredLedger, LedgerFault, RetryPolicy, SigningKey
from ._sql import CLAIM_ROW, INSERT_COLUMNS, RECORD_COLUMNS, Dialect, Operations, SqlLedger, Step, numbered
from ._watchdog import watchdog

if TYPE_CHECKING:
    import asyncpg
    from sqlalchemy.ext.asyncio import AsyncEngine
else:
    try:
        import asyncpg
    except ImportError:  # pragma: no cover - without the asyncpg extra, .aio runs on psycopg only
        asyncpg = None

_DRIVER = "postgresql+psycopg"
#: A URL with this driver runs ``.aio`` on asyncpg (sync operations stay on psycopg).
_ASYNCPG_DRIVER = "postgresql+asyncpg"
_NO_ASYNCPG = "asyncpg is not installed: pip install 'replaysafe-tools[asyncpg]'"
#: The claim function's name after its table's. (An earlier version's ``<table>_claim``, which read
#: the record too, is left as it is: its workers may still run beside this one's.)
_CLAIM_SUFFIX = "_try_claim"
#: The longest table name whose claim function, ``<table>_try_claim``, fits PostgreSQL's 63-byte names.
_MAX_TABLE_NAME = 63 - len(_CLAIM_SUFFIX)
_DIALECT: sa.Dialect = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
#: Connections a ledger (and each event loop) holds at most by default; more callers wait for one.
_POOL_SIZE = 10
_TUPLES_OK = ExecStatus.TUPLES_OK
_OK = ConnStatus.OK
_IDLE = TransactionStatus.IDLE
#: Seconds a caller waits for a free connection when all are in use (then a transient error).
_POOL_TIMEOUT = 30.0
#: Serialises schema creation across every worker that starts at once.
_DDL_LOCK = int.from_bytes(hashlib.sha256(b"replaysafe.ledgers.postgres ddl").digest()[:8], "big", signed=True)


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
    already readable, so a zero-timeout poll finds it without a round trip. The
    state is read off the libpq handle: ``conn.info`` builds an object and an enum.
    """
    pgconn = conn.pgconn
    if pgconn.status != _OK or pgconn.transaction_status != _IDLE:
        return False
    try:
        return not _has_input(pgconn.socket)
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
            "use a postgresql:// or postgresql+psycopg:// URL (pip install 'replaysafe-tools[postgres]'), or "
            "postgresql+asyncpg:// for .aio on asyncpg"
        )
    return parsed


def _flag(text: str) -> bool:
    """A yes/no URL option."""
    value = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
    try:
        return value[text.lower()]
    except KeyError:
        raise ValueError(text) from None


# The ledger's own URL options; libpq's (sslmode, application_name, ...) stay in the URL.
# ``connect_timeout`` is both: the ledger reads it and hands it to libpq.
_LEDGER_OPTIONS: dict[str, Any] = {
    "table": str,
    "schema": str,
    "ttl": float,
    "connect_timeout": float,
    "io_timeout": float,
    "prepare": _flag,
}
_LIBPQ_OPTIONS = frozenset(option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults())
#: libpq's options for the TCP connection itself, which asyncpg has no setting for.
_LIBPQ_TCP_OPTIONS = frozenset(
    {"connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout"}
)


def _setting_options(options: str) -> dict[str, str]:
    """libpq's ``options`` (``-c name=value``, ``-cname=value`` or ``--name=value``) as session settings."""
    settings: dict[str, str] = {}
    words = shlex.split(options)
    while words:
        word = words.pop(0)
        if word == "-c" and words:
            word = words.pop(0)
        elif word.startswith(("-c", "--")):
            word = word[2:]
        else:
            raise ValueError(
                f"PostgresLedger: asyncpg takes libpq's options as -c name=value settings only, not {word!r}"
            )
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise ValueError(f"PostgresLedger: a setting in libpq's options must read name=value, not {word!r}")
        settings[name.replace("-", "_")] = value
    return settings


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
    "function": ("EXECUTE", "FUNCTION", "to claim calls"),
}
_DENIED = re.compile(r"permission denied for (database|schema|table|function) (.+)")
_MISSING_TABLE_FIX = (
    "The ledger's table or schema does not exist: pass create_schema=True, or apply ledger.ddl() (a migration)."
)
_MISSING_FUNCTION_FIX = (
    "The ledger's claim function (<table>_try_claim, beside the table) does not exist, as in a table made by an "
    "earlier version: pass create_schema=True, or apply the CREATE FUNCTION of ledger.ddl() (a migration)."
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


def _server_error(cause: BaseException) -> tuple[str, str] | None:
    """A driver's error as its SQLSTATE ("" when it has none) and primary message; ``None`` for any other error."""
    if isinstance(cause, psycopg.Error):
        return cause.sqlstate or "", getattr(cause.diag, "message_primary", None) or ""
    if asyncpg is not None and isinstance(cause, asyncpg.PostgresError):
        return getattr(cause, "sqlstate", None) or "", getattr(cause, "message", None) or ""
    return None


def _diagnose(exc: BaseException, role: str | None = None) -> LedgerFault:
    """One place that tells a passing PostgreSQL fault from a misconfiguration, by SQLSTATE (either driver's)."""
    cause = getattr(exc, "orig", None) or exc
    if isinstance(
        cause, (TimeoutError, asyncio.TimeoutError, sa_exc.TimeoutError, sa_exc.DisconnectionError, ConnectionError)
    ):
        return LedgerFault(True, TRANSIENT_FIX)
    error = _server_error(cause)
    if error is None:
        if isinstance(cause, socket.gaierror) or (
            asyncpg is not None and isinstance(cause, asyncpg.InterfaceError) and not isinstance(cause, ValueError)
        ):
            return LedgerFault(True, TRANSIENT_FIX)  # a host name that did not resolve; asyncpg: a connection closed
        return LedgerFault(False, _URL_FIX if isinstance(cause, (sa_exc.ArgumentError, ValueError)) else _SQL_FIX)
    state, primary = error
    if state.startswith("28"):
        return LedgerFault(False, _AUTH_FIX)
    if state == "3D000":
        return LedgerFault(False, _DATABASE_FIX)
    if state == "42501":
        return LedgerFault(False, _privilege_fix(primary, role))
    if state in ("42P01", "3F000"):
        return LedgerFault(False, _MISSING_TABLE_FIX)
    if state == "42883":  # undefined_function
        return LedgerFault(False, _MISSING_FUNCTION_FIX)
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

    The ledger holds up to ``pool_size`` connections of its own (per event loop for
    ``.aio``); with an ``Engine`` passed in it takes that engine's connections from its
    pool instead. ``prepare=True`` (the default) prepares each statement on a
    connection once: leave it on unless a pooler in transaction mode without
    prepared-statement support sits in between (PgBouncer before 1.21, or with
    ``max_prepared_statements=0``), then pass ``prepare=False``.

    ``.aio`` runs on asyncpg instead of psycopg (``pip install 'replaysafe-tools[asyncpg]'``)
    with a ``postgresql+asyncpg://`` URL, on connections of its own, or with
    ``asyncpg_pool=``, an application's ``asyncpg.Pool`` it borrows connections from (and
    never closes); sync operations and the schema stay on psycopg, connecting with the URL,
    which must then name the same database. The same statements run on either driver.
    """

    transient_errors: tuple[type[BaseException], ...] = (
        *SqlLedger.transient_errors,
        psycopg.OperationalError,
    )

    #: Whether statements are prepared on the server (see above).
    prepare: bool
    #: The most connections the ledger holds (per event loop for ``.aio``).
    pool_size: int
    #: Seconds to wait for a connection, and for any one answer.
    connect_timeout: float
    io_timeout: float
    _ops: PostgresOperations

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
        prepare: bool | None = None,
        pool_size: int = _POOL_SIZE,
        retry: RetryPolicy | None = None,
        signing_key: SigningKey | None = None,
        asyncpg_pool: asyncpg.Pool | None = None,
    ) -> None:
        on_asyncpg = asyncpg_pool is not None
        if isinstance(url_or_engine, (str, sa.URL)):
            given = sa.make_url(url_or_engine)
            if given.drivername == _ASYNCPG_DRIVER:
                on_asyncpg = True
                url_or_engine = given.set(drivername=_DRIVER)
            text = url_or_engine if isinstance(url_or_engine, str) else url_or_engine.render_as_string(False)
            url_or_engine, from_url = split_url_options(text, _LEDGER_OPTIONS, _LIBPQ_OPTIONS, "PostgresLedger")
            table, schema, ttl, connect_timeout, io_timeout, prepare = given_first(
                from_url,
                table=table,
                schema=schema,
                ttl=ttl,
                connect_timeout=connect_timeout,
                io_timeout=io_timeout,
                prepare=prepare,
            )
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be a positive number of connections, got {pool_size!r}")
        self.prepare = True if prepare is None else bool(prepare)
        self.pool_size = pool_size
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
        if on_asyncpg:
            if asyncpg is None:
                raise ValueError(_NO_ASYNCPG)
            if self._async_engine is not None:
                raise ValueError("PostgresLedger: .aio runs on the AsyncEngine's pool or on asyncpg, not both")
            if asyncpg_pool is not None and not isinstance(asyncpg_pool, asyncpg.Pool):
                raise TypeError(f"asyncpg_pool must be an asyncpg.Pool, not {type(asyncpg_pool).__name__}")
        #: Whether ``.aio`` runs on asyncpg, and the application's pool it borrows from, if any.
        self._on_asyncpg = on_asyncpg
        self._asyncpg_pool = asyncpg_pool
        if isinstance(table, str) and len(table) > _MAX_TABLE_NAME:
            # PostgreSQL cuts names at 63 bytes: two long table names would share one claim function.
            raise ValueError(
                f"table {table!r} is longer than {_MAX_TABLE_NAME} characters: PostgreSQL cuts names at 63 bytes and "
                f"the ledger's claim function ({table[:20]}...{_CLAIM_SUFFIX}) must keep its own; choose a shorter name"
            )
        super().__init__(engine, url, table, schema, ttl, create_schema, retry, signing_key)
        self._ops = PostgresOperations(self._quoted_table(), self.ttl, self._quoted_claim_function())
        self._pool = _Pool(self._connect, pool_size)
        self._aio_pg: _AsyncPostgresLedger | None = None
        if on_asyncpg and asyncpg_pool is None:
            self._asyncpg_connect_args()  # the URL's options as asyncpg takes them: refused now, not at a call

    def __repr__(self) -> str:
        url = self._url.render_as_string(hide_password=True) if isinstance(self._url, sa.URL) else "?"
        return f"PostgresLedger({url!r}, table={self.table.fullname!r})"

    def _quoted_table(self) -> str:
        return _DIALECT.identifier_preparer.format_table(self.table)

    def _quoted_claim_function(self) -> str:
        """The claim's function: ``<table>_try_claim``, in the table's schema."""
        preparer = _DIALECT.identifier_preparer
        name = preparer.quote(f"{self.table.name}{_CLAIM_SUFFIX}")
        return name if self.table.schema is None else f"{preparer.quote_schema(self.table.schema)}.{name}"

    # --- engine, schema and connections --------------------------------------------

    def _create_engine(self) -> Engine:
        # Only the DDL runs on it, once: no pool to keep (the statements run on self._pool).
        engine = sa.create_engine(
            self._url,  # type: ignore[arg-type]
            poolclass=sa.pool.NullPool,
            connect_args=self._connect_params(),
        )

        # The DDL gets the same client-side bound as the protocol's statements (see run).
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
        options = " ".join(f"-c {name}={value}" for name, value in self._server_settings().items())
        if "options" in given and isinstance(self._url, sa.URL):
            options = f"{options} {self._url.query['options']}"  # the URL's settings come last, so they win
        params["options"] = options
        return params

    def _server_settings(self) -> dict[str, str]:
        """The session settings every connection the ledger opens starts with (either driver's)."""
        io_ms = max(1, round(self.io_timeout * 1000))
        # TimeZone=UTC: psycopg then reads each timestamptz straight into a UTC datetime (in the
        # server's zone it converts each one, about 4,000 instructions a column); the stored
        # instants are the same.
        return {"statement_timeout": str(io_ms), "lock_timeout": str(max(1, io_ms // 2)), "TimeZone": "UTC"}

    def _asyncpg_connect_args(self) -> dict[str, Any]:
        """How ``.aio`` opens an asyncpg connection: the URL, its libpq options as asyncpg takes them.

        asyncpg reads the connection's own options (``sslmode``, ...) from the URL and takes any
        other option as a session setting; libpq's ``options`` (``-c name=value``) become session
        settings too, after the ledger's own, so they win. libpq's TCP options have no asyncpg
        counterpart: each statement's client-side bound (``io_timeout`` + 1 s) bounds a half-open
        connection instead.
        """
        assert isinstance(self._url, sa.URL)
        query = {name: value for name, value in self._url.query.items() if name not in _LIBPQ_TCP_OPTIONS}
        settings = self._server_settings()
        options = query.pop("options", None)
        if options is not None:
            settings.update(_setting_options(options if isinstance(options, str) else " ".join(options)))
        dsn = self._url.set(drivername="postgresql", query=query).render_as_string(hide_password=False)
        return {
            "dsn": dsn,
            "timeout": self.connect_timeout,
            "server_settings": settings,
            # No cache: unnamed statements, which a pooler in transaction mode passes on.
            "statement_cache_size": 100 if self.prepare else 0,
        }

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
                # Made only when missing, like the table: replacing it would need its owner's role.
                exists = sa.select(sa.func.to_regproc(self._ops.claim_function))
                if conn.execute(exists).scalar() is None:
                    conn.execute(self._claim_function_element())

    def _ddl_elements(self) -> list[Any]:
        elements: list[Any] = []
        if self.table.schema is not None:
            elements.append(CreateSchema(self.table.schema, if_not_exists=True))
        elements.append(CreateTable(self.table, if_not_exists=True))
        elements += [CreateIndex(index, if_not_exists=True) for index in self.table.indexes]
        return elements

    def _claim_function_element(self) -> sa.ExecutableDDLElement:
        return sa.DDL(self._ops.claim_function_ddl())  # type: ignore[no-untyped-call]

    def drop(self) -> None:
        """Drop the ledger's table and claim function, with every record in them (its schema stays): for a ledger
        made for one run, as each case of ``replaysafe crashtest --ledger postgresql://...`` is."""
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="READ COMMITTED")
            with conn.begin():
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_DDL_LOCK)))
                conn.execute(DropTable(self.table, if_exists=True))
                # The function's name is the one the ledger made it under: quoted by SQLAlchemy's preparer.
                conn.execute(sa.DDL(f"DROP FUNCTION IF EXISTS {self._ops.claim_function}"))  # type: ignore[no-untyped-call]

    def ddl(self, dialect: sa.Dialect | None = None) -> list[str]:
        """The statements that create the schema, table, indexes and claim function, for an operator's migrations."""
        dialect = dialect or _DIALECT
        elements = [*self._ddl_elements(), self._claim_function_element()]
        return [str(element.compile(dialect=dialect)).strip() for element in elements]

    # --- connections and the runners ---------------------------------------------------

    def _connect_args(self) -> tuple[list[Any], dict[str, Any]]:
        """How to open a connection like the engine's (the ledger's own bounds, unless the engine is shared)."""
        url = self._engine.url if self._engine is not None else self._url
        cargs, cparams = _DIALECT.create_connect_args(url)  # type: ignore[arg-type]
        ours = self._connect_params() if self._owns_engine else {}  # a shared engine's are its own
        params = {**cparams, **ours, "autocommit": True}
        if not self.prepare:
            params["prepare_threshold"] = None  # psycopg prepares a statement used 5 times otherwise
        return list(cargs), params

    def _connect(self) -> Held:
        """A connection for ``_pool``: a new one of the ledger's own, or the shared engine's, checked out."""
        if not self._schema_ready:
            _ = self.engine  # the schema first, once
        if self._owns_engine:
            cargs, params = self._connect_args()
            conn = psycopg.Connection.connect(*cargs, **params)
            return conn, psycopg.RawCursor(conn), None
        # A shared engine's pool: dead connections (a server restart) are discarded here.
        for _ in range(16):
            fairy = self.engine.raw_connection()
            if _usable(fairy.driver_connection):  # type: ignore[arg-type]
                break
            fairy.invalidate()
        shared: psycopg.Connection[Any] = fairy.driver_connection  # type: ignore[assignment]
        # It may not be in autocommit: switch it for our statements (a local setting, no
        # round trip) and back before its pool gets it again (see _Pool.put).
        if not shared.autocommit:
            shared.autocommit = True
            return shared, psycopg.RawCursor(shared), (fairy, True)
        return shared, psycopg.RawCursor(shared), (fairy, False)

    def _run(self, step: Step | Any) -> Any:
        if type(step) is not Step:
            return step
        # Given back to the pool it came from: close() may replace self._pool meanwhile,
        # and the closed pool then closes it (the new one would keep it open for good).
        pool = self._pool
        held = pool.get()
        conn, cursor = held[0], held[1]
        token, deadline = watchdog.arm(conn.fileno(), self._cut_after)
        try:
            while True:
                cursor.execute(step.statement, step.params, prepare=self.prepare and step.prepare)
                # Read off the result's status: cursor.description builds a column list each time.
                result = cursor.pgresult
                rows = cursor.fetchall() if result is not None and result.status == _TUPLES_OK else None
                step = step.read(rows, cursor.rowcount)
                if type(step) is not Step:
                    return step
        except psycopg.Error as exc:
            if deadline.expired:
                raise TimeoutError(self._no_answer()) from exc
            raise
        finally:
            watchdog.disarm(token)
            pool.put(held)

    def _forget_parent(self) -> None:
        super()._forget_parent()
        self._orphans.append(self._pool)
        self._pool = _Pool(self._connect, self.pool_size)
        if self._aio_pg is not None:
            self._aio_pg._forget_parent_connections()

    def close(self) -> None:
        """Close the connections this ledger opened; a shared engine is left as it is."""
        self._pool.close_all()
        self._pool = _Pool(self._connect, self.pool_size)  # it reopens lazily if used again
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

    @property
    def aio(self) -> AsyncLedger:
        if self._aio_pg is None:
            self._aio_pg = (_AsyncpgLedger if self._on_asyncpg else _AsyncPostgresLedger)(self)
        return self._aio_pg


#: The claim function's parameters: the key's digest, its three ids, the tool, the arguments' digest,
#: the owner, the claim's time and its lease's end (``CLAIM_ROW`` writes the time twice).
_CLAIM_ARGUMENTS = ("text",) * 7 + ("timestamptz",) * 2
_CLAIM_ROW_ARGUMENTS = (1, 2, 3, 4, 5, 6, 7, 8, 8, 9)


class PostgresOperations(Operations):
    """The shared operations, and a claim that reads or writes in one statement (one round trip)."""

    def __init__(self, table: str, ttl: dt.timedelta | None, claim_function: str) -> None:
        """``claim_function`` is the quoted, validated name of the claim's write (see ``claim_function_ddl``)."""
        super().__init__(table, _SQL_DIALECT, ttl)
        self.claim_function = claim_function
        arguments = ", ".join(["?"] * len(_CLAIM_ARGUMENTS))
        columns = ", ".join(f"t.{column}" for column in RECORD_COLUMNS.split(", "))
        # One row, always: the live record of the key, joined to nothing, so a replay reads
        # it by its key and writes, locks and calls nothing. Only when there is none does
        # the CASE call the function, whose INSERT claims the key or replaces a record whose
        # ttl ran out, and says whether it did. (A function: an INSERT in the statement
        # itself is set up on every run, a replay's too; a scalar one: a set-returning
        # function's scan is set up on every run too, and materialises its row on a miss.)
        # When another worker's INSERT commits after this statement's snapshot, the row
        # has no record and no claim: the claim runs again and then sees it.
        self._claim = self.sql(
            f"SELECT CASE WHEN t.call_key IS NULL THEN {claim_function}({arguments}) ELSE false END, {columns} "
            f"FROM (SELECT) AS one LEFT JOIN {table} AS t "
            "ON t.call_key = ? AND (t.expires_at IS NULL OR t.expires_at > ?)"
        )

    def claim_function_ddl(self) -> str:
        """The claim's write, a PL/pgSQL function: plain SQL would plan its INSERT on every call."""
        row = numbered(CLAIM_ROW, _CLAIM_ROW_ARGUMENTS)
        upsert = numbered(self.upsert_tail, (8,))
        return (
            f"CREATE OR REPLACE FUNCTION {self.claim_function}({', '.join(_CLAIM_ARGUMENTS)}) "
            "RETURNS boolean LANGUAGE plpgsql AS $claim$\n"
            "BEGIN\n"
            f"    INSERT INTO {self.table} AS t ({INSERT_COLUMNS}) VALUES ({row})\n"
            f"        {upsert};\n"
            "    RETURN FOUND;\n"
            "END\n"
            "$claim$"
        )

    def claim(self, record: Record) -> Step:
        params = self.claim_params(record)

        def read(rows: Any, count: int) -> ClaimResult | Step:
            row = rows[0]
            if row[0]:
                return ClaimResult(record, True)
            if row[1] is None:  # no record (tool_name is never NULL in one), and no claim
                return step  # a concurrent claim committed after our snapshot: look again
            return ClaimResult(self.record(record.key, row[1:]), False)

        step = Step(self._claim, (*params[:8], params[9], params[0], params[7]), read)
        return step


def _same(value: Any) -> Any:
    return value


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    # The ledger's own connections run in UTC, so psycopg already gives its UTC: nothing to convert.
    if value is None or value.tzinfo is dt.timezone.utc:
        return value
    return value.astimezone(dt.timezone.utc)


_SQL_DIALECT = Dialect(
    placeholder="$", encode_time=_same, decode_time=_utc, key_in_list="call_key = ANY(?)", encode_keys=_same
)

#: A connection a pool gave out: the connection, its cursor, and what a shared engine's pool needs back
#: with it (``None`` for the ledger's own). The cursor stays with its connection: a new cursor per
#: statement looks every parameter's dumper and every column's loader up again (about 20 us).
Held = tuple[Any, Any, Any]


def _idle(conn: Any) -> bool:
    """Open and outside a transaction: fit to be used again (read off the libpq handle, no round trip)."""
    pgconn = conn.pgconn
    return bool(pgconn.status == _OK and pgconn.transaction_status == _IDLE)


class _Idle(IdleConnections[Held]):
    """Idle connections (``IdleConnections``), and whether one coming back is fit to keep.

    What the sync and the async pools share: taking and returning never waits, so a
    call on the hot path pays a list pop, an append and one zero-timeout poll. The
    checks are psycopg's; ``_AsyncpgPool`` has asyncpg's.
    """

    __slots__ = ()

    @staticmethod
    def usable(conn: Any) -> bool:
        """Fit to hand out: idle, and the server has not hung up on it."""
        return _usable(conn)

    @staticmethod
    def idle(conn: Any) -> bool:
        """Fit to keep once given back: open and outside a transaction."""
        return _idle(conn)

    @staticmethod
    def finish(conn: Any) -> None:
        """Close at once, without waiting on a loop (an async connection too)."""
        conn.pgconn.finish()

    def take(self) -> Held | None:
        while (held := self.pop()) is not None:
            if self.usable(held[0]):
                return held
            self.finish(held[0])  # dead since a server restart (or cut): drop it, take the next
        return None

    def give_back(self, held: Held) -> None:
        """Keep a returned connection, or let it go: broken ones, and any once the pool is closed."""
        conn, _, shared = held
        if shared is not None:  # a shared engine's: back to its own pool, as it was given
            fairy, restore = shared
            if not self.idle(conn):
                fairy.invalidate()  # never hand a broken connection out again
                return
            if restore:
                conn.autocommit = False
            fairy.close()
        elif not self.idle(conn):
            self.finish(conn)
        else:
            for closed in self.keep(held):
                self.finish(closed[0])

    def close_all(self) -> None:
        for held in self.close():
            conn = held[0]  # held by a name: a temporary would be freed (and warn) before finish()
            self.finish(conn)


def _no_free_connection(size: int) -> TimeoutError:
    return TimeoutError(
        f"no PostgreSQL connection free after {_POOL_TIMEOUT:g}s ({size} in use): fewer concurrent protected "
        "calls, a larger pool_size, or check for a stuck query"
    )


class _Pool(_Idle):
    """The sync connections a ledger holds: at most ``size`` out at once."""

    def __init__(self, connect: Callable[[], Held], size: int) -> None:
        super().__init__()
        self._connect = connect
        self._size = size
        # One token per connection that may be out; a C queue: taking and giving one
        # back costs far less than a threading.Semaphore, and a wait is still bounded.
        self._slots: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(size):
            self._slots.put(None)

    def get(self) -> Held:
        try:
            self._slots.get(timeout=_POOL_TIMEOUT)
        except queue.Empty:
            raise _no_free_connection(self._size) from None
        try:
            return self.take() or self._connect()
        except BaseException:
            self._slots.put(None)
            raise

    def put(self, held: Held) -> None:
        try:
            self.give_back(held)
        finally:
            self._slots.put(None)


class _AsyncPool(_Idle):
    """The async connections of one event loop: at most ``size`` out at once."""

    def __init__(self, connect: Callable[[], Awaitable[Held]], size: int) -> None:
        super().__init__()
        self._connect = connect
        self._size = size
        self._slots = asyncio.Semaphore(size)

    async def get(self) -> Held:
        if self._slots.locked():
            # All out: wait, bounded. Only here a timer Task is made, not on every checkout.
            try:
                await asyncio.wait_for(self._slots.acquire(), _POOL_TIMEOUT)
            except asyncio.TimeoutError:
                raise _no_free_connection(self._size) from None
        else:
            await self._slots.acquire()  # free: returns at once
        try:
            return self.take() or await self._connect()
        except BaseException:
            self._slots.release()
            raise

    def put(self, held: Held) -> None:
        try:
            self.give_back(held)
        finally:
            self._slots.release()


class _AsyncpgPool(_AsyncPool):
    """``_AsyncPool`` for asyncpg's connections: the same pool, asyncpg's checks.

    An asyncpg connection closes through its event loop, not on its own as a libpq handle
    does, so the pool closes its connections on their loop: when the loop shuts down
    (``asyncio.run`` and asyncio's runners finish a loop's async generators before closing
    it, and the pool keeps one suspended for that), or when the ledger closes, from the
    loop's own thread or handed to it.
    """

    def __init__(self, connect: Callable[[], Awaitable[Held]], size: int) -> None:
        super().__init__(connect, size)
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._shutdown: typing.AsyncGenerator[None, None] | None = None

    @staticmethod
    def usable(conn: Any) -> bool:
        # The loop reads every idle connection, so a server's goodbye has mostly closed it already;
        # one that came while the loop was blocked is still unread on the socket, as for psycopg.
        # (asyncpg does not publish its transport: without it, only the first check is made.)
        if conn.is_closed() or conn.is_in_transaction():
            return False
        transport = getattr(conn, "_transport", None)
        sock = transport.get_extra_info("socket") if transport is not None else None
        try:
            return sock is None or not _has_input(sock.fileno())
        except (OSError, ValueError):
            return False

    @staticmethod
    def idle(conn: Any) -> bool:
        return not conn.is_closed() and not conn.is_in_transaction()

    @staticmethod
    def finish(conn: Any) -> None:
        with contextlib.suppress(RuntimeError):  # its loop is closed: the socket closes when collected
            conn.terminate()

    async def get(self) -> Held:
        if self._shutdown is None and not self.closed:
            self._loop = weakref.ref(asyncio.get_running_loop())
            shutdown = _closed_at_shutdown(self)
            await shutdown.__anext__()  # registered with the loop, and suspended until it shuts down
            self._shutdown = shutdown
        return await super().get()

    def close_all(self) -> None:
        loop = self._loop() if self._loop is not None else None
        if loop is not None and loop.is_running() and not _runs_here(loop):
            loop.call_soon_threadsafe(self.close_all)
            return
        shutdown, self._shutdown = self._shutdown, None
        if shutdown is None:
            self.close_connections()
            return
        # Finished here and now (its finally closes the connections), so that it is never handed
        # to its loop, maybe closed by then, to finish.
        with contextlib.suppress(StopIteration):
            shutdown.aclose().send(None)

    def close_connections(self) -> None:
        super().close_all()


async def _closed_at_shutdown(pool: _AsyncpgPool) -> typing.AsyncGenerator[None, None]:
    """Suspended for the life of the pool's loop; closed, it closes the pool's connections."""
    try:
        yield
    finally:
        pool._shutdown = None
        pool.close_connections()


def _runs_here(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` is the one running in this thread."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class _AsyncPostgresLedger(AsyncStoredLedger):
    """``PostgresLedger.aio``: the same steps on psycopg's async connections.

    Built from a URL or ``Engine``, it holds a small pool of its own per event loop,
    connecting with the engine's URL (``connect_args`` given to ``create_engine``
    are not seen). Built from an ``AsyncEngine``, it borrows that engine's pool.
    ``_AsyncpgLedger`` runs the same on asyncpg.
    """

    def __init__(self, ledger: PostgresLedger) -> None:
        self._ledger = ledger
        self._ops = ledger._ops
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AsyncPool] = weakref.WeakKeyDictionary()

    async def _run(self, step: Step | Any) -> Any:
        """``PostgresLedger._run`` for async code."""
        if type(step) is not Step:
            return step
        ledger = self._ledger
        if not ledger._schema_ready:
            await asyncio.to_thread(lambda: ledger.engine)  # the sync engine makes the schema once
        borrowed = self._borrowed()
        if borrowed is not None:
            async with borrowed as runner:
                return await self._steps(runner, step)
        pool = self._pool()
        held = await pool.get()
        try:
            return await self._steps(held[1], step)
        finally:
            pool.put(held)

    async def _steps(self, cursor: psycopg.AsyncCursor[Any], step: Step) -> Any:
        prepare = self._ledger.prepare
        token, deadline = watchdog.arm(cursor.connection.fileno(), self._ledger._cut_after)
        try:
            while True:
                await cursor.execute(step.statement, step.params, prepare=prepare and step.prepare)
                result = cursor.pgresult
                rows = await cursor.fetchall() if result is not None and result.status == _TUPLES_OK else None
                step = step.read(rows, cursor.rowcount)
                if type(step) is not Step:
                    return step
        except psycopg.Error as exc:
            if deadline.expired:
                raise TimeoutError(self._ledger._no_answer()) from exc
            raise
        finally:
            watchdog.disarm(token)

    def _pool(self) -> _AsyncPool:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None or pool.closed:
            pool = self._pools[loop] = self._new_pool()
            # When the loop is gone, so is the pool's use: close its connections then
            # (the finalizer's reference keeps the pool alive until it has).
            weakref.finalize(loop, pool.close_all)
        return pool

    def _new_pool(self) -> _AsyncPool:
        return _AsyncPool(self._connect, self._ledger.pool_size)

    async def _connect(self) -> Held:
        cargs, params = self._ledger._connect_args()
        conn = await psycopg.AsyncConnection.connect(*cargs, **params)
        return conn, psycopg.AsyncRawCursor(conn), None

    def _borrowed(self) -> AbstractAsyncContextManager[Any] | None:
        """A cursor on a connection of the application's pool, when the ledger was given one."""
        return None if self._ledger._async_engine is None else self._from_engine()

    @contextlib.asynccontextmanager
    async def _from_engine(self) -> AsyncIterator[psycopg.AsyncCursor[Any]]:
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
                yield psycopg.AsyncRawCursor(conn)
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
            pool.close_all()
        self._pools.clear()

    def _forget_parent_connections(self) -> None:
        self._ledger._orphans += self._pools.values()
        self._pools = weakref.WeakKeyDictionary()


class _AsyncpgLedger(_AsyncPostgresLedger):
    """``PostgresLedger.aio`` on asyncpg: the same steps, the same pool of its own per event loop
    (or the application's ``asyncpg.Pool``), run by asyncpg's prepared-statement cache.

    asyncpg has no socket to cut: each statement's ``timeout`` is the same client-side bound,
    and a connection whose statement did not end with the server's answer (a timeout, a
    cancelled caller) is terminated, never used again.
    """

    async def _steps(self, conn: Any, step: Step) -> Any:
        cut_after = self._ledger._cut_after
        try:
            while True:
                # A query's rows, or a command's count from its status ("UPDATE 1").
                if step.statement.startswith("SELECT"):
                    rows = await conn.fetch(step.statement, *step.params, timeout=cut_after)
                    step = step.read(rows, len(rows))
                else:
                    status = await conn.execute(step.statement, *step.params, timeout=cut_after)
                    step = step.read(None, int(status.rpartition(" ")[2]))
                if type(step) is not Step:
                    return step
        except asyncpg.PostgresError:
            raise  # the server answered: the connection is as it was
        except asyncio.TimeoutError as exc:  # TimeoutError itself from Python 3.11
            conn.terminate()
            raise TimeoutError(self._ledger._no_answer()) from exc
        except BaseException:
            conn.terminate()
            raise

    def _new_pool(self) -> _AsyncPool:
        return _AsyncpgPool(self._connect, self._ledger.pool_size)

    async def _connect(self) -> Held:
        conn = await asyncpg.connect(**self._ledger._asyncpg_connect_args())
        return conn, conn, None

    def _borrowed(self) -> AbstractAsyncContextManager[Any] | None:
        pool = self._ledger._asyncpg_pool
        return None if pool is None else pool.acquire()
