"""The SQLite ledger's own connections: where they point, when they close, and that they let the ledger go."""

from __future__ import annotations

import datetime as dt
import gc
import os
import sqlite3
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite as sqlite_dialect

from replaysafe import CallKey, SqliteLedger, open_ledger
from replaysafe.ledgers import sqlite as sqlite_ledger


def _operations_connection(ledger: SqliteLedger) -> sqlite3.Connection:
    """The connection the ledger's next operation runs on."""
    connection = ledger._connections.take()
    ledger._connections.give_back(connection)
    return connection


def _closed(connection: sqlite3.Connection) -> bool:
    try:
        connection.execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False


@pytest.mark.parametrize("closed_first", [False, True])
def test_a_ledger_dropped_is_collected_and_its_connections_closed(tmp_path: Path, closed_first: bool) -> None:
    """Nothing the ledger leaves behind (its engine's listener, the finalizer of its connections) holds it:
    dropped, with or without ``close()``, it is collected and no connection of its own stays open."""
    ledger = SqliteLedger(tmp_path / "ledger.db")
    assert ledger.get(CallKey("t", "m", "c")) is None  # the table made, a connection opened
    connection = _operations_connection(ledger)
    if closed_first:
        ledger.close()
        assert _closed(connection)
    alive = weakref.ref(ledger)
    del ledger
    gc.collect()
    assert alive() is None, "the ledger was kept alive by what it left behind"
    assert _closed(connection)


def test_a_relative_path_is_one_file_whatever_the_working_directory_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path names the file in the working directory of the ledger's making: its table (made
    at first use, by the engine) and its operations (on connections of their own) use that one file."""
    made_in, later = tmp_path / "made-in", tmp_path / "later"
    made_in.mkdir()
    later.mkdir()
    monkeypatch.chdir(made_in)
    ledger = SqliteLedger("ledger.db")
    monkeypatch.chdir(later)
    try:
        assert list(ledger.records()) == []
        assert ledger.path == made_in / "ledger.db"
        assert os.listdir(later) == []
    finally:
        ledger.close()


@pytest.mark.parametrize("driver", ["pysqlcipher", "aiosqlite"])
def test_a_url_of_another_sqlite_driver_is_refused(tmp_path: Path, driver: str) -> None:
    """Operations run on sqlite3 connections of the ledger's own: another driver's URL is refused at
    construction, naming the URL to use, instead of failing on a file sqlite3 cannot read."""
    with pytest.raises(ValueError, match="sqlite3 driver .* not '" + driver + "': use a sqlite:// URL"):
        SqliteLedger(f"sqlite+{driver}:///{tmp_path}/ledger.db")
    assert SqliteLedger(f"sqlite+pysqlite:///{tmp_path}/ledger.db").path == tmp_path / "ledger.db"


_UTC = dt.timezone.utc
# Any instant, in any fixed offset (a year away from datetime's ends, where converting to UTC overflows).
_instants = st.builds(
    lambda moment, minutes: moment.replace(tzinfo=dt.timezone(dt.timedelta(minutes=minutes))),
    st.datetimes(min_value=dt.datetime(2, 1, 1), max_value=dt.datetime(9998, 12, 31)),
    st.integers(min_value=-23 * 60, max_value=23 * 60),
)
_SQLALCHEMY_DATETIME = sa.DateTime().dialect_impl(sqlite_dialect())


@given(_instants)
def test_a_stored_time_is_the_text_sqlalchemy_writes_and_reads_back_as_the_same_instant(moment: dt.datetime) -> None:
    # The ledger writes times without SQLAlchemy, which reads them (a user's own queries of the table):
    # the text must be SQLAlchemy's own for the same UTC time, and read back by both as that instant.
    naive_utc = moment.astimezone(_UTC).replace(tzinfo=None)
    written_by_sqlalchemy = _SQLALCHEMY_DATETIME.bind_processor(sqlite_dialect())(naive_utc)
    assert sqlite_ledger._stamp(moment) == written_by_sqlalchemy
    assert sqlite_ledger._time(written_by_sqlalchemy) == moment
    assert sqlite_ledger._time(written_by_sqlalchemy).tzinfo is _UTC  # type: ignore[union-attr]
    assert _SQLALCHEMY_DATETIME.result_processor(sqlite_dialect(), None)(written_by_sqlalchemy) == naive_utc


def test_a_stored_time_in_another_form_is_read_as_before() -> None:
    # Never written by the ledger nor by SQLAlchemy; read as it always was (its digits taken as UTC).
    assert sqlite_ledger._time("2026-12-05 08:00:00.000001+02:00") == dt.datetime(2026, 12, 5, 8, 0, 0, 1, tzinfo=_UTC)
    # A date alone (with "+00:00" appended it would read as a naive time of day): UTC midnight, as always.
    assert sqlite_ledger._time("2026-12-05") == dt.datetime(2026, 12, 5, tzinfo=_UTC)
    assert sqlite_ledger._time(None) is None
    assert sqlite_ledger._stamp(None) is None


def test_a_url_with_two_slashes_is_refused_with_the_url_it_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sqlite://ledger.db` names a host and no file: the library and the CLI both say which URL was meant, not that
    the database is in memory or that no file is at `sqlite:/ledger.db`; nothing is created."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"did you mean sqlite:///ledger\.db\?") as raised:
        open_ledger("sqlite://ledger.db")
    assert "in-memory" not in str(raised.value)
    done = subprocess.run(
        [sys.executable, "-m", "replaysafe", "ledger", "--ledger", "sqlite://ledger.db", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "did you mean sqlite:///ledger.db?" in done.stderr
    assert "sqlite:/ledger.db" not in done.stderr
    assert list(tmp_path.iterdir()) == []
