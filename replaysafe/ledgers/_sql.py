"""The ``tool_executions`` table and every statement SQLite and PostgreSQL share, as data.

SQLite and PostgreSQL use one schema. The call key is a SHA-256 digest of the
three ids (a btree entry cannot hold three ids of up to 64 KB each); the raw ids
stay in plain columns for inspection.

Each ledger operation is built here once as a ``Step``: a statement, its
parameters, and how its reply reads. A backend only runs steps (one small sync
runner and, with async I/O, one small async runner) and supplies its claim, the
one statement the two dialects cannot share.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.schema import CreateIndex, CreateTable

from .._constants import TABLE_NAME
from .._identity import key_digest
from .._records import CallKey, Record, Status, expires_at, new_tuple
from ._protocol import RetryPolicy, SigningKey, StoredLedger, forget_in_forked_child, handed_now

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


#: The columns a ``Record`` is read from when its key is known, in ``Operations.record``'s order.
RECORD_COLUMNS = (
    "tool_name, args_digest, status, result, owner, attempt, created_at, updated_at, lease_expires_at, expires_at"
)
#: The same with the key's ids first, for reads that find keys (records(), get_many()).
KEYED_COLUMNS = f"thread_id, message_id, tool_call_id, {RECORD_COLUMNS}"
#: Every column a claim writes, in the order of ``Operations.claim_values``.
INSERT_COLUMNS = f"call_key, {KEYED_COLUMNS}"

#: The row a first claim writes, in ``INSERT_COLUMNS`` order (its parameters: ``Operations.claim_params``):
#: running, attempt 1, no result, no ttl yet. The casts type the NULLs where an INSERT takes a SELECT.
CLAIM_ROW = "?, ?, ?, ?, ?, ?, 'running', CAST(NULL AS TEXT), ?, 1, ?, ?, ?, CAST(NULL AS TIMESTAMPTZ)"

#: Each status by its stored text: a dict lookup, where ``Status(text)`` runs the enum's Python-level call.
_STATUSES = {status.value: status for status in Status}

#: What a step's reply reads as: the rows (``None`` for a statement that returns none) and the rowcount.
Reader = Callable[[Sequence[Sequence[Any]] | None, int], Any]


def numbered(text: str, numbers: Iterable[int]) -> str:
    """``text`` with its ``?`` placeholders, in order, as the positional parameters ``$n`` of ``numbers``."""
    parts = text.split("?")
    marks = [f"${n}" for n in numbers]
    if len(marks) != len(parts) - 1:
        raise ValueError("as many numbers as placeholders")
    return "".join(part + mark for part, mark in zip(parts, marks, strict=False)) + parts[-1]


class Step(NamedTuple):
    """One statement of an operation: its text, its parameters, and how its reply reads.

    ``read(rows, rowcount)`` returns the operation's value, or the next ``Step`` to run
    (a claim that must look again, a batch that must go on).
    """

    statement: str
    params: Sequence[Any]
    read: Reader
    #: Worth preparing on the server: the hot path's statements; not the housekeeping ones.
    prepare: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the SQL drivers in statements every dialect shares."""

    #: The driver's positional placeholder: ``?`` (sqlite3), or ``$`` for PostgreSQL's numbered ones
    #: (``$1``, ``$2``, ... in order), which psycopg's raw cursors and asyncpg both take.
    placeholder: str
    #: A UTC time as the driver binds it, and back.
    encode_time: Callable[[dt.datetime | None], Any]
    decode_time: Callable[[Any], dt.datetime | None]
    #: ``call_key`` is one of a list given as one parameter, and how that list is bound.
    key_in_list: str
    encode_keys: Callable[[list[str]], Any]


def changed_one(rows: Sequence[Sequence[Any]] | None, rowcount: int) -> bool:
    return rowcount == 1


def rowcount(rows: Sequence[Sequence[Any]] | None, count: int) -> int:
    return count


