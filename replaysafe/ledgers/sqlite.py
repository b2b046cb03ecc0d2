"""``SqliteLedger``: the embedded ledger, one file that survives a process restart."""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import sqlite3
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .._identity import key_digest
from .._records import ClaimResult, Record
from ._idle import IdleConnections
from ._options import given_first, split_url_options
from ._protocol import TRANSIENT_FIX, LedgerFault, RetryPolicy, SigningKey
from ._sql import CLAIM_ROW, INSERT_COLUMNS, KEYED_COLUMNS, Dialect, Operations, SqlLedger, Step

_LEDGER_OPTIONS: dict[str, Any] = {"table": str, "ttl": float, "busy_timeout": float}
# SQLite's primary result codes (the low byte of an extended one) that pass: a writer
# holds the lock, or the disk is full or failing for now.
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_IOERR, _SQLITE_FULL = 5, 6, 10, 13
_MISSING_TABLE_FIX = "The ledger's table does not exist: pass create_schema=True, or apply ledger.ddl()."


class SqliteLedger(SqlLedger):
    """A ledger in a SQLite file, in WAL mode.

    Several processes may share the file: a claim's write is one atomic statement, and a
    replay only reads (it never waits for another writer). With ``synchronous="FULL"``
    (the default) a record is on disk before the protected call returns, so it survives a
    ``kill -9`` and a power loss; ``"NORMAL"`` is faster and survives a ``kill -9`` but
    may lose the last records on power loss.
    """

    transient_errors: tuple[type[BaseException], ...] = (*SqlLedger.transient_errors, sqlite3.OperationalError)
    #: The database file.
    path: Path
    _ops: SqliteOperations

    def __init__(
        self,
        path_or_url: str | os.PathLike[str],
        *,
        table: str | None = None,
        ttl: float | None = None,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout: float | None = None,
        create_schema: bool = True,
        retry: RetryPolicy | None = None,
        signing_key: SigningKey | None = None,
    ) -> None:
        text = os.fspath(path_or_url)
        if text.startswith(("sqlite:", "sqlite+")):  # a URL, with or without its driver
            text, from_url = split_url_options(text, _LEDGER_OPTIONS, (), "SqliteLedger")
            table, ttl, busy_timeout = given_first(from_url, table=table, ttl=ttl, busy_timeout=busy_timeout)
            url = sa.make_url(text)
            if url.get_driver_name() != "pysqlite":
                # Its operations run on sqlite3 connections of its own: another driver's file would not open.
                raise ValueError(
                    f"SqliteLedger runs on Python's sqlite3 driver (sqlite:// or sqlite+pysqlite://), not "
                    f"{url.get_driver_name()!r}: use a sqlite:// URL"
                )
            database = url.database or ""
        else:
            database = text
            url = sa.URL.create("sqlite", database=database)
        suggestion = two_slash_suggestion(text)
        if suggestion is not None:
            raise ValueError(
                f"SqliteLedger got {text!r}, a URL with two slashes, which names a host and no file: did you mean "
                f"{suggestion}? (sqlite:/// then a relative path, sqlite://// then an absolute one)"
            )
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            raise ValueError(
                f"SqliteLedger needs a file, got {text!r}: an in-memory SQLite database is private to one "
                "connection. Use MemoryLedger() for a ledger in memory."
            )
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        if not database.startswith("file:"):
            # Resolved now, once: the engine (the table) and the operations' connections, opened at
            # other times, must not find two files if the working directory changes in between.
            database = os.path.abspath(database)
            url = url.set(database=database)
        self.path = Path(database)
        self._busy_timeout_ms = int((busy_timeout if busy_timeout is not None else 30.0) * 1000)
        #: Autocommit aside, how every connection is set up: WAL, and the ledger's settings.
        self._pragmas = (
            "PRAGMA journal_mode=WAL",
            f"PRAGMA synchronous={synchronous}",
            f"PRAGMA busy_timeout={self._busy_timeout_ms}",
        )
        # The driver's arguments as SQLAlchemy reads them off the URL (a uri=true file, a timeout).
        self._connect_args = url.get_dialect()().create_connect_args(url)
        super().__init__(None, url, table, None, ttl, create_schema, retry, signing_key)
        self._ops = SqliteOperations(f'"{self.table.name}"', self.ttl)
        self._connections = self._new_connections()

    def __repr__(self) -> str:
        return f"SqliteLedger({str(self.path)!r})"

    def diagnose(self, exc: BaseException) -> LedgerFault:
        """A locked or full database passes; a file that cannot be opened or a missing table does not."""
        cause = getattr(exc, "orig", None) or exc
        if not isinstance(cause, sqlite3.Error):
            return super().diagnose(exc)
        code = getattr(cause, "sqlite_errorcode", None)  # Python 3.11+
        text = str(cause).lower()
        if code is not None:
            transient = code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_IOERR, _SQLITE_FULL)
        else:  # pragma: no cover - Python 3.10
            transient = "locked" in text or "busy" in text or "disk" in text
        if transient:
            return LedgerFault(True, "Another writer holds the SQLite file, or its disk is full: " + TRANSIENT_FIX)
        if not self.path.parent.is_dir():
            return LedgerFault(False, f"The directory of the SQLite ledger does not exist: create {self.path.parent}.")
        if "no such table" in text:
            return LedgerFault(False, _MISSING_TABLE_FIX)
        if "readonly" in text or "unable to open" in text:
            return LedgerFault(
                False, f"The SQLite ledger {self.path} cannot be opened for writing: check the file's permissions."
            )
        return LedgerFault(False, "SQLite refused a ledger statement: check that the file is a replaysafe ledger.")

    def _create_engine(self) -> Engine:
        """The engine of the DDL (and of a user's own SQLAlchemy reads); ledger operations run on
        ``_connections``."""
        engine = sa.create_engine(
            self._url,  # type: ignore[arg-type]
            isolation_level="AUTOCOMMIT",  # every statement is its own atomic transaction
            hide_parameters=True,  # parameters hold results: never in error messages or logs
            connect_args={"check_same_thread": False},
        )
        pragmas = self._pragmas  # not self: the engine's listener must not keep the ledger alive
        sa.event.listen(engine, "connect", lambda dbapi_connection, _record: _configure(dbapi_connection, pragmas))
        # A ledger dropped without close() closes its pooled connections all the same: sqlite3
        # leaves an open one to the garbage collector, which Python 3.13 warns of.
        weakref.finalize(self, engine.dispose)
        return engine

    def _new_connections(self) -> _Connections:
        # Made of plain values, not of the ledger: its finalizer, below, must not keep it alive.
        connections = _Connections(functools.partial(_open, *self._connect_args, self._pragmas))
        # Dropped without close(), the ledger closes them all the same: sqlite3 leaves an open
        # connection to the garbage collector, which Python 3.13 warns of.
        self._closing = weakref.finalize(self, connections.close_all)
        return connections

    def _forget_parent(self) -> None:
        super()._forget_parent()
        # The parent's connections are the parent's: never closed in the child (a close may
        # checkpoint the file), so neither closed at collection nor collected.
        self._closing.detach()
        self._orphans.append(self._connections)  # kept: collected, they would be closed
        self._connections = self._new_connections()

    def close(self) -> None:
        # Replaced first: an operation in flight gives its connection back to the closed set, which closes it.
        closing = self._closing
        self._connections = self._new_connections()
        closing()  # once, now: not again at collection
        super().close()

    # --- running steps: on a sqlite3 connection of the ledger's own ---------------------
    # SQLAlchemy Core would cost far more per statement than SQLite takes to run it, and so
    # would a checkout from its pool (about 35 us a replay, and a lock that threads convoy on).

    def _run(self, step: Step | Any) -> Any:
        if type(step) is not Step:
            return step
        if not self._schema_ready:
            self.engine  # noqa: B018 - creates the table on first use
        connections = self._connections
        connection = connections.take()
        try:
            cursor = connection.cursor()
            try:
                while True:
                    cursor.execute(step.statement, step.params)
                    step = step.read(cursor.fetchall() if cursor.description is not None else None, cursor.rowcount)
                    if type(step) is not Step:
                        return step
            finally:
                cursor.close()
        finally:
            connections.give_back(connection)


