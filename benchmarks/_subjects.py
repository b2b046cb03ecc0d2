"""What is measured: our protected tools, the raw floors, and the alternative.

* **ours**: a trivial tool (it returns a small dict) under ``@replay_safe`` with
  default settings, called inside ``tool_call(...)`` as an agent loop would;
* **floor**: the raw client making the round trips a ledger cannot avoid, with
  every key and value computed before the timer starts;
* **Powertools**: AWS Lambda Powertools' ``@idempotent_function`` on the same
  Redis, keyed by a payload holding the same three ids.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import sqlite3
import typing
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
import redis
import redis.asyncio
from psycopg import sql

if TYPE_CHECKING:
    from ._env import Scratch

from replaysafe import Ledger, MemoryLedger, PostgresLedger, RedisLedger, SqliteLedger, replay_safe

#: The argument every benchmarked call passes, and what the tool returns for it.
ORDER_ID = "42"
#: The table the SQL floors write, created with the ledger's own DDL (same columns, same indexes).
FLOOR_TABLE = "floor_executions"
_COLUMNS = (
    "call_key, thread_id, message_id, tool_call_id, tool_name, args_digest, status, result, owner, attempt, "
    "created_at, updated_at, lease_expires_at, expires_at"
)
_READ_COLUMNS = (
    "tool_name, args_digest, status, result, owner, attempt, created_at, updated_at, lease_expires_at, expires_at"
)
#: What a floor stores as a claim and as a result: about the size of a ledger's.
_OWNER = "bench-host:4242:1700000000#1"
_RESULT = json.dumps({"refunded": ORDER_ID})
_DIGEST = hashlib.sha256(b"args").hexdigest()


def refund_body(order_id: str) -> dict[str, str]:
    """The tool's body, also the memory ledger's floor: a bare function call."""
    return {"refunded": order_id}


async def arefund_body(order_id: str) -> dict[str, str]:
    return {"refunded": order_id}


class Tools:
    """A sync and an async protected tool on one ledger, counting how often each body runs."""

    def __init__(self, ledger: Ledger) -> None:
        self.runs = 0

        @replay_safe(ledger=ledger)
        def refund(order_id: str) -> dict[str, str]:
            self.runs += 1
            return {"refunded": order_id}

        @replay_safe(ledger=ledger)
        async def arefund(order_id: str) -> dict[str, str]:
            self.runs += 1
            return {"refunded": order_id}

        self.sync: Callable[[str], dict[str, str]] = refund
        self.aio: Callable[[str], Awaitable[dict[str, str]]] = arefund


def ledgers(scratch: Scratch, name: str) -> dict[str, Callable[[], Ledger] | None]:
    """A factory of every kind of ledger, each on its own place named ``name`` in the run's scratch (a
    SQLite file, a PostgreSQL table, a Redis key prefix); ``None`` for a server that did not answer."""
    postgres, redis_url = scratch.postgres_url, scratch.redis_url
    return {
        "memory": MemoryLedger,
        "sqlite": lambda: SqliteLedger(scratch.directory / f"{name}.db"),
        "postgres": (lambda: PostgresLedger(postgres, schema=scratch.schema, table=name)) if postgres else None,
        "redis": (lambda: RedisLedger(redis_url, prefix=f"{scratch.prefix}:{name}")) if redis_url else None,
    }


def key_digest(thread_id: str, message_id: str, tool_call_id: str) -> str:
    """The SQL ledgers' ``call_key`` (SHA-256 of the ids' canonical JSON); checked against a ledger in setup."""
    text = json.dumps([thread_id, message_id, tool_call_id], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


# --- floors -------------------------------------------------------------------------
#
# A floor's hit returns the decoded result, as a replay does: reading the record
# without decoding it would leave work out of the floor that no ledger can skip.


def _result_of_row(row: Any) -> Any:
    """The result a SQL floor's ``SELECT`` read: the ``result`` column, decoded."""
    return json.loads(row[3])


def _result_of_value(value: Any) -> Any:
    """The result a Redis floor's ``GET`` read: the packed record, then its result, decoded."""
    return json.loads(json.loads(value)["result"])


class Floor(Protocol):
    """The raw client doing the minimum: a claim and a result write for a miss, one read for a hit."""

    def miss(self, name: str) -> None: ...

    def hit(self, name: str) -> None: ...

    async def amiss(self, name: str) -> None: ...

    async def ahit(self, name: str) -> None: ...

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


class BareFloor:
    """The memory ledger's floor as a ``Floor``: a bare call of the tool's body, miss and hit alike."""

    def miss(self, name: str) -> None:
        refund_body(ORDER_ID)

    def hit(self, name: str) -> None:
        refund_body(ORDER_ID)

    async def amiss(self, name: str) -> None:
        await arefund_body(ORDER_ID)

    async def ahit(self, name: str) -> None:
        await arefund_body(ORDER_ID)

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


