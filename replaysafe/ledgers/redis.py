"""``RedisLedger``: the ledger many workers share, in Redis; one round trip per protocol step.

Key layout (every id percent-encoded, so it holds no ``:``, braces or glob
characters and no id can reach another thread's keys)::

    {prefix}:{<thread>}:<message>:<tool call>   a hash: one record
    {prefix}:{<thread>}                          a sorted set: the thread's record keys

The thread is the hash tag, so a thread's keys live on one Redis Cluster slot and
every script touches one slot. Claim-or-get and the fenced writes are Lua scripts,
loaded once and called by sha (``EVALSHA``); nothing from a caller is ever part
of a script's text, only of its keys and arguments.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
import typing
import urllib.parse
import warnings
import weakref
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection
from redis.backoff import NoBackoff
from redis.retry import Retry

from .._errors import ReplaySafeWarning
from .._records import CallKey, ClaimResult, Record, Status
from ._options import io_timeouts, split_url_options
from ._protocol import TRANSIENT_FIX, AsyncLedger, LedgerBase, LedgerFault, RetryPolicy, SigningKey

_PREFIX = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
#: Keys read or deleted per round trip by ``records()`` and ``purge_thread()``.
_BATCH = 500

# KEYS[1] record, KEYS[2] thread index. ARGV: tool_name, args_digest, owner, now, lease.
# Returns the stored record's fields, or 1 after creating it (the caller knows its fields).
_CLAIM = """
local found = redis.call('HGETALL', KEYS[1])
if #found > 0 then return found end
redis.call('HSET', KEYS[1], 'tool_name', ARGV[1], 'args_digest', ARGV[2], 'status', 'running',
    'owner', ARGV[3], 'attempt', 1, 'created_at', ARGV[4], 'updated_at', ARGV[4], 'lease_expires_at', ARGV[5])
-- A running record never expires, so neither may the index that lists it.
redis.call('ZADD', KEYS[2], '+inf', KEYS[1])
redis.call('PERSIST', KEYS[2])
return 1
"""

# KEYS[1] record, KEYS[2] thread index. ARGV: owner, status, now, has_result, result, ttl_ms (0: none), expires_at.
# Fenced: only the claim's owner finishes it; its own finished record matches too,
# so a write tried again after a lost answer succeeds.
_COMPLETE = """
local current = redis.call('HMGET', KEYS[1], 'owner', 'status')
if current[1] ~= ARGV[1] or (current[2] ~= 'running' and current[2] ~= ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'updated_at', ARGV[3])
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'result', ARGV[5]) else redis.call('HDEL', KEYS[1], 'result') end
local ttl = tonumber(ARGV[6])
if ttl == 0 then return 1 end
redis.call('HSET', KEYS[1], 'expires_at', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ttl)
-- The index outlives its longest-lived record: score = when each record expires
-- (server clock, like PEXPIRE), +inf while it does not; drop the expired ones.
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZADD', KEYS[2], now_ms + ttl, KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
if redis.call('ZCOUNT', KEYS[2], '+inf', '+inf') > 0 then
    redis.call('PERSIST', KEYS[2])
else
    local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', KEYS[2], last[2])
end
return 1
"""

# KEYS[1] record, KEYS[2] thread index. ARGV: expected owner, attempt, status; new owner, now, lease.
_TAKEOVER = """
local current = redis.call('HMGET', KEYS[1], 'owner', 'attempt', 'status')
if current[1] ~= ARGV[1] or current[2] ~= ARGV[2] or current[3] ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running', 'owner', ARGV[4], 'attempt', tonumber(ARGV[2]) + 1,
    'updated_at', ARGV[5], 'lease_expires_at', ARGV[6])
