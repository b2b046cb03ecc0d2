"""The ``tool_executions`` table and the statements every SQL ledger shares.

SQLite and PostgreSQL use one schema. The call key is a SHA-256 digest of the
three ids (a btree entry cannot hold three ids of up to 64 KB each); the raw ids
stay in plain columns for inspection.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.schema import CreateIndex, CreateTable

from .._clock import utcnow
from .._identity import key_digest
from .._records import CallKey, Record, Status
from ._protocol import LedgerBase, RetryPolicy, SigningKey

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def check_identifier(what: str, name: str) -> str:
    """Table and schema names are validated identifiers: nothing else reaches SQL text."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"{what} {name!r} is not a valid SQL identifier: use letters, digits and _ (max 63)")
    return name


class UtcDateTime(sa.TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive, in UTC)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: sa.Dialect) -> dt.datetime | None:
        if value is None:
            return None
        value = value.astimezone(dt.timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect: sa.Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def tool_executions_table(metadata: sa.MetaData, name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("call_key", sa.String(64), primary_key=True),  # sha256(thread, message, tool call)
        sa.Column("thread_id", sa.Text, nullable=False),
        sa.Column("message_id", sa.Text, nullable=False),
        sa.Column("tool_call_id", sa.Text, nullable=False),
        sa.Column("tool_name", sa.Text, nullable=False),
        sa.Column("args_digest", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("result", sa.Text, nullable=True),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("created_at", UtcDateTime, nullable=False),
        sa.Column("updated_at", UtcDateTime, nullable=False),
        sa.Column("lease_expires_at", UtcDateTime, nullable=False),
        sa.Column("expires_at", UtcDateTime, nullable=True),
        sa.Index(f"{name}_thread_id_idx", "thread_id"),
        sa.Index(
            f"{name}_expires_at_idx",
            "expires_at",
            sqlite_where=sa.text("expires_at IS NOT NULL"),
            postgresql_where=sa.text("expires_at IS NOT NULL"),
        ),
    )


_COLUMNS = (
    "thread_id",
    "message_id",
    "tool_call_id",
    "tool_name",
    "args_digest",
    "status",
    "result",
    "owner",
    "attempt",
    "created_at",
    "updated_at",
    "lease_expires_at",
    "expires_at",
)


def row_to_record(row: Any) -> Record:
    return Record(
        key=CallKey(row.thread_id, row.message_id, row.tool_call_id),
        tool_name=row.tool_name,
        args_digest=row.args_digest,
        status=Status(row.status),
        result=row.result,
        owner=row.owner,
        attempt=row.attempt,
        created_at=row.created_at,
        updated_at=row.updated_at,
        lease_expires_at=row.lease_expires_at,
        expires_at=row.expires_at,
    )


# Ledgers whose pooled connections a forked child must not reuse.
_open_ledgers: weakref.WeakSet[SqlLedger] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for ledger in list(_open_ledgers):
        ledger._forget_parent_connections()


class SqlLedger(LedgerBase):
    """A ledger in one SQL table, through SQLAlchemy Core. Subclasses pick the dialect."""

    transient_errors: tuple[type[BaseException], ...] = (
        sa_exc.OperationalError,
        sa_exc.InterfaceError,
        sa_exc.DisconnectionError,
        sa_exc.TimeoutError,
    )

    def __init__(
        self,
        engine: Engine | None,
        *,
        url: str | sa.URL | None = None,
        table: str,
        schema: str | None,
        ttl: float | None,
        create_schema: bool,
        retry: RetryPolicy | None,
        signing_key: SigningKey | None = None,
    ) -> None:
        super().__init__(retry=retry, signing_key=signing_key)
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl must be a positive number of seconds or None, got {ttl!r}")
        self.ttl = dt.timedelta(seconds=ttl) if ttl else None
        self.create_schema = create_schema
        metadata = sa.MetaData(schema=check_identifier("schema", schema) if schema is not None else None)
        self.table = tool_executions_table(metadata, check_identifier("table", table))
        self._url = url
        self._engine = engine
        self._owns_engine = engine is None
        self._schema_ready = False
        self._engine_lock = threading.Lock()
        _open_ledgers.add(self)

    # --- engine lifecycle ------------------------------------------------------

    def _create_engine(self) -> Engine:
        raise NotImplementedError

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine, created (with the table) on first use."""
        engine = self._engine
        if engine is not None and self._schema_ready:
            return engine
        # Threads that start together must not each build an engine (all but one
        # would leak) or each run the DDL.
        with self._engine_lock:
            if self._engine is None:
                self._engine = self._create_engine()
                self._owns_engine = True
            if not self._schema_ready:
                if self.create_schema:
                    self._create_table(self._engine)
                self._schema_ready = True
            return self._engine

    def _create_table(self, engine: Engine) -> None:
        with engine.begin() as conn:
            conn.execute(CreateTable(self.table, if_not_exists=True))
            for index in self.table.indexes:
                conn.execute(CreateIndex(index, if_not_exists=True))

    def ddl(self, dialect: sa.Dialect) -> list[str]:
        """The DDL of the table and its indexes, for an operator's own migrations."""
        statements: list[CreateTable | CreateIndex] = [CreateTable(self.table, if_not_exists=True)]
        statements += [CreateIndex(i, if_not_exists=True) for i in self.table.indexes]
        return [str(s.compile(dialect=dialect)).strip() for s in statements]

    def _forget_parent_connections(self) -> None:
        self._engine_lock = threading.Lock()  # a fork may copy it held by another thread
        if self._engine is not None and self._owns_engine:
            self._engine.dispose(close=False)

    def close(self) -> None:
        if self._engine is not None and self._owns_engine:
            self._engine.dispose()
            self._engine = None
            self._schema_ready = False

    # --- the protocol: the hot operations (claim, takeover, complete, release, get) are
    # each dialect's own fixed SQL; the rest is shared SQLAlchemy Core ----------------

    def _where_key(self, key: CallKey) -> Any:
        return self.table.c.call_key == key_digest(*key)

    def _live(self, now: dt.datetime) -> Any:
        expires_at = self.table.c.expires_at
        return sa.or_(expires_at.is_(None), expires_at > now)

    def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        by_digest = {key_digest(*key): key for key in keys}
        if not by_digest:
            return {}
        statement = sa.select(self.table).where(self.table.c.call_key.in_(list(by_digest)), self._live(utcnow()))
        with self.engine.connect() as conn:
            records = [row_to_record(row) for row in conn.execute(statement)]
        return {record.key: record for record in records}

    def delete(self, key: CallKey) -> bool:
        with self.engine.connect() as conn:
            return bool(conn.execute(sa.delete(self.table).where(self._where_key(key))).rowcount == 1)

    def purge_thread(self, thread_id: str) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.delete(self.table).where(self.table.c.thread_id == thread_id)).rowcount)

    def purge_expired(self, *, batch_size: int = 1000, dry_run: bool = False) -> int:
        """Delete the records whose ttl ran out, ``batch_size`` per statement; returns how many.

        Expired records already count as absent; this only reclaims their space.
        ``dry_run`` only counts them.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
        now = utcnow()
        expired = self.table.c.expires_at <= now
        if dry_run:
            with self.engine.connect() as conn:
                return int(conn.execute(sa.select(sa.func.count()).select_from(self.table).where(expired)).scalar_one())
        batch = sa.select(self.table.c.call_key).where(expired).limit(batch_size).scalar_subquery()
        # ``expired`` again on the DELETE itself: a claim may have replaced the
        # row since the subquery read it, and the new record must stay.
        statement = sa.delete(self.table).where(self.table.c.call_key.in_(batch), expired)
        total = 0
        while True:
            with self.engine.connect() as conn:
                deleted = int(conn.execute(statement).rowcount)
            total += deleted
            if deleted < batch_size:
                return total

    def records(self, *, thread_id: str | None = None) -> Iterator[Record]:
        statement = sa.select(self.table).where(self._live(utcnow()))
        if thread_id is not None:
            statement = statement.where(self.table.c.thread_id == thread_id)
        statement = statement.order_by(self.table.c.created_at, self.table.c.call_key)
        with self.engine.connect() as conn:
            rows = conn.execute(statement).fetchall()
        return iter([row_to_record(row) for row in rows])


os.register_at_fork(after_in_child=_after_fork_in_child)