class SqliteFloor:
    """``INSERT ... ON CONFLICT DO NOTHING`` + ``UPDATE`` for a miss, one ``SELECT`` for a hit, autocommit,
    on the ledger's pragmas (WAL, ``synchronous=FULL``, busy timeout). Async runs each statement in a
    worker thread, as the ledger does."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "PRAGMA busy_timeout=30000"):
            self._conn.execute(pragma)
        self._now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None).isoformat(sep=" ")
        self._insert = (
            f"INSERT INTO {FLOOR_TABLE} ({_COLUMNS}) VALUES (?, 't', ?, 'c', 'refund', ?, 'running', NULL, ?, 1, "
            "?, ?, ?, NULL) ON CONFLICT (call_key) DO NOTHING"
        )
        self._update = f"UPDATE {FLOOR_TABLE} SET status = 'completed', result = ?, updated_at = ? WHERE call_key = ?"
        self._select = f"SELECT {_READ_COLUMNS} FROM {FLOOR_TABLE} WHERE call_key = ?"

    def _claim(self, name: str) -> None:
        self._conn.execute(self._insert, (name, name, _DIGEST, _OWNER, self._now, self._now, self._now))

    def _complete(self, name: str) -> None:
        self._conn.execute(self._update, (_RESULT, self._now, name))

    def miss(self, name: str) -> None:
        self._claim(name)
        self._complete(name)

    def hit(self, name: str) -> None:
        _result_of_row(self._conn.execute(self._select, (name,)).fetchone())

    async def amiss(self, name: str) -> None:
        await asyncio.to_thread(self._claim, name)
        await asyncio.to_thread(self._complete, name)

    async def ahit(self, name: str) -> None:
        await asyncio.to_thread(self.hit, name)

    def close(self) -> None:
        self._conn.close()

    async def aclose(self) -> None:
        self.close()


class PostgresFloor:
    """The same statements on one psycopg connection in autocommit (sync), and one async connection.

    The statements are plain strings, rendered once here: building a ``sql.Composed`` on
    every execute would add client work the ledger does not do.
    """

    def __init__(self, url: str, schema: str, options: str = "") -> None:
        self._url = url
        self._options = options  # libpq's, as ``-c name=value`` (the same the ledger's URL may carry)
        self._conn = psycopg.connect(url, autocommit=True, options=options)
        self._aconn: psycopg.AsyncConnection[Any] | None = None
        table = sql.Identifier(schema, FLOOR_TABLE)

        def plain(statement: str) -> str:
            return sql.SQL(statement).format(table).as_string(self._conn)

        self._insert = plain(
            "INSERT INTO {} (" + _COLUMNS + ") VALUES (%s, 't', %s, 'c', 'refund', %s, 'running', NULL, %s, 1, "
            "%s, %s, %s, NULL) ON CONFLICT (call_key) DO NOTHING"
        )
        self._update = plain("UPDATE {} SET status = 'completed', result = %s, updated_at = %s WHERE call_key = %s")
        self._select = plain("SELECT " + _READ_COLUMNS + " FROM {} WHERE call_key = %s")
        self._now = dt.datetime.now(dt.timezone.utc)

    def miss(self, name: str) -> None:
        now = self._now
        self._conn.execute(self._insert, (name, name, _DIGEST, _OWNER, now, now, now))
        self._conn.execute(self._update, (_RESULT, now, name))

    def hit(self, name: str) -> None:
        _result_of_row(self._conn.execute(self._select, (name,)).fetchone())

    async def _async(self) -> psycopg.AsyncConnection[Any]:
        if self._aconn is None:
            self._aconn = await psycopg.AsyncConnection.connect(self._url, autocommit=True, options=self._options)
        return self._aconn

    async def amiss(self, name: str) -> None:
        conn = await self._async()
        now = self._now
        await conn.execute(self._insert, (name, name, _DIGEST, _OWNER, now, now, now))
        await conn.execute(self._update, (_RESULT, now, name))

    async def ahit(self, name: str) -> None:
        conn = await self._async()
        _result_of_row(await (await conn.execute(self._select, (name,))).fetchone())

    def close(self) -> None:
        self._conn.close()

    async def aclose(self) -> None:
        if self._aconn is not None:
            await self._aconn.close()
            self._aconn = None
        self.close()


class RedisFloor:
    """``SET NX`` (the claim) + ``SET`` (the result) for a miss, one ``GET`` for a hit (its value decoded)."""

    def __init__(self, url: str, client: redis.Redis | None = None) -> None:
        self._url = url
        self._client = client if client is not None else redis.Redis.from_url(url)
        self._aclient: redis.asyncio.Redis | None = None
        self._claim = json.dumps({"status": "running", "owner": _OWNER, "digest": _DIGEST})
        self._done = json.dumps({"status": "completed", "owner": _OWNER, "digest": _DIGEST, "result": _RESULT})

    def miss(self, name: str) -> None:
        self._client.set(name, self._claim, nx=True)
        self._client.set(name, self._done)

    def hit(self, name: str) -> None:
        _result_of_value(self._client.get(name))

    def _async(self) -> redis.asyncio.Redis:
        if self._aclient is None:
            self._aclient = redis.asyncio.Redis.from_url(self._url)
        return self._aclient

    async def amiss(self, name: str) -> None:
        client = self._async()
        await client.set(name, self._claim, nx=True)
        await client.set(name, self._done)

    async def ahit(self, name: str) -> None:
        _result_of_value(await self._async().get(name))

    def close(self) -> None:
        self._client.close()

    async def aclose(self) -> None:
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient = None
        self.close()


class RedisHeldFloor:
    """The Redis floor below redis-py's command layer (context only): one held connection, each
    command packed and sent by hand, its reply read by the connection's parser; no pool checkout,
    no response callbacks. The same commands and decoding as ``RedisFloor``; sync only."""

    def __init__(self, url: str) -> None:
        self._pool = redis.ConnectionPool.from_url(url)
        connection: Any = self._pool.make_connection()  # redis-py leaves its connection methods untyped
        connection.connect()
        self._conn = connection
        self._claim = json.dumps({"status": "running", "owner": _OWNER, "digest": _DIGEST})
        self._done = json.dumps({"status": "completed", "owner": _OWNER, "digest": _DIGEST, "result": _RESULT})

    def _command(self, *args: Any) -> Any:
        self._conn.send_packed_command(self._conn.pack_command(*args), check_health=False)
        return self._conn.read_response()

    def miss(self, name: str) -> None:
        self._command("SET", name, self._claim, "NX")
        self._command("SET", name, self._done)

    def hit(self, name: str) -> None:
        _result_of_value(self._command("GET", name))

    def close(self) -> None:
        self._conn.disconnect()
        self._pool.disconnect()


def create_floor_table(ledger_factory: Callable[[str], Ledger]) -> None:
    """Create the floor's table with the ledger's own DDL, by opening a ledger on it once."""
    ledger = ledger_factory(FLOOR_TABLE)
    try:
        ledger.get(_sample_key())
    finally:
        ledger.close()


def _sample_key() -> Any:
    from replaysafe import CallKey

    return CallKey("t", "setup", "c")


# --- the alternative: AWS Lambda Powertools -----------------------------------------------


class _LambdaContext:
    """What Powertools reads from a Lambda context: the time left, here the same 300 s as our default timeout."""

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


def powertools_available() -> bool:
    try:
        import aws_lambda_powertools.utilities.idempotency  # noqa: F401
    except ImportError:
        return False
    return True


class Powertools:
    """``@idempotent_function`` keyed by a payload holding the call's three ids and its argument.

    ``store`` is ``"redis"`` (its Redis persistence layer, on our Redis), ``"redis+local-cache"``
    (the same with ``use_local_cache=True``: a replay is served from the process's LRU cache) or
    ``"dict"`` (a persistence layer on a plain dict: no I/O, only the library's own CPU cost).
    """

    def __init__(self, store: str, *, client: redis.Redis | None = None, key_prefix: str = "bench") -> None:
        from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function

        self.runs = 0
        self.client = client
        config = IdempotencyConfig(use_local_cache=store.endswith("local-cache"))
        config.register_lambda_context(_LambdaContext())  # type: ignore[arg-type]
        if store == "dict":
            layer: Any = _dict_layer()
        else:
            from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

            assert client is not None, "Powertools on Redis needs a client (decode_responses=True, as its docs show)"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # the Redis layer's old name warns
                layer = CachePersistenceLayer(client=typing.cast(Any, client))

        def refund(call: dict[str, str]) -> dict[str, str]:
            self.runs += 1
            return {"refunded": call["order_id"]}

        self.call: Callable[..., Any] = idempotent_function(
            refund, data_keyword_argument="call", persistence_store=layer, config=config, key_prefix=key_prefix
        )

    def __call__(self, thread_id: str, message_id: str, tool_call_id: str) -> Any:
        """One call as a user would write it: the ids go into the idempotency payload."""
        call = {"thread_id": thread_id, "message_id": message_id, "tool_call_id": tool_call_id, "order_id": ORDER_ID}
        return self.call(call=call)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def _dict_layer() -> Any:
    """A Powertools persistence layer on a dict, mirroring its Redis layer's rules without the I/O."""
    from aws_lambda_powertools.utilities.idempotency import BasePersistenceLayer
    from aws_lambda_powertools.utilities.idempotency.exceptions import (
        IdempotencyItemAlreadyExistsError,
        IdempotencyItemNotFoundError,
    )

    class DictPersistenceLayer(BasePersistenceLayer):
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.records: dict[str, Any] = {}

        def _get_record(self, idempotency_key: str) -> Any:
            try:
                return self.records[idempotency_key]
            except KeyError:
                raise IdempotencyItemNotFoundError from None

        def _put_record(self, data_record: Any) -> None:
            if data_record.idempotency_key in self.records:
                raise IdempotencyItemAlreadyExistsError
            self.records[data_record.idempotency_key] = data_record

        def _update_record(self, data_record: Any) -> None:
            self.records[data_record.idempotency_key] = data_record

        def _delete_record(self, data_record: Any) -> None:
            self.records.pop(data_record.idempotency_key, None)

    return DictPersistenceLayer()