redis.call('HDEL', KEYS[1], 'result', 'expires_at')
redis.call('PERSIST', KEYS[1])
redis.call('ZADD', KEYS[2], '+inf', KEYS[1])
redis.call('PERSIST', KEYS[2])
return 1
"""

# KEYS[1] record, KEYS[2] thread index. ARGV: owner.
_RELEASE = """
local current = redis.call('HMGET', KEYS[1], 'owner', 'status')
if current[1] ~= ARGV[1] or current[2] ~= 'running' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], KEYS[1])
return 1
"""

# KEYS[1] record. ARGV: owner, lease_expires_at. Fenced like complete.
_RENEW = """
local current = redis.call('HMGET', KEYS[1], 'owner', 'status')
if current[1] ~= ARGV[1] or current[2] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'lease_expires_at', ARGV[2])
return 1
"""

# KEYS[1] record, KEYS[2] thread index.
_DELETE = """
redis.call('ZREM', KEYS[2], KEYS[1])
return redis.call('DEL', KEYS[1])
"""


_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*")


def _encode(value: str) -> str:
    """Percent-encode an id: only ``[A-Za-z0-9_.~-]`` stay, so the result holds no separator or glob character."""
    if _UNRESERVED.fullmatch(value):  # the common id, which quoting would leave as it is
        return value
    return urllib.parse.quote(value, safe="", encoding="utf-8", errors="surrogatepass")


def _decode(value: str) -> str:
    return urllib.parse.unquote(value, encoding="utf-8", errors="surrogatepass")


def _micros(value: dt.datetime) -> str:
    """A timestamp as integer microseconds since the epoch: exact, and sortable in Lua."""
    delta = value - _EPOCH
    return str((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)


def _from_micros(value: str) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=int(value))


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


def _fields(reply: Any) -> dict[str, str]:
    """``HGETALL``'s reply (a flat list, or a dict from a client with RESP3) as text."""
    if isinstance(reply, dict):
        return {_text(k): _text(v) for k, v in reply.items()}
    return {_text(reply[i]): _text(reply[i + 1]) for i in range(0, len(reply), 2)}


def _record(key: CallKey, fields: dict[str, str]) -> Record:
    expires_at = fields.get("expires_at")
    return Record(
        key=key,
        tool_name=fields["tool_name"],
        args_digest=fields["args_digest"],
        status=Status(fields["status"]),
        result=fields.get("result"),
        owner=fields["owner"],
        attempt=int(fields["attempt"]),
        created_at=_from_micros(fields["created_at"]),
        updated_at=_from_micros(fields["updated_at"]),
        lease_expires_at=_from_micros(fields["lease_expires_at"]),
        expires_at=_from_micros(expires_at) if expires_at is not None else None,
    )


# Connection settings that mean the same to redis-py's sync and asyncio connections.
_PORTABLE_SETTINGS = (
    "host", "port", "db", "username", "password", "path", "socket_timeout", "socket_connect_timeout",
    "socket_keepalive", "client_name", "credential_provider", "encoding", "encoding_errors", "decode_responses",
    "protocol", "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_data", "ssl_check_hostname",
    "ssl_min_version", "ssl_ciphers",
)  # fmt: skip
_SYNC_CONNECTIONS = {
    redis.asyncio.connection.Connection: redis.connection.Connection,
    redis.asyncio.connection.SSLConnection: redis.connection.SSLConnection,
    redis.asyncio.connection.UnixDomainSocketConnection: redis.connection.UnixDomainSocketConnection,
}
_ASYNC_CONNECTIONS: dict[type, type] = {sync: aio for aio, sync in _SYNC_CONNECTIONS.items()}


# The ledger's own URL options; redis-py's (``socket_timeout``, ``db``, ...) stay in the URL.
_LEDGER_OPTIONS: dict[str, Any] = {"prefix": str, "ttl": float, "connect_timeout": float, "io_timeout": float}
_DRIVER_OPTIONS = frozenset(redis.connection.URL_QUERY_ARGUMENT_PARSERS) | frozenset(_PORTABLE_SETTINGS)

_AUTH_FIX = "Fix the username or password in the Redis URL (or the client's credentials)."
_ACL_FIX = (
    "Grant the Redis user the commands the ledger uses (EVALSHA, SCRIPT LOAD, EVAL, HGETALL, ZRANGE, SCAN, DEL, "
    "ZREM) on the ledger's key prefix, or use a user that has them."
)
_RESPONSE_FIX = (
    "Redis refused a command: check that the server is Redis 6.2 or later with scripting enabled and that no "
    "other program writes keys under the ledger's prefix."
)


_NOPERM_COMMAND = re.compile(r"no permissions to run the '([^']+)' command")