class Operations:
    """Every ledger operation on one table, built once as steps; a dialect module adds ``claim``."""

    def __init__(self, table: str, dialect: Dialect, ttl: dt.timedelta | None) -> None:
        """``table`` is the quoted, validated table name; values always go in as parameters."""
        self.dialect = dialect
        self.ttl = ttl
        self.table = table
        self._time = dialect.encode_time
        self._decode_time = dialect.decode_time
        #: A record is live (not past its ttl) at the time given as its parameter.
        self.live = live = "(expires_at IS NULL OR expires_at > ?)"
        sql = self.sql
        self._takeover = sql(
            f"UPDATE {table} SET status = ?, result = ?, args_digest = ?, owner = ?, attempt = attempt + 1, "
            "updated_at = ?, lease_expires_at = ?, expires_at = NULL "
            "WHERE call_key = ? AND owner = ? AND attempt = ? AND status = ?"
        )
        # Fenced: only the claim's owner finishes it. Its own finished record matches
        # too, so a write tried again after a lost answer succeeds.
        self._complete = sql(
            f"UPDATE {table} SET status = ?, result = ?, updated_at = ?, expires_at = ? "
            "WHERE call_key = ? AND owner = ? AND status IN ('running', ?)"
        )
        self._release = sql(f"DELETE FROM {table} WHERE call_key = ? AND owner = ? AND status = 'running'")
        # Fenced like complete: a lost or finished claim is left as it is.
        self._renew = sql(
            f"UPDATE {table} SET lease_expires_at = ? WHERE call_key = ? AND owner = ? AND status = 'running'"
        )
        self._get = sql(f"SELECT {RECORD_COLUMNS} FROM {table} WHERE call_key = ? AND {live}")
        self._get_many = sql(f"SELECT {KEYED_COLUMNS} FROM {table} WHERE {dialect.key_in_list} AND {live}")
        self._delete = sql(f"DELETE FROM {table} WHERE call_key = ?")
        self._purge_thread = sql(f"DELETE FROM {table} WHERE thread_id = ?")
        order = "ORDER BY created_at, call_key"
        self._records = sql(f"SELECT {KEYED_COLUMNS} FROM {table} WHERE {live} {order}")
        self._thread_records = sql(f"SELECT {KEYED_COLUMNS} FROM {table} WHERE {live} AND thread_id = ? {order}")
        self._count_expired = sql(f"SELECT count(*) FROM {table} WHERE expires_at <= ?")
        # ``expires_at`` again on the DELETE itself: a claim may have replaced the row
        # since the subquery read it, and the new record must stay.
        self._purge_expired = sql(
            f"DELETE FROM {table} WHERE expires_at <= ? AND call_key IN "
            f"(SELECT call_key FROM {table} WHERE expires_at <= ? LIMIT ?)"
        )
        # The claim's write, shared by both dialects' claims: it inserts the record, or
        # replaces one whose ttl ran out (a record past its ttl counts as absent).
        updates = ", ".join(f"{column} = excluded.{column}" for column in INSERT_COLUMNS.split(", ")[1:])
        self.upsert_tail = f"ON CONFLICT (call_key) DO UPDATE SET {updates} WHERE t.expires_at <= ?"

    def sql(self, text: str) -> str:
        """``text`` written with ``?`` placeholders, in the driver's own."""
        if self.dialect.placeholder == "$":
            return numbered(text, range(1, text.count("?") + 1))
        return text.replace("?", self.dialect.placeholder)

    # --- rows -----------------------------------------------------------------------

    def record(self, key: CallKey, row: Sequence[Any]) -> Record:
        """A record from a row of ``RECORD_COLUMNS``."""
        time = self._decode_time
        fields = (
            key,
            row[0],
            row[1],
            _STATUSES.get(row[2]) or Status(row[2]),  # Status(): an unknown text raises
            row[3],
            row[4],
            row[5],
            time(row[6]),
            time(row[7]),
            time(row[8]),
            time(row[9]),
        )
        return new_tuple(Record, fields)  # type: ignore[no-any-return]

    def keyed_record(self, row: Sequence[Any]) -> Record:
        """A record from a row of ``KEYED_COLUMNS``."""
        return self.record(new_tuple(CallKey, (row[0], row[1], row[2])), row[3:])

    def claim_params(self, record: Record, digest: str | None = None) -> tuple[Any, ...]:
        """The parameters of ``CLAIM_ROW`` for a first claim's record (``digest``: its key's, if known)."""
        stamp = self._time(record.created_at)
        ids = (digest or key_digest(*record.key), *record.key)
        return (
            *ids,
            record.tool_name,
            record.args_digest,
            record.owner,
            stamp,
            stamp,
            self._time(record.lease_expires_at),
        )

    # --- the operations ---------------------------------------------------------------

    # Each takes the arguments of the ``Ledger`` method of its name (``OperationBuilders``).

    def claim(self, record: Record) -> Step:
        """Store ``record`` (a first claim's, see ``Record.claimed``) unless a live one is there: the
        one statement the dialects cannot share."""
        raise NotImplementedError

    def takeover(
        self,
        record: Record,
        *,
        owner: str,
        now: dt.datetime,
        lease_expires_at: dt.datetime,
        status: Status = Status.RUNNING,
        result: str | None = None,
        args_digest: str | None = None,
    ) -> Step:
        lease = self._time(lease_expires_at)
        digest = key_digest(*record.key)
        taken = record.taken_over_by(owner, now, lease_expires_at, status, result, args_digest)
        new = (taken.status.value, taken.result, taken.args_digest, owner, self._time(now), lease)
        params = (*new, digest, record.owner, record.attempt, record.status.value)

        def read(rows: Any, count: int) -> Record | None:
            return taken if count == 1 else None

        return Step(self._takeover, params, read)

    def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: dt.datetime) -> Step:
        stamps = (self._time(now), self._time(expires_at(status, now, self.ttl)))
        return Step(self._complete, (status.value, result, *stamps, key_digest(*key), owner, status.value), changed_one)

    def release(self, key: CallKey, *, owner: str) -> Step:
        return Step(self._release, (key_digest(*key), owner), changed_one)

    def renew(self, key: CallKey, *, owner: str, lease_expires_at: dt.datetime) -> Step:
        return Step(self._renew, (self._time(lease_expires_at), key_digest(*key), owner), changed_one)

    def get(self, key: CallKey) -> Step:
        def read(rows: Any, count: int) -> Record | None:
            return self.record(key, rows[0]) if rows else None

        return Step(self._get, (key_digest(*key), self._time(handed_now())), read)

    def get_many(self, keys: Iterable[CallKey]) -> Step | dict[CallKey, Record]:
        """A step, or the answer itself when there is nothing to read (runners return a non-step as is)."""
        digests = sorted({key_digest(*key) for key in keys})
        if not digests:
            return {}

        def read(rows: Any, count: int) -> dict[CallKey, Record]:
            return {record.key: record for record in map(self.keyed_record, rows)}

        return Step(self._get_many, (self.dialect.encode_keys(digests), self._time(handed_now())), read, False)

    def delete(self, key: CallKey) -> Step:
        return Step(self._delete, (key_digest(*key),), changed_one, False)

    def purge_thread(self, thread_id: str) -> Step:
        return Step(self._purge_thread, (thread_id,), rowcount, False)

    def records(self, thread_id: str | None) -> Step:
        now = self._time(handed_now())

        def read(rows: Any, count: int) -> Iterator[Record]:
            return iter([self.keyed_record(row) for row in rows])

        if thread_id is None:
            return Step(self._records, (now,), read, False)
        return Step(self._thread_records, (now, thread_id), read, False)

    def purge_expired(self, batch_size: int, dry_run: bool) -> Step:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
        now = self._time(handed_now())
        if dry_run:
            return Step(self._count_expired, (now,), lambda rows, count: int(rows[0][0]), False)  # type: ignore[index]
        total = 0

        def read(rows: Any, count: int) -> int | Step:
            nonlocal total
            total += count
            return batch if count == batch_size else total  # a full batch: there may be more

        batch = Step(self._purge_expired, (now, now, batch_size), read, False)
        return batch