def two_slash_suggestion(url: str) -> str | None:
    """``sqlite:///ledger.db`` for ``sqlite://ledger.db`` (a host, no file: a slash short), else ``None``."""
    scheme, sep, rest = url.partition("://")
    if (
        not sep
        or not scheme.lower().startswith("sqlite")
        or rest.startswith(("/", ":memory:"))
        or not rest.split("?")[0]
    ):
        return None
    return f"{scheme}:///{rest}"


def _configure(connection: sqlite3.Connection, pragmas: tuple[str, ...]) -> None:
    """Autocommit (every statement its own atomic transaction), then ``pragmas``."""
    connection.isolation_level = None
    cursor = connection.cursor()
    for pragma in pragmas:
        cursor.execute(pragma)
    cursor.close()


def _open(args: Sequence[Any], options: Mapping[str, Any], pragmas: tuple[str, ...]) -> sqlite3.Connection:
    """A connection for ledger operations, as SQLAlchemy would open it for the engine."""
    connect: Callable[..., sqlite3.Connection] = sqlite3.connect
    connection = connect(*args, **{**options, "check_same_thread": False})
    try:
        _configure(connection, pragmas)
    except BaseException:
        connection.close()
        raise
    return connection


class _Connections(IdleConnections[sqlite3.Connection]):
    """A ledger's sqlite3 connections: as many are kept idle as were ever in use at once."""

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        super().__init__()
        self._connect = connect

    def take(self) -> sqlite3.Connection:
        return self.pop() or self._connect()

    def give_back(self, connection: sqlite3.Connection) -> None:
        if connection.in_transaction:  # a statement that failed part way left one open: not fit to share
            connection.close()
            return
        for closed in self.keep(connection):
            closed.close()

    def close_all(self) -> None:
        for connection in self.close():
            connection.close()