def _acl_fix(exc: BaseException, user: str | None, prefix: str | None) -> str:
    """The ACL rule a NOPERM reply asks for: the command, or the ledger's keys, for the user."""
    who = user or "default"
    keys = f"~{prefix}:*" if prefix else "the ledger's keys"
    command = _NOPERM_COMMAND.search(str(exc))
    if command is not None:
        name = command[1].upper()
        return (
            f"The Redis user {who} may not run {name}: grant it (ACL SETUSER {who} +{command[1].lower()}). " + _ACL_FIX
        )
    if "access one of the keys" in str(exc) or "keys used as arguments" in str(exc):
        return (
            f"The Redis user {who} may not access the ledger's keys: grant them (ACL SETUSER {who} {keys}). {_ACL_FIX}"
        )
    return _ACL_FIX


def _diagnose(exc: BaseException, user: str | None = None, prefix: str | None = None) -> LedgerFault:
    """Transient (the link or the server's state) or permanent (credentials, ACL, a refused command)."""
    if isinstance(exc, (redis.AuthenticationError, redis.exceptions.AuthorizationError)):
        return LedgerFault(False, _AUTH_FIX)  # a ConnectionError subclass: test it first
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return LedgerFault(False, _acl_fix(exc, user, prefix))
    transient = (
        redis.ConnectionError,  # refused, reset, closed
        redis.TimeoutError,  # no answer within io_timeout
        redis.BusyLoadingError,
        redis.exceptions.TryAgainError,
        redis.exceptions.ClusterDownError,
        redis.exceptions.MasterDownError,
        redis.exceptions.ReadOnlyError,  # a replica during a failover
        redis.exceptions.OutOfMemoryError,
        ConnectionError,
        TimeoutError,
    )
    if isinstance(exc, transient):
        return LedgerFault(True, TRANSIENT_FIX)
    if isinstance(exc, redis.ResponseError):
        return LedgerFault(False, _RESPONSE_FIX)
    return LedgerFault(False, "A bug or a misconfiguration: check the ledger's URL and options.")


def _once(*, asynchronous: bool = False) -> Any:
    """redis-py's retry for the clients we create: one immediate retry on a fresh connection.

    It replaces a pooled connection that the server closed (a restart) before the
    client noticed. More waiting is the ledger's ``RetryPolicy``'s to decide.
    """
    return (redis.asyncio.retry.Retry if asynchronous else Retry)(NoBackoff(), 1)


def _twin_pool(pool: Any, classes: dict[type, type], what: str) -> dict[str, Any]:
    """The settings of the other flavour's connection pool, from a client's pool."""
    connection_class = classes.get(pool.connection_class)
    if connection_class is None:
        raise TypeError(
            f"RedisLedger cannot open a {what} connection like {pool.connection_class.__name__}: pass a redis:// URL "
            "instead of a client"
        )
    settings = {k: v for k, v in pool.connection_kwargs.items() if k in _PORTABLE_SETTINGS}
    return {"connection_class": connection_class, **settings}


# Ledgers whose connections a forked child must not reuse.
_open_ledgers: weakref.WeakSet[RedisLedger] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for ledger in list(_open_ledgers):
        ledger._forget_parent_connections()


os.register_at_fork(after_in_child=_after_fork_in_child)