class SqlLedger(StoredLedger):
    """A ledger in one SQL table: SQLAlchemy makes the table, ``ops`` the statements, ``run`` runs them."""

    _ops: Operations
    #: How long a finished record is kept; ``None``: forever.
    ttl: dt.timedelta | None
    #: Whether the ledger creates its table (and schema) when first used.
    create_schema: bool
    #: The ledger's table, as SQLAlchemy describes it (for DDL).
    table: sa.Table

    def __init__(
        self,
        engine: Engine | None,
        url: str | sa.URL | None,
        table: str | None,
        schema: str | None,
        ttl: float | None,
        create_schema: bool,
        retry: RetryPolicy | None,
        signing_key: SigningKey | None,
    ) -> None:
        """The settings both SQL ledgers take, in this order; ``table=None``: the default table."""
        super().__init__(retry=retry, signing_key=signing_key)
        table = TABLE_NAME if table is None else table
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
        # What a forked child inherited: kept, never used or closed (they hold the parent's connections).
        self._orphans: list[Any] = []
        forget_in_forked_child(self)

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

    def _forget_parent(self) -> None:
        self._engine_lock = threading.Lock()  # a fork may copy it held by another thread
        if self._engine is not None and self._owns_engine:
            # The old pool is kept: collected, its connections (the parent's) would be closed here.
            self._orphans.append(self._engine.pool)
            self._engine.dispose(close=False)

    def close(self) -> None:
        engine = self._engine
        if engine is not None and self._owns_engine:
            # Dropped first: an operation in flight then sees the pool is gone (SQLite's _run).
            self._engine = None
            self._schema_ready = False
            engine.dispose()
        super().close()

    # --- the protocol (``StoredLedger``): each operation is ``ops``' step, run by the backend ----

    @property
    def ops(self) -> Operations:
        """The ledger's statements, built as steps."""
        return self._ops

    def run(self, step: Step | Any) -> Any:
        """Run ``step`` (and the steps its replies lead to) on one connection: the backend's runner.

        A value that is not a ``Step`` is the answer already, returned as is.
        """
        return self._run(step)

    def purge_thread(self, thread_id: str) -> int:
        """Delete every record of one thread; returns how many."""
        return int(self._run(self._ops.purge_thread(thread_id)))

    def purge_expired(self, *, batch_size: int = 1000, dry_run: bool = False) -> int:
        """Delete the records whose ttl ran out, ``batch_size`` per statement; returns how many.

        Expired records already count as absent; this only reclaims their space.
        ``dry_run`` only counts them.
        """
        return int(self._run(self._ops.purge_expired(batch_size, dry_run)))

    def records(self, *, thread_id: str | None = None) -> Iterator[Record]:
        """Every record (of one thread), oldest first."""
        result: Iterator[Record] = self._run(self._ops.records(thread_id))
        return result
