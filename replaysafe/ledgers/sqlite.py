"""``SqliteLedger``: the embedded ledger, one file that survives a process restart."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Engine

from .._constants import TABLE_NAME
from ._protocol import RetryPolicy, SigningKey
from ._sql import SqlLedger


class SqliteLedger(SqlLedger):
    """A ledger in a SQLite file, in WAL mode.

    Several processes may share the file: each claim is one atomic statement. With
    ``synchronous="FULL"`` (the default) a record is on disk before the protected
    call returns, so it survives a ``kill -9`` and a power loss; ``"NORMAL"`` is
    faster and survives a ``kill -9`` but may lose the last records on power loss.
    """

    def __init__(
        self,
        path_or_url: str | os.PathLike[str],
        *,
        table: str = TABLE_NAME,
        ttl: float | None = None,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout: float = 30.0,
        create_schema: bool = True,
        retry: RetryPolicy | None = None,
        signing_key: SigningKey | None = None,
    ) -> None:
        text = os.fspath(path_or_url)
        if text.startswith("sqlite:"):
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
        self._busy_timeout_ms = int(busy_timeout * 1000)
        super().__init__(
            None,
            url=url,
            table=table,
            schema=None,
            ttl=ttl,
            create_schema=create_schema,
            retry=retry,
            signing_key=signing_key,
        )

    def __repr__(self) -> str:
        return f"SqliteLedger({str(self.path)!r})"

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
            cursor = dbapi_connection.cursor()
            for pragma in pragmas:
                cursor.execute(pragma)
            cursor.close()

        return engine

    def _insert(self) -> Any:
        return sqlite.insert(self.table)