class RedisLedger(LedgerBase):
    """A ledger in Redis, shared by every worker that points at it.

    ``url_or_client`` is a URL (``redis://host:6379/0``, ``rediss://``,
    ``unix://``) or a ``redis.Redis`` / ``redis.asyncio.Redis`` client, which is
    then shared and never closed by ``close()``. ``.aio`` uses ``redis.asyncio``:
    given a sync client it connects with the same settings, and the reverse.
    With ``ttl`` (seconds), completed and failed records expire natively.

    Clients the ledger creates wait ``connect_timeout`` seconds to connect and
    ``io_timeout`` for any answer (redis-py's ``socket_connect_timeout`` and
    ``socket_timeout``), so a stalled server gives a ``LedgerError``, not a hang.
    Both may also be URL options; a client passed in keeps its own settings.
    """

    transient_errors: tuple[type[BaseException], ...] = (
        redis.ConnectionError,
        redis.TimeoutError,
        redis.BusyLoadingError,
        redis.exceptions.TryAgainError,
        ConnectionError,
        TimeoutError,
    )

    def __init__(
        self,
        url_or_client: str | redis.Redis | redis.asyncio.Redis,
        *,
        prefix: str | None = None,
        ttl: float | None = None,
        connect_timeout: float | None = None,
        io_timeout: float | None = None,
        retry: RetryPolicy | None = None,
        signing_key: SigningKey | None = None,
    ) -> None:
        super().__init__(retry=retry, signing_key=signing_key)
        if isinstance(url_or_client, str):
            url_or_client, from_url = split_url_options(url_or_client, _LEDGER_OPTIONS, _DRIVER_OPTIONS, "RedisLedger")
            prefix = prefix if prefix is not None else from_url.get("prefix")
            ttl = ttl if ttl is not None else from_url.get("ttl")
            connect_timeout = connect_timeout if connect_timeout is not None else from_url.get("connect_timeout")
            io_timeout = io_timeout if io_timeout is not None else from_url.get("io_timeout")
        prefix = "replaysafe" if prefix is None else prefix
        self.connect_timeout, self.io_timeout = io_timeouts(connect_timeout, io_timeout)
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise ValueError(
                f"RedisLedger prefix {prefix!r} is not allowed: use letters, digits and _ . : / - (max 200), "
                "no braces or glob characters"
            )
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl must be a positive number of seconds or None, got {ttl!r}")
        self.prefix = prefix
        self.ttl = dt.timedelta(seconds=ttl) if ttl else None
        self._ttl_ms = max(1, round(ttl * 1000)) if ttl else 0
        self._url: str | None = None
        self._client: redis.Redis | None = None
        self._shared_aio: redis.asyncio.Redis | None = None
        self._owns_client = True
        if isinstance(url_or_client, str):
            self._url = url_or_client
        elif isinstance(url_or_client, redis.Redis):
            self._client = url_or_client
            self._owns_client = False
            _warn_if_unbounded(url_or_client)
        elif isinstance(url_or_client, redis.asyncio.Redis):
            self._shared_aio = url_or_client
            _warn_if_unbounded(url_or_client)
        else:
            raise TypeError(
                f"RedisLedger takes a redis:// URL or a redis.Redis / redis.asyncio.Redis client, "
                f"not {type(url_or_client).__name__}"
            )
        self._aio_redis: _AsyncRedisLedger | None = None
        self._scripts: dict[str, Any] | None = None
        # Clients a forked child inherited: kept, never used or closed (the parent's sockets).
        self._orphans: list[Any] = []
        _open_ledgers.add(self)

    def __repr__(self) -> str:
        return f"RedisLedger({self._where()}, prefix={self.prefix!r})"

    def _where(self) -> str:
        if self._url is not None:
            parts = urllib.parse.urlsplit(self._url)
            host = parts.netloc.rpartition("@")[2]
            return repr(urllib.parse.urlunsplit(parts._replace(netloc=host, query="")))
        return "<client>"

    # --- connections -------------------------------------------------------------

    @property
    def client(self) -> redis.Redis:
        """The sync client, connected on first use."""
        if self._client is None:
            if self._url is not None:
                self._client = redis.Redis.from_url(self._url, retry=_once(), **self._socket_settings())
            else:
                assert self._shared_aio is not None
                pool = redis.ConnectionPool(**_twin_pool(self._shared_aio.connection_pool, _SYNC_CONNECTIONS, "sync"))
                self._client = redis.Redis(connection_pool=pool, retry=_once())
            self._owns_client = True
            self._scripts = None
        if self._scripts is None:
            self._scripts = _register(self._client)
        return self._client

    def _socket_settings(self) -> dict[str, Any]:
        """Timeouts for the clients the ledger creates (a ``socket_timeout`` in the URL wins)."""
        return {
            "socket_connect_timeout": self.connect_timeout,
            "socket_timeout": self.io_timeout,
            "socket_keepalive": True,
        }

    def diagnose(self, exc: BaseException) -> LedgerFault:
        user = urllib.parse.urlsplit(self._url).username if self._url is not None else None
        return _diagnose(exc, user, self.prefix)

    def _script(self, name: str) -> Any:
        self.client  # noqa: B018 - connects and registers the scripts
        assert self._scripts is not None
        return self._scripts[name]

    def _new_async_client(self) -> redis.asyncio.Redis:
        if self._url is not None:
            return redis.asyncio.Redis.from_url(self._url, retry=_once(asynchronous=True), **self._socket_settings())
        assert self._client is not None
        settings = _twin_pool(self._client.connection_pool, _ASYNC_CONNECTIONS, "asyncio")
        return redis.asyncio.Redis(
            connection_pool=redis.asyncio.ConnectionPool(**settings), retry=_once(asynchronous=True)
        )

    @property
    def aio(self) -> AsyncLedger:
        if self._aio_redis is None:
            self._aio_redis = _AsyncRedisLedger(self)
        return self._aio_redis

    def close(self) -> None:
        """Close the connections this ledger opened; a client passed in is left open."""
        if self._aio_redis is not None:
            self._aio_redis.close()
        if self._client is not None and self._owns_client:
            self._client.connection_pool.disconnect()
            self._client.close()
            self._client = None
            self._scripts = None

    def _forget_parent_connections(self) -> None:
        """In a forked child: connect afresh. A socket shared with the parent would mix
        the two processes' commands and replies."""
        if self._client is not None and self._owns_client:
            self._orphans.append(self._client)
            self._client = None
        self._scripts = None
        if self._shared_aio is not None:
            # The application's asyncio client is the parent's too: use a twin of it.
            pool = self._shared_aio.connection_pool
            self._orphans.append(self._shared_aio)
            self._shared_aio = redis.asyncio.Redis(
                connection_pool=redis.asyncio.ConnectionPool(
                    connection_class=pool.connection_class, **pool.connection_kwargs
                ),
                retry=_once(asynchronous=True),
            )
        if self._aio_redis is not None:
            self._aio_redis._forget_parent_connections()

    async def aclose(self) -> None:
        """``close()`` for async code: also waits for this loop's connections to close."""
        if self._aio_redis is not None:
            await self._aio_redis.aclose()
        self.close()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # --- keys ----------------------------------------------------------------------

    def _thread_tag(self, thread_id: str) -> str:
        return f"{self.prefix}:{{{_encode(thread_id)}}}"

    def _keys(self, key: CallKey) -> list[str]:
        """The record's key and its thread's index."""
        index = self._thread_tag(key.thread_id)
        return [f"{index}:{_encode(key.message_id)}:{_encode(key.tool_call_id)}", index]

    def _parse(self, name: str) -> CallKey | None:
        """The call key of a record's key name; ``None`` for an index or a foreign key."""
        rest = name[len(self.prefix) + 1 :]
        if not name.startswith(f"{self.prefix}:{{") or "}:" not in rest:
            return None
        thread, _, ids = rest[1:].partition("}:")
        message, sep, tool_call = ids.partition(":")
        if not sep or ":" in tool_call:
            return None
        return CallKey(_decode(thread), _decode(message), _decode(tool_call))

    # --- the protocol ----------------------------------------------------------------

    def _claim_args(
        self, key: CallKey, tool_name: str, args_digest: str, owner: str, now: dt.datetime, lease: dt.datetime
    ) -> dict[str, Any]:
        return {"keys": self._keys(key), "args": [tool_name, args_digest, owner, _micros(now), _micros(lease)]}

    def _complete_args(
        self, key: CallKey, owner: str, status: Status, result: str | None, now: dt.datetime
    ) -> dict[str, Any]:
        expiring = self.ttl is not None and status is not Status.IN_DOUBT
        expires_at = _micros(now + self.ttl) if expiring and self.ttl is not None else ""
        args = [owner, status.value, _micros(now), "0" if result is None else "1", result or ""]
        return {"keys": self._keys(key), "args": [*args, self._ttl_ms if expiring else 0, expires_at]}

    def _takeover_args(self, record: Record, owner: str, now: dt.datetime, lease: dt.datetime) -> dict[str, Any]:
        expected = [record.owner, str(record.attempt), record.status.value]
        return {"keys": self._keys(record.key), "args": [*expected, owner, _micros(now), _micros(lease)]}

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
        reply = self._script("claim")(**self._claim_args(key, tool_name, args_digest, owner, now, lease_expires_at))
        if reply == 1:
            return ClaimResult(Record.claimed(key, tool_name, args_digest, owner, now, lease_expires_at), True)
        return ClaimResult(_record(key, _fields(reply)), False)

    def takeover(self, record: Record, *, owner: str, now: dt.datetime, lease_expires_at: dt.datetime) -> Record | None:
        if self._script("takeover")(**self._takeover_args(record, owner, now, lease_expires_at)) != 1:
            return None
        return record.taken_over_by(owner, now, lease_expires_at)

    def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: dt.datetime) -> bool:
        return bool(self._script("complete")(**self._complete_args(key, owner, status, result, now)) == 1)

    def release(self, key: CallKey, *, owner: str) -> bool:
        return bool(self._script("release")(keys=self._keys(key), args=[owner]) == 1)

    def _renew_args(self, key: CallKey, owner: str, lease_expires_at: dt.datetime) -> dict[str, Any]:
        return {"keys": self._keys(key)[:1], "args": [owner, _micros(lease_expires_at)]}

    def renew(self, key: CallKey, *, owner: str, lease_expires_at: dt.datetime) -> bool:
        return bool(self._script("renew")(**self._renew_args(key, owner, lease_expires_at)) == 1)

    def get(self, key: CallKey) -> Record | None:
        fields = _fields(self.client.hgetall(self._keys(key)[0]))
        return _record(key, fields) if fields else None

    def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for key in wanted:
            pipe.hgetall(self._keys(key)[0])
        replies = pipe.execute()
        return {key: _record(key, _fields(reply)) for key, reply in zip(wanted, replies, strict=True) if reply}

    def delete(self, key: CallKey) -> bool:
        return bool(self._script("delete")(keys=self._keys(key)) == 1)

    def purge_thread(self, thread_id: str) -> int:
        index = self._thread_tag(thread_id)
        client = self.client
        deleted = 0
        while members := client.zrange(index, 0, _BATCH - 1):
            pipe = client.pipeline(transaction=True)
            pipe.delete(*members)
            pipe.zrem(index, *members)
            deleted += int(pipe.execute()[0])
        return deleted

    def records(self, *, thread_id: str | None = None) -> Iterator[Record]:
        client = self.client
        if thread_id is not None:
            names = [
                _text(m) for m in typing.cast("list[bytes | str]", client.zrange(self._thread_tag(thread_id), 0, -1))
            ]
        else:
            # The prefix holds no glob character (checked in __init__).
            names = [_text(n) for n in client.scan_iter(match=f"{self.prefix}:{{*}}:*", count=_BATCH)]
        found: list[Record] = []
        for start in range(0, len(names), _BATCH):
            batch = [(key, name) for name in names[start : start + _BATCH] if (key := self._parse(name)) is not None]
            pipe = client.pipeline(transaction=False)
            for _, name in batch:
                pipe.hgetall(name)
            for (key, _), reply in zip(batch, pipe.execute(), strict=True):
                if reply:
                    found.append(_record(key, _fields(reply)))
        return iter(sorted(found, key=lambda r: r.created_at))


