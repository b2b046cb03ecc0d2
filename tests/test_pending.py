"""Finishing writes kept for later (``_pending``): what happens around them besides the write itself."""

from __future__ import annotations

import time
import uuid

import psycopg

from replaysafe import CallKey, PostgresLedger, Status, replay_safe, tool_call
from replaysafe.ledgers import RetryPolicy

from .servers import libpq_url, with_query


def _connections_named(server_url: str, name: str) -> int:
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_write_made_after_its_ledger_was_closed_closes_it_again(postgres_server_url: str, postgres_url: str) -> None:
    """The record lands once the ledger answers, and the connection the write opened does not stay open."""
    name = f"rs-reclose-{uuid.uuid4().hex[:8]}"
    url = with_query(postgres_url, application_name=name)
    ledger = PostgresLedger(url, io_timeout=1, retry=RetryPolicy(attempts=1))
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
    table = f'"{ledger.table.schema}"."{ledger.table.name}"'
    ledger.get(key)  # the table exists before the tool locks it
    blocker = psycopg.connect(libpq_url(postgres_server_url))

    @replay_safe(ledger=ledger)
    def refund() -> str:
        blocker.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")  # our own identifiers: the record cannot be written
        return "refunded"

    try:
        with tool_call(*key):
            assert refund() == "refunded"  # its record kept for later
        ledger.close()  # the application is done with the ledger
        blocker.rollback()  # the ledger answers again: the kept write goes through
        with PostgresLedger(postgres_url) as reader:
            deadline = time.monotonic() + 20
            while (record := reader.get(key)) is None or record.status is not Status.COMPLETED:
                assert time.monotonic() < deadline, "the kept write was not made"
                time.sleep(0.05)
        assert record.result == '"refunded"'
        deadline = time.monotonic() + 5
        while _connections_named(postgres_server_url, name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _connections_named(postgres_server_url, name) == 0, (
            "the write reopened the closed ledger and left it open"
        )
    finally:
        blocker.close()
        ledger.close()
