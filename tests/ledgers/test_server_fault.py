"""A server stopped for 2 seconds in the middle of a load run, then back: nothing lost, nothing twice.

The servers are throwaway ones on free ports. The tools fail closed
(``on_ledger_error="raise"``): during the outage a call either does not run (its
claim failed) or runs and has its record written when the server returns. Every
call is then tried again until it succeeds.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from replaysafe import CallKey, LedgerError, ReplaySafeError, Status, open_ledger, replay_safe, tool_call
from replaysafe._pending import pending_writes
from replaysafe.ledgers import RetryPolicy

from ..servers import PostgresServer, RedisServer, with_query

KEYS, WORKERS = 400, 4


#: Which server is stopped: a ledger's own, or one of a tiered ledger's two (the other is the shared one).
OUTAGES = ["postgres", "redis", "tiered, postgres down", "tiered, redis down"]


@pytest.fixture(params=OUTAGES)
def outage(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str, str]]:
    """A throwaway server that keeps its data across a restart, as a ledger's store must; the URL of the ledger
    that uses it; and which outage this is. (A tiered ledger's cache may lose its data: it costs speed only.)"""
    kind = request.param
    try:
        started = PostgresServer() if "postgres" in kind else RedisServer(persistent=kind == "redis")
    except FileNotFoundError as exc:
        pytest.fail(f"cannot start a throwaway server for the fault test: {exc}")
    started.start()
    url = started.url
    if kind == "tiered, postgres down":
        url = with_query(started.url, cache=request.getfixturevalue("redis_url"))
    elif kind == "tiered, redis down":
        url = with_query(request.getfixturevalue("postgres_url"), cache=started.url)
    yield started, url, kind
    started.destroy()


def test_a_two_second_outage_loses_and_duplicates_nothing(outage: tuple[Any, str, str]) -> None:
    """Calls fail closed while the server is down; afterwards every key ran once and is recorded once. A tiered
    ledger whose cache is down fails no call at all: PostgreSQL answers."""
    server, url, kind = outage
    ledger = open_ledger(url, retry=RetryPolicy(attempts=2, max_seconds=0.2))
    executions: Counter[int] = Counter()
    lock = threading.Lock()

    @replay_safe(ledger=ledger, on_ledger_error="raise", wait_timeout=60)
    def charge(n: int) -> str:
        with lock:
            executions[n] += 1
        time.sleep(0.01)  # some work, so the load outlasts the outage
        return f"charged {n}"

    thread = f"t-{uuid.uuid4().hex[:8]}"
    results: dict[int, str] = {}
    failures: Counter[str] = Counter()
    halfway = threading.Event()

    def call(n: int) -> bool:
        try:
            with tool_call(thread, f"msg_{n}", "call_1"):
                results[n] = charge(n)
            if len(results) > KEYS // 3:
                halfway.set()
            return True
        except LedgerError as exc:
            failures["fail-closed" if exc.result is None else "ran, record deferred"] += 1
            return False
        except ReplaySafeError as exc:
            failures[type(exc).__name__] += 1
            return False

    def worker(w: int) -> None:
        todo = list(range(w, KEYS, WORKERS))
        while todo:
            todo = [n for n in todo if not call(n)]
            if todo:
                time.sleep(0.05)

    workers = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
    for w in workers:
        w.start()
    assert halfway.wait(120)
    server.stop()
    time.sleep(2)
    server.start()
    for w in workers:
        w.join(300)
    assert not any(w.is_alive() for w in workers)
    if kind == "tiered, redis down":
        assert not failures, "a cache's outage costs speed only"
    else:
        assert failures, "the outage should have made some calls fail"
    assert results == {n: f"charged {n}" for n in range(KEYS)}
    assert set(executions) == set(range(KEYS))
    assert max(executions.values()) == 1, [n for n, c in executions.items() if c > 1]
    records = ledger.get_many([CallKey(thread, f"msg_{n}", "call_1") for n in range(KEYS)])
    assert len(records) == KEYS
    assert {r.status for r in records.values()} == {Status.COMPLETED}
    # Writes deferred during the outage are made in the background once the server is back;
    # wait for them: one made after close() would reopen the ledger's connections.
    deadline = time.monotonic() + 30
    while pending_writes.waiting_for(ledger) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pending_writes.waiting_for(ledger) == 0
    ledger.close()