def _warn_if_unbounded(client: redis.Redis | redis.asyncio.Redis) -> None:
    """A client passed in is the caller's: say once if it can wait forever on a stalled server."""
    pool = client.connection_pool
    try:  # a connection object, not connected: the pool's settings with the class's defaults filled in
        socket_timeout = getattr(pool.connection_class(**pool.connection_kwargs), "socket_timeout", None)
    except Exception:  # a connection class we cannot build alone: trust what the pool was given
        socket_timeout = pool.connection_kwargs.get("socket_timeout")
    if socket_timeout is None:
        warnings.warn(
            "RedisLedger was given a Redis client without socket_timeout: a stalled server can block every "
            "protected call for as long as it stalls. Create the client with socket_timeout= and "
            "socket_connect_timeout=, or pass a redis:// URL (the ledger then sets both).",
            ReplaySafeWarning,
            stacklevel=3,
        )


def _register(client: redis.Redis | redis.asyncio.Redis) -> dict[str, Any]:
    """The scripts as ``register_script`` objects: ``EVALSHA``, loading the script once if the server lacks it."""
    scripts = {
        "claim": _CLAIM,
        "complete": _COMPLETE,
        "takeover": _TAKEOVER,
        "release": _RELEASE,
        "renew": _RENEW,
        "delete": _DELETE,
    }
    return {name: client.register_script(text) for name, text in scripts.items()}


