"""``SqliteLedger``: the embedded ledger, one file that survives a process restart."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .._clock import utcnow
from .._constants import TABLE_NAME
from .._identity import key_digest
from .._records import CallKey, ClaimResult, Record, Status, expires_at
from ._options import split_url_options
from ._protocol import TRANSIENT_FIX, LedgerFault, RetryPolicy, SigningKey
from ._sql import _COLUMNS, SqlLedger

_LEDGER_OPTIONS: dict[str, Any] = {"table": str, "ttl": float, "busy_timeout": float}
# SQLite's primary result codes (the low byte of an extended one) that pass: a writer
# holds the lock, or the disk is full or failing for now.
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_IOERR, _SQLITE_FULL = 5, 6, 10, 13
_MISSING_TABLE_FIX = "The ledger's table does not exist: pass create_schema=True, or apply ledger.ddl()."


class SqliteLedger(SqlLedger):
    """A ledger in a SQLite file, in WAL mode.

    Several processes may share the file: each claim is one atomic statement. With
    ``synchronous="FULL"`` (the default) a record is on disk before the protected
    call returns, so it survives a ``kill -9`` and a power loss; ``"NORMAL"`` is
    faster and survives a ``kill -9`` but may lose the last records on power loss.
    """

    transient_errors = (*SqlLedger.transient_errors, sqlite3.OperationalError)

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
            table = table if table is not None else from_url.get("table")
            ttl = ttl if ttl is not None else from_url.get("ttl")
            busy_timeout = busy_timeout if busy_timeout is not None else from_url.get("busy_timeout")
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
        super().__init__(
            None,
            url=url,
            table=table if table is not None else TABLE_NAME,
            schema=None,
            ttl=ttl,
            create_schema=create_schema,
            retry=retry,
            signing_key=signing_key,
        )

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

        return engine

    # --- the hot operations, as fixed SQL on the pooled sqlite3 connection --------------
    # Building SQLAlchemy Core statements costs far more than SQLite takes to run them
    # (hundreds of microseconds against a few). The text is fixed: values are bound as
    # parameters, the table name is a validated identifier.

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[Any]:
        connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            try:
                yield cursor
            finally:
                cursor.close()
        finally:
            connection.close()  # back to the pool

    @functools.cached_property
    def _sql(self) -> dict[str, str]:
        table = f'"{self.table.name}"'
        columns = ", ".join(("call_key", *_COLUMNS))
        updates = ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS)
        return {
            # A record whose ttl ran out counts as absent: the claim replaces it atomically.
            "claim": f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * (len(_COLUMNS) + 1))}) "
            f"ON CONFLICT (call_key) DO UPDATE SET {updates} WHERE {table}.expires_at <= ?",
            "read": f"SELECT {', '.join(_COLUMNS)} FROM {table} WHERE call_key = ?",
            "get": f"SELECT {', '.join(_COLUMNS)} FROM {table} WHERE call_key = ? "
            "AND (expires_at IS NULL OR expires_at > ?)",
            "takeover": f"UPDATE {table} SET status = 'running', result = NULL, owner = ?, attempt = attempt + 1, "
            "updated_at = ?, lease_expires_at = ?, expires_at = NULL "
            "WHERE call_key = ? AND owner = ? AND attempt = ? AND status = ?",
            # Fenced: only the claim's owner finishes it; a write tried again after a lost answer matches too.
            "complete": f"UPDATE {table} SET status = ?, result = ?, updated_at = ?, expires_at = ? "
            "WHERE call_key = ? AND owner = ? AND status IN ('running', ?)",
            "release": f"DELETE FROM {table} WHERE call_key = ? AND owner = ? AND status = 'running'",
            # Fenced like complete: a lost or finished claim is left as it is.
            "renew": f"UPDATE {table} SET lease_expires_at = ? WHERE call_key = ? AND owner = ? AND status = 'running'",
        }

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
        record = Record.claimed(key, tool_name, args_digest, owner, now, lease_expires_at)
        digest = key_digest(*key)
        stamp = _stamp(now)
        values = (digest, *key, tool_name, args_digest, "running", None, owner, 1, stamp, stamp)
        params = (*values, _stamp(lease_expires_at), None, stamp)
        with self._cursor() as cursor:
            while True:
                if cursor.execute(self._sql["claim"], params).rowcount == 1:
                    return ClaimResult(record, True)
                row = cursor.execute(self._sql["read"], (digest,)).fetchone()
                if row is not None:
                    return ClaimResult(_record(row), False)
                # Released between our insert and our read: claim again.

    def takeover(self, record: Record, *, owner: str, now: dt.datetime, lease_expires_at: dt.datetime) -> Record | None:
        params = (
            owner,
            _stamp(now),
            _stamp(lease_expires_at),
            key_digest(*record.key),
            record.owner,
            record.attempt,
            record.status.value,
        )
        with self._cursor() as cursor:
            if cursor.execute(self._sql["takeover"], params).rowcount != 1:
                return None
        return record.taken_over_by(owner, now, lease_expires_at)

    def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: dt.datetime) -> bool:
        expiry = expires_at(status, now, self.ttl)
        params = (status.value, result, _stamp(now), _stamp(expiry), key_digest(*key), owner, status.value)
        with self._cursor() as cursor:
            return bool(cursor.execute(self._sql["complete"], params).rowcount == 1)

    def release(self, key: CallKey, *, owner: str) -> bool:
        with self._cursor() as cursor:
            return bool(cursor.execute(self._sql["release"], (key_digest(*key), owner)).rowcount == 1)

    def renew(self, key: CallKey, *, owner: str, lease_expires_at: dt.datetime) -> bool:
        params = (_stamp(lease_expires_at), key_digest(*key), owner)
        with self._cursor() as cursor:
            return bool(cursor.execute(self._sql["renew"], params).rowcount == 1)

    def get(self, key: CallKey) -> Record | None:
        with self._cursor() as cursor:
            row = cursor.execute(self._sql["get"], (key_digest(*key), _stamp(utcnow()))).fetchone()
        return _record(row) if row is not None else None


def _stamp(moment: dt.datetime | None) -> str | None:
    """A UTC time as SQLAlchemy stores a SQLite DATETIME, so both read each other's rows
    (and the fixed width keeps text comparisons in time order)."""
    if moment is None:
        return None
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _time(text: str | None) -> dt.datetime | None:
    return None if text is None else dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc)


def _record(row: Any) -> Record:
    """A record from a row of ``_COLUMNS``."""
    thread_id, message_id, tool_call_id, tool_name, args_digest, status, result, owner, attempt = row[:9]
    created_at, updated_at, lease_expires_at, expires_at = (_time(t) for t in row[9:13])
    return Record(
        CallKey(thread_id, message_id, tool_call_id),
        tool_name,
        args_digest,
        Status(status),
        result,
        owner,
        attempt,
        created_at,  # type: ignore[arg-type]
        updated_at,  # type: ignore[arg-type]
        lease_expires_at,  # type: ignore[arg-type]
        expires_at,
    )
