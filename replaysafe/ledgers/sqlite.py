"""``SqliteLedger``: the embedded ledger, one file that survives a process restart."""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import weakref
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .._records import ClaimResult, Record
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
        if text.startswith("sqlite:"):
            text, from_url = split_url_options(text, _LEDGER_OPTIONS, (), "SqliteLedger")
            table, ttl, busy_timeout = given_first(from_url, table=table, ttl=ttl, busy_timeout=busy_timeout)
            url = sa.make_url(text)
            database = url.database or ""
        else:
            database = text
            url = sa.URL.create("sqlite", database=database)
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            raise ValueError(
                f"SqliteLedger needs a file, got {text!r}: an in-memory SQLite database is private to one "
                "connection. Use MemoryLedger() for a ledger in memory."
            )
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        self.path = Path(database)
        self._synchronous = synchronous
        self._busy_timeout_ms = int((busy_timeout if busy_timeout is not None else 30.0) * 1000)
        super().__init__(None, url, table, None, ttl, create_schema, retry, signing_key)
        self._ops = SqliteOperations(f'"{self.table.name}"', self.ttl)

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
        engine = sa.create_engine(
            self._url,  # type: ignore[arg-type]
            isolation_level="AUTOCOMMIT",  # every statement is its own atomic transaction
            hide_parameters=True,  # parameters hold results: never in error messages or logs
            connect_args={"check_same_thread": False},
        )
        pragmas = (
            "PRAGMA journal_mode=WAL",
            f"PRAGMA synchronous={self._synchronous}",
            f"PRAGMA busy_timeout={self._busy_timeout_ms}",
        )

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # autocommit, for the raw statements below too
            cursor = dbapi_connection.cursor()
            for pragma in pragmas:
                cursor.execute(pragma)
            cursor.close()

        # A ledger dropped without close() closes its pooled connections all the same: sqlite3
        # leaves an open one to the garbage collector, which Python 3.13 warns of.
        weakref.finalize(self, engine.dispose)
        return engine

    # --- running steps: on the pooled sqlite3 connection itself ------------------------
    # SQLAlchemy Core would cost far more per statement than SQLite takes to run it.

    def _run(self, step: Step | Any) -> Any:
        if type(step) is not Step:
            return step
        pool = self.engine.pool
        connection = pool.connect()
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
            connection.close()  # back to the pool
            # close() drops the engine before disposing of its pool: if it has begun, this
            # connection may have come back after the pool closed its idle ones; close it.
            engine = self._engine
            if engine is None or engine.pool is not pool:
                pool.dispose()


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
        params = self.claim_params(record)
        now = params[7]

        def live(rows: Any, count: int) -> ClaimResult | Step:
            return ClaimResult(self.keyed_record(rows[0]), False) if rows else insert

        def inserted(rows: Any, count: int) -> ClaimResult | Step:
            # Not inserted: another claim came in since the first read.
            return ClaimResult(record, True) if count == 1 else look

        def found(rows: Any, count: int) -> ClaimResult | Step:
            # No row: released between our insert and our read, so claim again.
            return ClaimResult(self.keyed_record(rows[0]), False) if rows else insert

        insert = Step(self._claim, (*params, now), inserted)  # now again: the ttl test
        look = Step(self._read, (params[0],), found)
        return Step(self._read_live, (params[0], now), live)


def _stamp(moment: dt.datetime | None) -> str | None:
    """A UTC time as SQLAlchemy stores a SQLite DATETIME, so both read each other's rows
    (and the fixed width keeps text comparisons in time order)."""
    if moment is None:
        return None
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _time(text: str | None) -> dt.datetime | None:
    return None if text is None else dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc)


_DIALECT = Dialect(
    placeholder="?",
    encode_time=_stamp,
    decode_time=_time,
    key_in_list="call_key IN (SELECT value FROM json_each(?))",
    encode_keys=json.dumps,
)