class _AsyncRedisLedger:
    """``RedisLedger.aio`` on ``redis.asyncio``: a client per event loop (its connections belong to that loop)."""

    def __init__(self, ledger: RedisLedger) -> None:
        self._ledger = ledger
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = weakref.WeakKeyDictionary()
        self._shared: dict[str, Any] | None = None

    def _scripts(self) -> tuple[redis.asyncio.Redis, dict[str, Any]]:
        shared = self._ledger._shared_aio
        if shared is not None:
            if self._shared is None:
                self._shared = _register(shared)
            return shared, self._shared
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is None:
            entry = self._clients[loop] = _LoopClient(self._ledger._new_async_client())
            entry.watch(loop)
        return entry.client, entry.scripts

    def _forget_parent_connections(self) -> None:
        self._ledger._orphans += self._clients.values()
        self._clients = weakref.WeakKeyDictionary()
        self._shared = None

    async def aclose(self) -> None:
        entry = self._clients.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry.aclose()

    def close(self) -> None:
        for loop, entry in list(self._clients.items()):
            entry.close(loop)
        self._clients.clear()

    async def claim(
        self,
        key: CallKey,
        *,
        tool_name: str,
        args_digest: str,
        owner: str,
        now: dt.datetime,
        lease_expires_at: dt.datetime,
    ) -> ClaimResult:
        _, scripts = self._scripts()
        args = self._ledger._claim_args(key, tool_name, args_digest, owner, now, lease_expires_at)
        reply = await scripts["claim"](**args)
        if reply == 1:
            return ClaimResult(Record.claimed(key, tool_name, args_digest, owner, now, lease_expires_at), True)
        return ClaimResult(_record(key, _fields(reply)), False)

    async def takeover(
        self, record: Record, *, owner: str, now: dt.datetime, lease_expires_at: dt.datetime
    ) -> Record | None:
        _, scripts = self._scripts()
        if await scripts["takeover"](**self._ledger._takeover_args(record, owner, now, lease_expires_at)) != 1:
            return None
        return record.taken_over_by(owner, now, lease_expires_at)

    async def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: dt.datetime) -> bool:
        _, scripts = self._scripts()
        return bool(await scripts["complete"](**self._ledger._complete_args(key, owner, status, result, now)) == 1)

    async def release(self, key: CallKey, *, owner: str) -> bool:
        _, scripts = self._scripts()
        return bool(await scripts["release"](keys=self._ledger._keys(key), args=[owner]) == 1)

    async def renew(self, key: CallKey, *, owner: str, lease_expires_at: dt.datetime) -> bool:
        _, scripts = self._scripts()
        return bool(await scripts["renew"](**self._ledger._renew_args(key, owner, lease_expires_at)) == 1)

    async def get(self, key: CallKey) -> Record | None:
        client, _ = self._scripts()
        fields = _fields(await client.hgetall(self._ledger._keys(key)[0]))
        return _record(key, fields) if fields else None

    async def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        client, _ = self._scripts()
        pipe = client.pipeline(transaction=False)
        for key in wanted:
            pipe.hgetall(self._ledger._keys(key)[0])
        replies = await pipe.execute()
        return {key: _record(key, _fields(reply)) for key, reply in zip(wanted, replies, strict=True) if reply}


class _LoopClient:
    """An asyncio client and its scripts, closed before its event loop ends.

    Its sockets belong to the loop; once the loop is closed they cannot be closed
    cleanly. ``asyncio.run()`` and other runners finalize async generators
    (``loop.shutdown_asyncgens()``) just before closing the loop, so a generator
    parked on the loop is the hook that closes the client in time.
    """

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        self.scripts = _register(client)
        self._guard: Any = None
        self._tasks: set[asyncio.Task[None]] = set()

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._guard = self._close_at_shutdown()
        self._keep(loop.create_task(self._start_guard()))

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_guard(self) -> None:
        await self._guard.__anext__()

    async def _close_at_shutdown(self) -> Any:
        try:
            yield
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        await self.client.aclose(close_connection_pool=True)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close from sync code: now if the loop is idle, soon if it runs; a closed loop already did."""
        if loop.is_closed():
            return
        if loop.is_running():
            self._keep(loop.create_task(self.aclose()))
        else:
            loop.run_until_complete(self.aclose())