class SqliteOperations(Operations):
    """The shared operations, and a claim in two statements (SQLite has no data-modifying CTE)."""

    def __init__(self, table: str, ttl: dt.timedelta | None) -> None:
        super().__init__(table, _DIALECT, ttl)
        # A live record is read first: a replay then only reads, and never waits for (or holds)
        # the file's write lock, which an INSERT takes even when its conflict changes nothing.
        # The ids too: a row moved under another call's lookup key then shows as that (a local read).
        self._read_live = f"SELECT {KEYED_COLUMNS} FROM {table} WHERE call_key = ? AND {self.live}"
        self._claim = f"INSERT INTO {table} AS t ({INSERT_COLUMNS}) VALUES ({CLAIM_ROW}) {self.upsert_tail}"
        # No ttl test: after the INSERT, a live record kept the claim out, an expired one was replaced.
        self._read = f"SELECT {KEYED_COLUMNS} FROM {table} WHERE call_key = ?"

    def claim(self, record: Record) -> Step:
        digest = key_digest(*record.key)
        now = self._time(record.created_at)

        def found(rows: Any, count: int) -> ClaimResult | Step:
            # No row: none live at first, or released between our insert and our read: claim.
            return ClaimResult(self.keyed_record(rows[0]), False) if rows else insert()

        def inserted(rows: Any, count: int) -> ClaimResult | Step:
            # Not inserted: another claim came in since the first read.
            return ClaimResult(record, True) if count == 1 else Step(self._read, (digest,), found)

        def insert() -> Step:
            # Its parameters are built only now: a replay, the common case, reads and needs none of them.
            return Step(self._claim, (*self.claim_params(record, digest), now), inserted)  # now again: the ttl test

        return Step(self._read_live, (digest, now), found)


_UTC = dt.timezone.utc
_STAMP_LENGTH = len("2026-12-05 08:00:00.000000")


def _stamp(moment: dt.datetime | None) -> str | None:
    """A UTC time as SQLAlchemy stores a SQLite DATETIME (``YYYY-MM-DD HH:MM:SS.ffffff``), so both
    read each other's rows (and the fixed width keeps text comparisons in time order)."""
    if moment is None:
        return None
    if moment.tzinfo is not _UTC:
        moment = moment.astimezone(_UTC)
    # The first 26 characters of the ISO text, before its "+00:00": about half strftime's time.
    return moment.isoformat(" ", "microseconds")[:26]


def _time(text: str | None) -> dt.datetime | None:
    if text is None:
        return None
    if len(text) == _STAMP_LENGTH:  # the ledger's own form (and SQLAlchemy's): YYYY-MM-DD HH:MM:SS.ffffff
        # Parsed with its offset: about a fifth of the time of parsing it naive, then replace().
        return dt.datetime.fromisoformat(text + "+00:00")
    # Any other form, as always: a date alone, say, which with "+00:00" would read as a naive time.
    return dt.datetime.fromisoformat(text).replace(tzinfo=_UTC)


_DIALECT = Dialect(
    placeholder="?",
    encode_time=_stamp,
    decode_time=_time,
    key_in_list="call_key IN (SELECT value FROM json_each(?))",
    encode_keys=json.dumps,
)
