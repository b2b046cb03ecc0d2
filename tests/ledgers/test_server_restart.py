"""A server restart between two protected calls of one process: the second call just works.

The servers are throwaway ones this test starts on free ports, never the shared
ones. The ledgers get no retries and fail closed, so the second call cannot pass
by a retry hiding a dead connection, nor by running unprotected.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa

from replaysafe import CallKey, PostgresLedger, RedisLedger, replay_safe, tool_call
from replaysafe.ledgers import RetryPolicy

from ..servers import PostgresServer, RedisServer, with_driver

NO_RETRY = RetryPolicy(attempts=1)


def _tool(ledger: Any, runs: list[str]) -> Any:
    @replay_safe(ledger=ledger, on_ledger_error="raise")
    def refund(order_id: str) -> str:
        runs.append(order_id)
        return f"refunded {order_id}"

    return refund


def _atool(ledger: Any, runs: list[str]) -> Any:
    @replay_safe(ledger=ledger, on_ledger_error="raise")
    async def refund(order_id: str) -> str:
        runs.append(order_id)
        return f"refunded {order_id}"

    return refund


@pytest.mark.parametrize("shared_engine", [False, True], ids=["own-engine", "shared-engine"])
def test_postgres_restart_between_two_calls(postgres_server: PostgresServer, shared_engine: bool) -> None:
    """PostgreSQL restarts between two calls: the next call reconnects, and the first is still replayed."""
    runs: list[str] = []
    engine = sa.create_engine(postgres_server.url.replace("postgresql:", "postgresql+psycopg:", 1), pool_size=3)
    with PostgresLedger(engine if shared_engine else postgres_server.url, retry=NO_RETRY) as ledger:
        refund = _tool(ledger, runs)
        barrier = threading.Barrier(3)

        def before(n: int) -> None:
            barrier.wait()  # three calls at once: three pooled connections, all killed by the restart
            with tool_call("t", f"before-{n}", "c"):
                refund(str(n))

        threads = [threading.Thread(target=before, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        postgres_server.stop()
        postgres_server.start()
        for n in range(3):
            with tool_call("t", f"after-{n}", "c"):
                assert refund(f"after-{n}") == f"refunded after-{n}"
        with tool_call("t", "before-0", "c"):
            assert refund("0") == "refunded 0"
        assert sorted(runs) == ["0", "1", "2", "after-0", "after-1", "after-2"]
        assert len(list(ledger.records(thread_id="t"))) == 6
    engine.dispose()


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
async def test_postgres_restart_between_two_async_calls(postgres_server: PostgresServer, driver: str) -> None:
    """The same through .aio, on either async driver: the async pool drops the dead connections."""
    runs: list[str] = []
    async with PostgresLedger(with_driver(postgres_server.url, driver), retry=NO_RETRY) as ledger:
        refund = _atool(ledger, runs)
        async with tool_call("t", "before", "c"):
            await refund("before")
        postgres_server.stop()
        postgres_server.start()
        async with tool_call("t", "after", "c"):
            assert await refund("after") == "refunded after"
        async with tool_call("t", "before", "c"):
            assert await refund("before") == "refunded before"
        assert runs == ["before", "after"]


def test_redis_restart_between_two_calls(redis_server: RedisServer) -> None:
    """Redis restarts (losing its scripts) between two calls: the next call reconnects and reloads them."""
    runs: list[str] = []
    with RedisLedger(redis_server.url, retry=NO_RETRY) as ledger:
        refund = _tool(ledger, runs)
        for n in range(3):
            with tool_call("t", f"before-{n}", "c"):
                refund(str(n))
        redis_server.stop()
        redis_server.start()
        with tool_call("t", "after", "c"):
            assert refund("after") == "refunded after"
        with tool_call("t", "after", "c"):
            assert refund("after") == "refunded after"
        assert runs == ["0", "1", "2", "after"]
        assert ledger.get(CallKey("t", "after", "c")) is not None


async def test_redis_restart_between_two_async_calls(redis_server: RedisServer) -> None:
    """The same through .aio on redis.asyncio."""
    runs: list[str] = []
    async with RedisLedger(redis_server.url, retry=NO_RETRY) as ledger:
        refund = _atool(ledger, runs)
        async with tool_call("t", "before", "c"):
            await refund("before")
        redis_server.stop()
        redis_server.start()
        async with tool_call("t", "after", "c"):
            assert await refund("after") == "refunded after"
        async with tool_call("t", "after", "c"):
            assert await refund("after") == "refunded after"
        assert runs == ["before", "after"]
