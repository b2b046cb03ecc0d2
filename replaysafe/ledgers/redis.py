"""``RedisLedger``: the ledger many workers share, in Redis or Redis Cluster; one round trip per protocol step.

Key layout (every id percent-encoded, so it holds no ``:``, braces or glob
characters and no id can reach another thread's keys)::

    {prefix}:{<thread>}:<message>:<tool call>   a string: one record, packed
    {prefix}:{<thread>}                          a sorted set: the thread's record keys

The thread is the hash tag, so a thread's keys live on one Redis Cluster slot and
every script touches one slot. A record is one string (see ``_pack``): a replay is
one command whose one reply is parsed once. Claim-or-get and the fenced writes are
Lua scripts called by sha (``EVALSHA``); nothing from a caller is ever part of a
script's text, only of its keys and arguments.

Each operation is written once, as data (``_Operations``: the command and how to
read its reply); ``RedisLedger`` runs it on a sync client and ``.aio`` on an asyncio
client, each with one small runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import hashlib
import re
import threading
import urllib.parse
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, Generic, NamedTuple, ParamSpec, TypeVar

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.connection
import redis.cluster
import redis.connection
from redis.backoff import NoBackoff
from redis.retry import Retry

from .._errors import ReplaySafeWarning
from .._records import CallKey, ClaimResult, Record, Status, expires_at, new_tuple
from ._idle import IdleConnections
from ._options import given_first, io_timeouts, split_url_options
from ._protocol import (
    TRANSIENT_FIX,
    AsyncLedger,
    AsyncStoredLedger,
    LedgerFault,
    RetryPolicy,
    SigningKey,
    StoredLedger,
    forget_in_forked_child,
)

_T = TypeVar("_T")
_P = ParamSpec("_P")

_PREFIX = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MICROSECOND = dt.timedelta(microseconds=1)
#: Keys read or deleted per round trip by ``records()`` and ``purge_thread()``.
_BATCH = 500

# --- the packed record -------------------------------------------------------------------
#
# One string per record, a header line of space-separated ASCII fields, then the text fields
# back to back, each as long as the header says (in UTF-8 bytes)::
#
#     1 <status> <attempt> <created> <updated> <lease> <expires> <owner> <tool> <digest> <result>\n
#     <owner><tool name><args digest><result>
#
# ``1`` is the format's version; times are integer microseconds since the epoch; ``expires``
# and the result's length are empty when there is none. Python packs and parses it here;
# the Lua scripts below read the header and rewrite it when they finish or renew a record.

_FORMAT = b"1"
_STATUSES = {status.value: status for status in Status}
#: Each status's stored word, looked up (an enum's ``.value`` is a slow property on the hot path).
_WORDS = {status: status.value for status in Status}


class RecordFormatError(ValueError):
    """A key under the ledger's prefix holds a value that is not a record of this format."""


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _micros(value: dt.datetime) -> str:
    """A timestamp as integer microseconds since the epoch: exact, and comparable in Lua."""
    since = value - _EPOCH  # integer arithmetic on its fields: half the time of ``since // _MICROSECOND``
    return str((since.days * 86400 + since.seconds) * 1000000 + since.microseconds)


def _at(micros: bytes | str) -> dt.datetime:
    return _EPOCH + _MICROSECOND * int(micros)


def _pack(record: Record) -> bytes:
    _, tool, digest, status, result, owner, attempt, created_at, updated_at, lease_at, expires_at_ = record
    created = _micros(created_at)
    updated = created if updated_at == created_at else _micros(updated_at)
    expires = "" if expires_at_ is None else _micros(expires_at_)
    ids = f"{owner}{tool}{digest}" if result is None else f"{owner}{tool}{digest}{result}"
    if ids.isascii():  # the common record: each text's length in UTF-8 bytes is its length
        size = "" if result is None else len(result)
        return (
            f"1 {_WORDS[status]} {attempt} {created} {updated} {_micros(lease_at)} {expires} "
            f"{len(owner)} {len(tool)} {len(digest)} {size}\n{ids}"
        ).encode()
    owner_b, tool_b, digest_b = _utf8(owner), _utf8(tool), _utf8(digest)
    result_b = b"" if result is None else _utf8(result)
    size = "" if result is None else len(result_b)
    head = (
        f"1 {_WORDS[status]} {attempt} {created} {updated} {_micros(lease_at)} {expires} "
        f"{len(owner_b)} {len(tool_b)} {len(digest_b)} {size}\n"
    )
    return b"".join((head.encode(), owner_b, tool_b, digest_b, result_b))


#: Each small number by its decimal text: a record's lengths and attempt are read by a lookup, several times
#: cheaper than ``int()`` (any other text, a larger number included, goes to ``int()``).
_SMALL = {str(n): n for n in range(1, 1024)}


def _unpack(key: CallKey, value: bytes | str) -> Record:
    """The record ``_pack`` wrote (a client with ``decode_responses`` hands it over as text)."""
    try:
        text = value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value
        head, _, body = text.partition("\n")
        version, status, attempt, created, updated, lease, expires, owner, tool, digest, size = head.split(" ")
        tool_at = _SMALL.get(owner) or int(owner)
        digest_at = tool_at + (_SMALL.get(tool) or int(tool))
        result_at = digest_at + (_SMALL.get(digest) or int(digest))
        end = result_at + (_SMALL.get(size) or int(size)) if size else result_at
        if len(body) != end or not text.isascii():
            # Lengths count UTF-8 bytes: a body with other characters is sliced as bytes.
            return _unpack_bytes(key, _utf8(text))
        if version != "1":
            raise ValueError("not this format")
        created_at = _at(created)
        return new_tuple(  # type: ignore[no-any-return]
            Record,
            (
                key,
                body[tool_at:digest_at],
                body[digest_at:result_at],
                _STATUSES[status],
                body[result_at:] if size else None,
                body[:tool_at],
                _SMALL.get(attempt) or int(attempt),
                created_at,
                created_at if updated == created else _at(updated),
                _at(lease),
                _at(expires) if expires else None,
            ),
        )
    except (ValueError, KeyError, UnicodeDecodeError):
        raise _format_error(key) from None


def _unpack_bytes(key: CallKey, raw: bytes) -> Record:
    """``_unpack`` for a record whose texts are not all ASCII: its lengths count UTF-8 bytes."""
    head, _, body = raw.partition(b"\n")
    version, status, attempt, created, updated, lease, expires, owner, tool, digest, size = head.split(b" ")
    tool_at = int(owner)
    digest_at = tool_at + int(tool)
    result_at = digest_at + int(digest)
    if version != _FORMAT or len(body) != result_at + (int(size) if size else 0):
        raise ValueError("not this format")
    created_at = _at(created)
    return Record(
        key,
        body[tool_at:digest_at].decode("utf-8", "surrogatepass"),
        body[digest_at:result_at].decode("utf-8", "surrogatepass"),
        _STATUSES[status.decode()],
        body[result_at:].decode("utf-8", "surrogatepass") if size else None,
        body[:tool_at].decode("utf-8", "surrogatepass"),
        int(attempt),
        created_at,
        created_at if updated == created else _at(updated),
        _at(lease),
        _at(expires) if expires else None,
    )


def _format_error(key: CallKey) -> RecordFormatError:
    return RecordFormatError(
        f"the Redis value of the call {key} is not a record this ledger can read (format {_FORMAT.decode()}): "
        "it was written by an older replaysafe (records were hashes before) or by another program. Delete the "
        "key, or give this ledger a prefix of its own."
    )


# --- the scripts ---------------------------------------------------------------------------


class _Script(NamedTuple):
    text: str
    sha: str


def _script(body: str, *, reads: bool = True) -> _Script:
    text = _READ + body if reads else body
    return _Script(text, hashlib.sha1(text.encode()).hexdigest())


# A record's header fields (see _pack) in one match: 1 status, 2 attempt, 3 created, 4 updated,
# 5 lease, 6 expires, 7..9 the owner's, tool name's and digest's lengths, 10 the result's, and
# 11 where the body starts. ``held`` is the fence: the record exists and ``owner`` holds it.
_READ = """
local function read(name)
    local value = redis.call('GET', name)
    if not value then return nil end
    local f = {string.match(value, '^1 ([%a_]+) (%d+) (%d+) (%d+) (%d+) (%d*) (%d+) (%d+) (%d+) (%d*)\\n()')}
    if f[11] == nil then error({err = 'replaysafe-format: the key does not hold a record of format 1'}) end
    return f, value
end
local function held(f, value, owner)
    return f ~= nil and string.sub(value, f[11], f[11] + f[7] - 1) == owner
end
local function header(f)
    return '1 ' .. f[1] .. ' ' .. f[2] .. ' ' .. f[3] .. ' ' .. f[4] .. ' ' .. f[5] .. ' ' .. f[6] .. ' ' .. f[7]
        .. ' ' .. f[8] .. ' ' .. f[9] .. ' ' .. f[10] .. '\\n'
end
"""

# KEYS[1] record, KEYS[2] thread index. ARGV: the new running record.
# Returns the stored record, or 1 after storing the new one.
_CLAIM = _script(
    """
local found = redis.call('GET', KEYS[1])
if found then return found end
redis.call('SET', KEYS[1], ARGV[1])
-- A running record never expires, so neither may the index that lists it.
redis.call('ZADD', KEYS[2], '+inf', KEYS[1])
redis.call('PERSIST', KEYS[2])
return 1
""",
    reads=False,
)

# KEYS[1] record, KEYS[2] thread index. ARGV: owner, status, now, result length ('' for none), result,
# ttl_ms (0: none), expires_at. Fenced: only the claim's owner finishes it; its own finished record
# matches too, so a write tried again after a lost answer succeeds.
# The hot write: it reads only the header fields it keeps or checks (not ``read``'s table of all of them).
_COMPLETE = _script(
    """
local value = redis.call('GET', KEYS[1])
if not value then return 0 end
-- status, attempt and created, lease, the lengths of owner, tool name and digest, where the body starts
local status, kept, lease, owner, tool, digest, at =
    string.match(value, '^1 ([%a_]+) (%d+ %d+) %d+ (%d+) %d* (%d+) (%d+) (%d+) %d*\\n()')
if at == nil then error({err = 'replaysafe-format: the key does not hold a record of format 1'}) end
if string.sub(value, at, at + owner - 1) ~= ARGV[1] or (status ~= 'running' and status ~= ARGV[2]) then return 0 end
value = '1 ' .. ARGV[2] .. ' ' .. kept .. ' ' .. ARGV[3] .. ' ' .. lease .. ' ' .. ARGV[7] .. ' ' .. owner .. ' '
    .. tool .. ' ' .. digest .. ' ' .. ARGV[4] .. '\\n' .. string.sub(value, at, at + owner + tool + digest - 1)
    .. ARGV[5]
local ttl = tonumber(ARGV[6])
if ttl == 0 then
    redis.call('SET', KEYS[1], value)
    return 1
end
redis.call('SET', KEYS[1], value, 'PX', ttl)
-- The index outlives its longest-lived record: score = when each record expires
-- (server clock, like PX), +inf while it does not; drop the expired ones.
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
""",
    reads=False,
)

# KEYS[1] record, KEYS[2] thread index. ARGV: expected owner, attempt, status; the new running record.
_TAKEOVER = _script(
    """
local f, old = read(KEYS[1])
if not held(f, old, ARGV[1]) or f[2] ~= ARGV[2] or f[1] ~= ARGV[3] then return 0 end
redis.call('SET', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[2], '+inf', KEYS[1])
redis.call('PERSIST', KEYS[2])
return 1
"""
)

# KEYS[1] record, KEYS[2] thread index. ARGV: owner.
_RELEASE = _script(
    """
local f, old = read(KEYS[1])
if not held(f, old, ARGV[1]) or f[1] ~= 'running' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], KEYS[1])
return 1
"""
)

# KEYS[1] record. ARGV: owner, lease_expires_at. Fenced like complete.
_RENEW = _script(
    """
local f, old = read(KEYS[1])
if not held(f, old, ARGV[1]) or f[1] ~= 'running' then return 0 end
f[5] = ARGV[2]
redis.call('SET', KEYS[1], header(f) .. string.sub(old, f[11]))
return 1
"""
)

# KEYS[1] record, KEYS[2] thread index.
_DELETE = _script(
    """
redis.call('ZREM', KEYS[2], KEYS[1])
return redis.call('DEL', KEYS[1])
""",
    reads=False,
)

# KEYS[1] thread index, KEYS[2..] some of its records (one slot: the thread's hash tag).
_PURGE = _script(
    """
local deleted = redis.call('DEL', unpack(KEYS, 2))
redis.call('ZREM', KEYS[1], unpack(KEYS, 2))
return deleted
""",
    reads=False,
)

# --- the cache of a tiered ledger (``ledgers.tiered``) ----------------------------------------
#
# Entries live in a key space of their own (``TieredLedger`` builds an ``_Operations`` whose prefix is the
# cache's prefix, ``:tiered:`` and the truth's identity), never among this ledger's records. Each entry is
# ``<run_id> <record in this ledger's format>``: the ``run_id`` of the Redis server that stored it. A read
# serves an entry only under the same run_id, so an entry a server brought back from a snapshot (or an
# append-only file) after a restart is never served: it may be one a deletion removed since. Beside each
# entry a fill token (``<entry key>:fill``, also ``<run_id> <token>``) fences the writes: a miss hands one
# out, an invalidation deletes it, and a write is taken only with the token still there (so a read of the
# truth that raced an invalidation cannot put back what it removed). The thread index lists entries and
# tokens alike, each scored by when it expires.

# Keeps the thread index (KEYS[3]) alive as long as a member added until ``until`` (ms; 0: forever), and
# drops members already expired. ``existed``: whether the index was there before the member was added.
# ``run_id``: the server's run id and a space, what every entry and token it stores starts with.
_KEEP_INDEX = """
local function keep_index(index, existed, ends, now_ms)
    redis.call('ZREMRANGEBYSCORE', index, '-inf', now_ms)
    if ends == 0 then
        redis.call('PERSIST', index)
        return
    end
    local left = redis.call('PTTL', index)
    if existed == 0 or (left >= 0 and now_ms + left < ends) then
        redis.call('PEXPIREAT', index, ends)
    end
end
local function server_ms()
    local time = redis.call('TIME')
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
local function run_id()
    local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
    if run == nil then error({err = 'replaysafe-format: the server did not say its run_id'}) end
    return run .. ' '
end
local function this_run(value, run)
    return value and string.sub(value, 1, #run) == run
end
"""

# KEYS[1] entry, KEYS[2] fill token, KEYS[3] thread index. ARGV: a new token, the token's life (ms).
# Returns the entry (the record, without its run_id), or {token}: the token there, else the new one, stored.
# An entry or token of another run of the server (stored before a restart) is deleted: a miss.
_CACHE_READ = _script(
    _KEEP_INDEX
    + """
local run = run_id()
local found = redis.call('GET', KEYS[1])
if this_run(found, run) then return string.sub(found, #run + 1) end
if found then redis.call('DEL', KEYS[1]) end
local token = redis.call('GET', KEYS[2])
if this_run(token, run) then return {token} end
local existed = redis.call('EXISTS', KEYS[3])
local now_ms = server_ms()
local ends = now_ms + tonumber(ARGV[2])
token = run .. ARGV[1]
redis.call('SET', KEYS[2], token, 'PX', ARGV[2])
redis.call('ZADD', KEYS[3], ends, KEYS[2])
keep_index(KEYS[3], existed, ends, now_ms)
return {token}
""",
    reads=False,
)

# KEYS[1] entry, KEYS[2] fill token, KEYS[3] thread index. ARGV: the token, the packed record, its attempt,
# its update time (us), when it expires (ms since the epoch, 0: never), the cache's own ttl (ms, 0: none).
# Taken only with the token still there (and of this run), and only over an older version of this run:
# (attempt, updated) lower.
_CACHE_FILL = _script(
    _KEEP_INDEX
    + """
local run = run_id()
local token = redis.call('GET', KEYS[2])
if token ~= ARGV[1] or not this_run(token, run) then return 0 end
local old = redis.call('GET', KEYS[1])
if this_run(old, run) then
    local attempt, updated = string.match(string.sub(old, #run + 1), '^1 [%a_]+ (%d+) %d+ (%d+) ')
    if attempt ~= nil then
        local stored, given = tonumber(attempt), tonumber(ARGV[3])
        if stored > given or (stored == given and tonumber(updated) >= tonumber(ARGV[4])) then return 0 end
    end
end
local now_ms = server_ms()
local ends, cap = tonumber(ARGV[5]), tonumber(ARGV[6])
if cap > 0 and (ends == 0 or ends > now_ms + cap) then ends = now_ms + cap end
if ends ~= 0 and ends <= now_ms then return 0 end
local existed = redis.call('EXISTS', KEYS[3])
redis.call('SET', KEYS[1], run .. ARGV[2])
if ends ~= 0 then redis.call('PEXPIREAT', KEYS[1], ends) end
redis.call('ZADD', KEYS[3], ends == 0 and '+inf' or ends, KEYS[1])
keep_index(KEYS[3], existed, ends, now_ms)
return 1
""",
    reads=False,
)

# KEYS[1] thread index, KEYS[2..] the entries and tokens of the thread it lists (one slot). ARGV: every member
# listed, its own or not: all leave the index, only the keys (KEYS) are deleted.
_CACHE_PURGE = _script(
    """
local deleted = 0
if #KEYS > 1 then deleted = redis.call('DEL', unpack(KEYS, 2)) end
if #ARGV > 0 then redis.call('ZREM', KEYS[1], unpack(ARGV)) end
return deleted
""",
    reads=False,
)

_SCRIPTS = (_CLAIM, _COMPLETE, _TAKEOVER, _RELEASE, _RENEW, _DELETE, _PURGE, _CACHE_READ, _CACHE_FILL, _CACHE_PURGE)


# --- keys ------------------------------------------------------------------------------------

_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*")


def _encode(value: str) -> str:
    """Percent-encode an id: only ``[A-Za-z0-9_.~-]`` stay, so the result holds no separator or glob character."""
    if _UNRESERVED.fullmatch(value):  # the common id, which quoting would leave as it is
        return value
    return urllib.parse.quote(value, safe="", encoding="utf-8", errors="surrogatepass")


def _decode(value: str) -> str:
    return urllib.parse.unquote(value, encoding="utf-8", errors="surrogatepass")


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


# --- operations as data ---------------------------------------------------------------------


class _Op(Generic[_T]):
    """One ledger operation: one command (or a batch, pipelined in one round trip) and how its reply reads."""

    __slots__ = ("batch", "command", "parse")

    def __init__(
        self, parse: Callable[[Any], _T], command: Sequence[Any] = (), batch: Sequence[Sequence[Any]] | None = None
    ) -> None:
        self.parse = parse
        self.command = command
        self.batch = batch

    def send(self, client: Any) -> Any:
        """Send it on a sync or asyncio client: the reply, or for an asyncio client an awaitable of it."""
        if self.batch is None:
            return client.execute_command(*self.command)
        pipe = client.pipeline(transaction=False)
        for command in self.batch:
            pipe.execute_command(*command)
        return pipe.execute()


class _Held:
    """A sync single-server client whose commands run on connections the ledger holds.

    redis-py's command layer (a pool checkout and release under a lock, a retry closure,
    observability hooks, response callbacks) costs about as much client time per command
    as the round trip itself. These connections are made like the client's pool makes
    its own (its connection class and settings), each used by one caller at a time (a
    list: ``pop`` and ``append`` are atomic), and a command is packed, sent and read,
    its reply read by the client's response callback if it has one (the hot commands,
    ``EVALSHA`` and ``GET``, have none). The connection's retry applies as in redis-py:
    a connection error disconnects it and the command goes again on a fresh
    connection. Anything interrupted (a timeout, a signal) disconnects it, so no reply
    is left unread on it. Pipelines go to the client. ``_AsyncHeld`` is the same for one
    event loop.
    """

    asynchronous = False

    def __init__(self, client: Any) -> None:
        self.client = client
        pool = client.connection_pool
        self._make: Callable[[], Any] = functools.partial(pool.connection_class, **self._settings(pool))
        self._callbacks: dict[str, Callable[[Any], Any]] = client.response_callbacks
        self._idle: IdleConnections[Any] = IdleConnections()

    def _settings(self, pool: Any) -> dict[str, Any]:
        """What a held connection is made with: the pool's settings, and a retry when they give none.

        redis-py's pool reopens a connection the server closed (a restart, an idle timeout) when
        it hands it out; a held connection never goes through that check, so without a retry of
        its own a stale one would fail the next command. A client's own retry is kept.
        """
        settings = dict(pool.connection_kwargs)
        if settings.get("retry") is None:
            settings["retry"] = _once(asynchronous=self.asynchronous)
        return settings

    @staticmethod
    def fits(client: Any) -> bool:
        """Whether ``client``'s connections can be held: a plain pool, no client-side cache or sentinel."""
        pool = getattr(client, "connection_pool", None)
        plain = (redis.ConnectionPool, redis.BlockingConnectionPool)
        plain_async = (redis.asyncio.ConnectionPool, redis.asyncio.BlockingConnectionPool)
        return type(pool) in (*plain, *plain_async) and getattr(pool, "cache", None) is None

    def _take(self) -> Any:
        conn = self._idle.pop()
        return self._make() if conn is None else conn

    def _read(self, name: str, reply: Any) -> Any:
        callback = self._callbacks.get(name)
        return reply if callback is None else callback(reply)

    def execute_command(self, *command: Any) -> Any:
        conn = self._take()
        failures = _Failures(conn)
        try:
            reply = conn.retry.call_with_retry(lambda: _exchange(conn, command), failures)
        except redis.ResponseError as exc:
            failures.chain(exc)
            raise  # the reply was read whole: the connection is clean
        except BaseException as exc:
            failures.chain(exc)
            conn.disconnect()
            raise
        finally:
            for closed in self._idle.keep(conn):  # closed while this command ran: not to stay open
                closed.disconnect()
        return self._read(command[0], reply)

    def pipeline(self, transaction: bool) -> Any:
        return self.client.pipeline(transaction=transaction)

    def script_load(self, text: str) -> Any:
        return self.client.script_load(text)

    def close(self) -> None:
        for conn in self._idle.close():
            conn.disconnect()


class _AsyncHeld(_Held):
    """``_Held`` for an asyncio single-server client: connections of one event loop.

    On Python 3.11+ the client's ``socket_timeout`` bounds each exchange (connect, send
    and read) as one ``asyncio.timeout``, a timer handle: redis-py's own bound wraps each
    send in ``asyncio.wait_for``, which makes a Task per command on Python 3.11.
    """

    asynchronous = True

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        pool = client.connection_pool
        self._bound: float | None = None
        timeout = pool.connection_kwargs.get("socket_timeout")
        if timeout is not None and _timeout is not None:
            self._bound = timeout
            settings = {**self._settings(pool), "socket_timeout": None}
            self._make = functools.partial(pool.connection_class, **settings)

    async def _exchange(self, conn: Any, command: Sequence[Any]) -> Any:
        if self._bound is None or _timeout is None:
            return await _aexchange(conn, command)
        async with _timeout(self._bound):
            return await _aexchange(conn, command)

    async def execute_command(self, *command: Any) -> Any:
        conn = self._take()
        failures = _Failures(conn)
        try:
            reply = await conn.retry.call_with_retry(lambda: self._exchange(conn, command), failures)
        except redis.ResponseError as exc:
            failures.chain(exc)
            raise
        except BaseException as exc:
            failures.chain(exc)
            await conn.disconnect(nowait=True)
            raise
        finally:
            for closed in self._idle.keep(conn):  # closed while this command ran: not to stay open
                await closed.disconnect(nowait=True)
        return self._read(command[0], reply)

    async def aclose(self) -> None:
        for conn in self._idle.close():
            await conn.disconnect()


#: ``asyncio.timeout`` (Python 3.11+), else ``None``.
_timeout: Callable[[float | None], Any] | None = getattr(asyncio, "timeout", None)


async def _aexchange(conn: Any, command: Sequence[Any]) -> Any:
    await conn.send_packed_command(_packed(command, conn.encoder))
    return await conn.read_response()


class _Failures:
    """redis-py's own retry of one command on a held connection: what it does on each failure
    (``disconnect()``, as redis-py does; the async retry awaits what this returns), and the first
    failure, kept.

    A command whose connection dropped may have run before it did (its reply lost), and the
    retry that follows at once may then fail for good (a permission revoked meanwhile). The
    final error is raised from the first failure (``chain``), so that the ledger's caller, which
    sees only one attempt, knows the command may have landed and undoes it (``ledger_error``).
    """

    __slots__ = ("conn", "first")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.first: BaseException | None = None

    def __call__(self, error: BaseException) -> Any:
        if self.first is None:
            self.first = error
        return self.conn.disconnect()

    def chain(self, final: BaseException) -> None:
        _raised_from(final, self.first)


def _raised_from(final: BaseException, first: BaseException | None) -> None:
    """Mark ``final`` as raised from ``first`` (what ``ledger_error`` reads), unless it has a cause
    of its own or is ``first`` itself."""
    if first is not None and first is not final and final.__cause__ is None:
        final.__cause__ = first


@contextlib.contextmanager
def _after_reload(missing: redis.exceptions.NoScriptError) -> Iterator[None]:
    """An operation sent again once its scripts are reloaded: an error it raises then is raised from
    what ``missing`` was (``_Failures``): a connection dropped before it, while the first try may
    have run. Otherwise that first try's landing would be forgotten across the reload."""
    try:
        yield
    except BaseException as exc:
        _raised_from(exc, missing.__cause__)
        raise


def _exchange(conn: Any, command: Sequence[Any]) -> Any:
    conn.send_packed_command(_packed(command, conn.encoder))
    return conn.read_response()


def _packed(command: Sequence[Any], encoder: Any) -> list[bytes]:
    """One of the ledger's commands (texts, bytes, integers) in RESP, as redis-py packs it with ``encoder``'s
    encoding, in one buffer: a loop over the arguments instead of redis-py's encoder call per argument."""
    encoding, errors = encoder.encoding, encoder.encoding_errors
    name = command[0]
    if isinstance(name, str) and " " in name:  # a command of two words ("CLIENT ID"): split, as redis-py does
        command = (*name.split(), *command[1:])
    parts = [b"*%d\r\n" % len(command)]
    for arg in command:
        if isinstance(arg, str):
            arg = arg.encode(encoding, errors)
        elif type(arg) is int:
            arg = b"%d" % arg
        elif not isinstance(arg, bytes):  # anything else as redis-py has it (a float, or an error for a bool)
            arg = encoder.encode(arg)
        parts.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return [b"".join(parts)]


def _load_scripts(client: Any) -> list[Any]:
    """Load every script (on each primary of a cluster); for an asyncio client, awaitables."""
    return [client.script_load(script.text) for script in _SCRIPTS]


def _evalsha(script: _Script, keys: Sequence[str], *args: Any) -> tuple[Any, ...]:
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


def _is_one(reply: Any) -> bool:
    return bool(reply == 1)


class _Operations:
    """Every operation of the Redis ledger, built as data: no I/O, shared by the sync and async runners."""

    __slots__ = ("_open", "prefix", "ttl", "ttl_ms")

    def __init__(self, prefix: str, ttl: dt.timedelta | None) -> None:
        self.prefix = prefix
        self.ttl = ttl
        self.ttl_ms = max(1, round(ttl.total_seconds() * 1000)) if ttl else 0
        #: What every key name starts with: the prefix and the hash tag's opening brace.
        self._open = f"{prefix}:{{"

    # keys

    def index(self, thread_id: str) -> str:
        """The thread's index; its name is also the hash tag of every key of the thread."""
        return f"{self._open}{_encode(thread_id)}}}"

    def keys(self, key: CallKey) -> tuple[str, str]:
        """The record's key and its thread's index."""
        thread, message, tool_call = key
        if _UNRESERVED.fullmatch(f"{thread}{message}{tool_call}") is None:  # else each id is its own encoding
            thread, message, tool_call = _encode(thread), _encode(message), _encode(tool_call)
        index = f"{self._open}{thread}}}"
        return f"{index}:{message}:{tool_call}", index

    def call_key(self, name: str) -> CallKey | None:
        """The call key of a record's key name; ``None`` for an index or a foreign key."""
        rest = name[len(self.prefix) + 1 :]
        if not name.startswith(f"{self.prefix}:{{") or "}:" not in rest:
            return None
        thread, _, ids = rest[1:].partition("}:")
        message, sep, tool_call = ids.partition(":")
        if not sep or ":" in tool_call:
            return None
        return CallKey(_decode(thread), _decode(message), _decode(tool_call))

    # the protocol

    def claim(self, record: Record) -> _Op[ClaimResult]:
        """Store ``record`` (a first claim's, see ``Record.claimed``) unless a record is there."""
        key = record.key

        def parse(reply: Any) -> ClaimResult:
            found = (record, True) if reply == 1 else (_unpack(key, reply), False)
            return new_tuple(ClaimResult, found)  # type: ignore[no-any-return]

        name, index = self.keys(key)
        return _Op(parse, ("EVALSHA", _CLAIM.sha, 2, name, index, _pack(record)))

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
    ) -> _Op[Record | None]:
        """Replace ``record`` (still as read) by a ``running`` one (or ``status``) for ``owner``, attempt + 1."""
        taken = record.taken_over_by(owner, now, lease_expires_at, status, result, args_digest)
        # Owners go as UTF-8, as records hold them, whatever the client's own encoding.
        expected = (_utf8(record.owner), str(record.attempt), _WORDS[record.status])
        return _Op(
            lambda reply: taken if reply == 1 else None,
            _evalsha(_TAKEOVER, self.keys(record.key), *expected, _pack(taken)),
        )

    def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: dt.datetime) -> _Op[bool]:
        """Finish the call ``owner`` claimed (fenced); with a ttl, a finished record expires unless in doubt."""
        expiry = expires_at(status, now, self.ttl)
        ttl_ms, expiry_text = (0, "") if expiry is None else (self.ttl_ms, _micros(expiry))
        encoded = b"" if result is None else _utf8(result)
        size = "" if result is None else len(encoded)
        record, index = self.keys(key)
        owned = _utf8(owner)  # as records hold it, whatever the client's encoding
        command = ("EVALSHA", _COMPLETE.sha, 2, record, index, owned, _WORDS[status], _micros(now), size, encoded)
        return _Op(_is_one, (*command, ttl_ms, expiry_text))

    def release(self, key: CallKey, *, owner: str) -> _Op[bool]:
        """Delete the ``running`` record ``owner`` holds."""
        return _Op(_is_one, _evalsha(_RELEASE, self.keys(key), _utf8(owner)))

    def renew(self, key: CallKey, *, owner: str, lease_expires_at: dt.datetime) -> _Op[bool]:
        """Move the lease of the ``running`` record ``owner`` holds (fenced)."""
        return _Op(_is_one, _evalsha(_RENEW, self.keys(key)[:1], _utf8(owner), _micros(lease_expires_at)))

    def get(self, key: CallKey) -> _Op[Record | None]:
        return _Op(lambda reply: None if reply is None else _unpack(key, reply), ("GET", self.keys(key)[0]))

    def get_many(self, keys: Iterable[CallKey]) -> _Op[dict[CallKey, Record]]:
        """The records among ``keys`` that exist, pipelined in one round trip."""
        wanted = list(dict.fromkeys(keys))

        def parse(replies: list[Any]) -> dict[CallKey, Record]:
            return {key: _unpack(key, reply) for key, reply in zip(wanted, replies, strict=True) if reply is not None}

        return _Op(parse, batch=[("GET", self.keys(key)[0]) for key in wanted])

    def delete(self, key: CallKey) -> _Op[bool]:
        return _Op(_is_one, _evalsha(_DELETE, self.keys(key)))

    # the cache of a tiered ledger (see ``_CACHE_READ``)

    def cache_read(self, key: CallKey, token: str, token_ms: int) -> _Op[tuple[Record | None, str | None]]:
        """The entry of ``key``, or (a miss) the fill token a later ``cache_fill`` must show."""
        name, index = self.keys(key)

        def parse(reply: Any) -> tuple[Record | None, str | None]:
            if isinstance(reply, list):
                return None, _text(reply[0])
            return _unpack(key, reply), None

        return _Op(parse, _evalsha(_CACHE_READ, (name, f"{name}:fill", index), token, token_ms))

    def cache_fill(self, record: Record, token: str) -> _Op[bool]:
        """Store finished ``record`` as the entry of its key, if ``token`` still fences it and no newer one is there."""
        name, index = self.keys(record.key)
        until = 0 if record.expires_at is None else int(_micros(record.expires_at)) // 1000
        version = (record.attempt, _micros(record.updated_at))
        return _Op(
            _is_one,
            _evalsha(_CACHE_FILL, (name, f"{name}:fill", index), token, _pack(record), *version, until, self.ttl_ms),
        )

    def uncache(self, thread_id: str, keys: Sequence[CallKey]) -> _Op[int]:
        """Remove the entries of ``keys`` (all of ``thread_id``) and their fill tokens (a write racing this is
        then refused)."""
        names = [name for key in keys for name in (self.keys(key)[0], f"{self.keys(key)[0]}:fill")]
        return _Op(int, _evalsha(_CACHE_PURGE, [self.index(thread_id), *names], *names))

    def uncache_listed(self, thread_id: str, names: Sequence[str]) -> _Op[int]:
        """Take ``names`` (members of the thread's index) out of it, deleting those that are this key space's
        keys of the thread: a foreign name someone put in the index is never deleted."""
        index = self.index(thread_id)
        own = [name for name in names if name.startswith(f"{index}:")]
        return _Op(int, _evalsha(_CACHE_PURGE, [index, *own], *names))

    # listing and purging, a batch at a time

    def members(self, thread_id: str, count: int) -> _Op[list[str]]:
        """Up to ``count`` record keys of the thread's index (all of them for 0)."""
        return _Op(lambda names: [_text(n) for n in names], ("ZRANGE", self.index(thread_id), 0, count - 1))

    def purge(self, thread_id: str, names: Sequence[str]) -> _Op[int]:
        """Delete these records of the thread and their index entries; returns how many existed."""
        return _Op(int, _evalsha(_PURGE, [self.index(thread_id), *names]))

    def read(self, names: Sequence[str]) -> _Op[list[Record]]:
        """The records stored under these key names (foreign and vanished keys left out)."""
        found = [(key, name) for name in names if (key := self.call_key(name)) is not None]

        def parse(replies: list[Any]) -> list[Record]:
            return [_unpack(key, reply) for (key, _), reply in zip(found, replies, strict=True) if reply is not None]

        return _Op(parse, batch=[("GET", name) for _, name in found])


# --- connections ------------------------------------------------------------------------------

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
_CLUSTERS = (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)
_ASYNC_CLIENTS = (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)
#: The client classes, by (asynchronous, cluster).
_FLAVOURS: dict[tuple[bool, bool], Any] = {
    (False, False): redis.Redis,
    (False, True): redis.cluster.RedisCluster,
    (True, False): redis.asyncio.Redis,
    (True, True): redis.asyncio.cluster.RedisCluster,
}

#: What ``RedisLedger`` takes: a URL or a client of either flavour, single server or cluster.
RedisClient = redis.Redis | redis.asyncio.Redis | redis.cluster.RedisCluster | redis.asyncio.cluster.RedisCluster


def _flag(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


# The ledger's own URL options; redis-py's (``socket_timeout``, ``db``, ...) stay in the URL.
_LEDGER_OPTIONS: dict[str, Any] = {
    "prefix": str,
    "ttl": float,
    "connect_timeout": float,
    "io_timeout": float,
    "cluster": _flag,
}
_DRIVER_OPTIONS = frozenset(redis.connection.URL_QUERY_ARGUMENT_PARSERS) | frozenset(_PORTABLE_SETTINGS)

_AUTH_FIX = "Fix the username or password in the Redis URL (or the client's credentials)."
_ACL_FIX = (
    "Grant the Redis user the commands the ledger uses (EVALSHA, SCRIPT LOAD, GET, ZRANGE, SCAN) on the ledger's "
    "key prefix, or use a user that has them."
)
_RESPONSE_FIX = (
    "Redis refused a command: check that the server is Redis 6.2 or later with scripting enabled and that no "
    "other program writes keys under the ledger's prefix."
)
_FORMAT_FIX = (
    "A key under the ledger's prefix is not a record of this version (records written by an older replaysafe "
    "were hashes): delete those keys, or give the ledger a new prefix."
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
        redis.exceptions.SlotNotCoveredError,  # a cluster resharding or failing over
        redis.exceptions.MasterDownError,
        redis.exceptions.ReadOnlyError,  # a replica during a failover
        redis.exceptions.OutOfMemoryError,
        ConnectionError,
        TimeoutError,
    )
    if isinstance(exc, transient):
        return LedgerFault(True, TRANSIENT_FIX)
    foreign = isinstance(exc, redis.ResponseError) and ("WRONGTYPE" in str(exc) or "replaysafe-format" in str(exc))
    if isinstance(exc, RecordFormatError) or foreign:
        return LedgerFault(False, _FORMAT_FIX)
    if isinstance(exc, redis.ResponseError):
        return LedgerFault(False, _RESPONSE_FIX)
    return LedgerFault(False, "A bug or a misconfiguration: check the ledger's URL and options.")


def _once(*, asynchronous: bool = False) -> Any:
    """redis-py's retry for the clients we create: one immediate retry on a fresh connection.

    It replaces a pooled connection that the server closed (a restart) before the
    client noticed. More waiting is the ledger's ``RetryPolicy``'s to decide.
    """
    return (redis.asyncio.retry.Retry if asynchronous else Retry)(NoBackoff(), 1)


def _connection_settings(client: Any) -> dict[str, Any]:
    """The settings a client's connections are made with."""
    if isinstance(client, redis.cluster.RedisCluster):
        return dict(client.nodes_manager.connection_kwargs)
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        return dict(client.connection_kwargs)
    return dict(client.connection_pool.connection_kwargs)


def _twin(client: Any, *, asynchronous: bool) -> Any:
    """A new client of the given flavour that connects like ``client`` (a client we then own)."""
    settings = {k: v for k, v in _connection_settings(client).items() if k in _PORTABLE_SETTINGS}
    if isinstance(client, _CLUSTERS):
        node: Any = next(iter(client.nodes_manager.startup_nodes.values()))
        settings.update(host=node.host, port=node.port)
        settings.pop("db", None)
        return _FLAVOURS[asynchronous, True](**settings)
    pool = client.connection_pool
    classes = _ASYNC_CONNECTIONS if asynchronous else _SYNC_CONNECTIONS
    connection_class = pool.connection_class if isinstance(client, _ASYNC_CLIENTS) == asynchronous else None
    connection_class = connection_class or classes.get(pool.connection_class)
    if connection_class is None:
        raise TypeError(
            f"RedisLedger cannot open a {'asyncio' if asynchronous else 'sync'} connection like "
            f"{pool.connection_class.__name__}: pass a redis:// URL instead of a client"
        )
    pool_class = redis.asyncio.ConnectionPool if asynchronous else redis.ConnectionPool
    # The retry goes to the pool, whose connections carry it: a client given a pool ignores its own.
    retry = _once(asynchronous=asynchronous)
    return _FLAVOURS[asynchronous, False](
        connection_pool=pool_class(connection_class=connection_class, retry=retry, **settings)
    )


def _warn_if_unbounded(client: Any) -> None:
    """A client passed in is the caller's: say once if it can wait forever on a stalled server."""
    if isinstance(client, _CLUSTERS):
        socket_timeout = _connection_settings(client).get("socket_timeout")
    else:
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


class RedisLedger(StoredLedger):
    """A ledger in Redis, shared by every worker that points at it.

    ``url_or_client`` is a URL (``redis://host:6379/0``, ``rediss://``,
    ``unix://``) or a client: ``redis.Redis``, ``redis.asyncio.Redis``, or for a
    Redis Cluster ``redis.cluster.RedisCluster`` / ``redis.asyncio.RedisCluster``.
    A client passed in is shared and never closed by ``close()``; the other flavour
    (``.aio`` for a sync client, and the reverse) connects with the same settings.
    For a cluster by URL, pass ``cluster=True`` (or ``?cluster=true``) and the URL
    of any of its nodes. With ``ttl`` (seconds), completed and failed records
    expire natively.

    Clients the ledger creates wait ``connect_timeout`` seconds to connect and
    ``io_timeout`` for any answer (redis-py's ``socket_connect_timeout`` and
    ``socket_timeout``), so a stalled server gives a ``LedgerError``, not a hang.
    Both may also be URL options; a client passed in keeps its own settings.

    With a single server, the ledger's commands run on connections it holds, made with
    the client's connection class and settings, one per caller at a time (a client's
    own pool and its ``max_connections`` are left to the application); a cluster
    client's commands go through the client, which routes them by slot.
    """

    transient_errors: tuple[type[BaseException], ...] = (
        redis.ConnectionError,
        redis.TimeoutError,
        redis.BusyLoadingError,
        redis.exceptions.TryAgainError,
        ConnectionError,
        TimeoutError,
    )
    #: Seconds to wait for a connection, and for any one answer.
    connect_timeout: float
    io_timeout: float
    #: How long a finished record is kept; ``None``: forever.
    ttl: dt.timedelta | None
    #: Whether the client is a Redis Cluster client.
    cluster: bool
    _ops: _Operations

    def __init__(
        self,
        url_or_client: str | RedisClient,
        *,
        prefix: str | None = None,
        ttl: float | None = None,
        connect_timeout: float | None = None,
        io_timeout: float | None = None,
        cluster: bool | None = None,
        retry: RetryPolicy | None = None,
        signing_key: SigningKey | None = None,
    ) -> None:
        super().__init__(retry=retry, signing_key=signing_key)
        if isinstance(url_or_client, str):
            url_or_client, from_url = split_url_options(url_or_client, _LEDGER_OPTIONS, _DRIVER_OPTIONS, "RedisLedger")
            prefix, ttl, connect_timeout, io_timeout, cluster = given_first(
                from_url,
                prefix=prefix,
                ttl=ttl,
                connect_timeout=connect_timeout,
                io_timeout=io_timeout,
                cluster=cluster,
            )
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
        self._ops = _Operations(prefix, self.ttl)
        self._url: str | None = None
        #: The sync client in use, the asyncio client given (if any), and whether we made the sync one.
        self._client: Any = None
        self._shared_aio: Any = None
        self._owns_client = True
        if isinstance(url_or_client, str):
            self._url = url_or_client
            self.cluster = bool(cluster)
        elif isinstance(url_or_client, (redis.Redis, redis.cluster.RedisCluster)):
            self._client = url_or_client
            self._owns_client = False
        elif isinstance(url_or_client, _ASYNC_CLIENTS):
            self._shared_aio = url_or_client
        else:
            raise TypeError(
                f"RedisLedger takes a redis:// URL or a redis.Redis / redis.asyncio.Redis / RedisCluster client, "
                f"not {type(url_or_client).__name__}"
            )
        if self._url is None:
            self.cluster = isinstance(url_or_client, _CLUSTERS)
            if cluster is not None and cluster != self.cluster:
                raise ValueError(f"cluster={cluster} does not match the client given ({type(url_or_client).__name__})")
            _warn_if_unbounded(url_or_client)
        #: ``_commands``: the held connections of the sync client (or the client), made on first use.
        self._held: Any = None
        self._held_lock = threading.Lock()
        self._aio_redis: _AsyncRedisLedger | None = None
        # Clients a forked child inherited: kept, never used or closed (the parent's sockets).
        self._orphans: list[Any] = []
        forget_in_forked_child(self)

    def __repr__(self) -> str:
        return f"RedisLedger({self._where()}, prefix={self.prefix!r})"

    def _where(self) -> str:
        if self._url is not None:  # the host and path: after the userinfo's last '@' (a '#' in a password too)
            scheme, sep, rest = self._url.partition("://")
            return repr(f"{scheme}{sep}{rest.rpartition('@')[2].partition('?')[0].partition('#')[0]}")
        return "<client>"

    # --- connections -------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The sync client (``redis.Redis`` or ``redis.cluster.RedisCluster``), connected on first use."""
        if self._client is None:
            self._client = self._new_client(asynchronous=False)
            self._owns_client = True
        return self._client

    def _new_client(self, *, asynchronous: bool) -> Any:
        if self._url is not None:
            flavour = _FLAVOURS[asynchronous, self.cluster]
            # A cluster client retries on its own (it must follow the slots as they move).
            retry = {} if self.cluster else {"retry": _once(asynchronous=asynchronous)}
            return flavour.from_url(self._url, **retry, **self._socket_settings())
        return _twin(self._shared_aio if self._shared_aio is not None else self._client, asynchronous=asynchronous)

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

    @property
    def _commands(self) -> Any:
        """Where the runner sends commands: the held connections of a single-server client, or the client."""
        held = self._held
        if held is None:
            with self._held_lock:  # two first commands at once: one set of held connections
                held = self._held
                if held is None:
                    client = self.client
                    held = self._held = _Held(client) if _Held.fits(client) else client
        return held

    def _run(self, op: _Op[_T]) -> _T:
        """The sync runner: one command (or one pipelined batch), one reply, parsed once."""
        commands = self._commands
        try:
            return op.parse(op.send(commands))
        except redis.exceptions.NoScriptError as missing:  # a new, restarted or failed-over server: load, then again
            _load_scripts(commands)
            with _after_reload(missing):
                return op.parse(op.send(commands))

    @property
    def aio(self) -> AsyncLedger:
        if self._aio_redis is None:
            self._aio_redis = _AsyncRedisLedger(self)
        return self._aio_redis

    def close(self) -> None:
        """Close the connections this ledger opened; a client passed in is left open."""
        if self._aio_redis is not None:
            self._aio_redis.close()
        if isinstance(self._held, _Held):
            self._held.close()
        self._held = None
        if self._client is not None and self._owns_client:
            if self.cluster:
                # RedisCluster.close() gives each node's connection back to its pool and
                # leaves them open (redis-py 8): disconnect every node's pool.
                for node in self._client.get_nodes():
                    if node.redis_connection is not None:
                        node.redis_connection.connection_pool.disconnect()
            else:
                self._client.connection_pool.disconnect()
            self._client.close()
            self._client = None
        super().close()

    def _forget_parent(self) -> None:
        """In a forked child: connect afresh. A socket shared with the parent would mix
        the two processes' commands and replies."""
        self._held_lock = threading.Lock()  # a fork may copy it held by another thread
        if self._held is not None:
            self._orphans.append(self._held)
            self._held = None
        if self._client is not None and self._owns_client:
            self._orphans.append(self._client)
            self._client = None
        if self._shared_aio is not None:
            # The application's asyncio client is the parent's too: use a twin of it.
            self._orphans.append(self._shared_aio)
            self._shared_aio = _twin(self._shared_aio, asynchronous=True)
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

    # --- the protocol (``StoredLedger``): each operation built once (``_Operations``), run here

    def purge_thread(self, thread_id: str) -> int:
        """Delete every record of one thread, a batch at a time; returns how many."""
        deleted = 0
        while names := self._run(self._ops.members(thread_id, _BATCH)):
            deleted += self._run(self._ops.purge(thread_id, names))
        return deleted

    def records(self, *, thread_id: str | None = None) -> Iterator[Record]:
        """Every record (of one thread), oldest first."""
        if thread_id is not None:
            names = self._run(self._ops.members(thread_id, 0))
        else:
            # The prefix holds no glob character (checked in __init__); a cluster client scans every primary.
            names = [_text(n) for n in self.client.scan_iter(match=f"{self.prefix}:{{*}}:*", count=_BATCH)]
        found: list[Record] = []
        for start in range(0, len(names), _BATCH):
            batch: list[Record] = self._run(self._ops.read(names[start : start + _BATCH]))
            found += batch
        return iter(sorted(found, key=lambda r: r.created_at))


class _AsyncRedisLedger(AsyncStoredLedger):
    """``RedisLedger.aio`` on ``redis.asyncio``: a client per event loop (its connections belong to that loop)."""

    _ops: _Operations

    def __init__(self, ledger: RedisLedger) -> None:
        self._ledger = ledger
        self._ops = ledger._ops
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = weakref.WeakKeyDictionary()

    def _client(self) -> Any:
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is None:
            shared = self._ledger._shared_aio
            client = shared if shared is not None else self._ledger._new_client(asynchronous=True)
            entry = self._clients[loop] = _LoopClient(client, owned=shared is None)
            entry.watch(loop)
        return entry.commands

    async def _run(self, op: _Op[_T]) -> _T:
        """The async runner: ``RedisLedger._run`` on this loop's client."""
        client = self._client()
        if self._ledger.cluster:  # redis-py's asyncio cluster client: commands racing its start-up can fail
            await client.initialize()
        try:
            return op.parse(await op.send(client))
        except redis.exceptions.NoScriptError as missing:
            await asyncio.gather(*_load_scripts(client))
            with _after_reload(missing):
                return op.parse(await op.send(client))

    def _forget_parent_connections(self) -> None:
        self._ledger._orphans += self._clients.values()
        self._clients = weakref.WeakKeyDictionary()

    async def aclose(self) -> None:
        entry = self._clients.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry.aclose()

    def close(self) -> None:
        for loop, entry in list(self._clients.items()):
            entry.close(loop)
        self._clients.clear()


class _LoopClient:
    """An asyncio client on one event loop and the connections held for it, closed before the loop ends
    (the client only if the ledger made it: an application's client is left open).

    Its sockets belong to the loop; once the loop is closed they cannot be closed
    cleanly. ``asyncio.run()`` and other runners finalize async generators
    (``loop.shutdown_asyncgens()``) just before closing the loop, so a generator
    parked on the loop is the hook that closes the client in time.
    """

    def __init__(self, client: Any, *, owned: bool) -> None:
        self.client = client
        self._owned = owned
        #: Where the runner sends commands: held connections of a single-server client, or the client.
        self.commands: Any = _AsyncHeld(client) if _Held.fits(client) else client
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
        if isinstance(self.commands, _AsyncHeld):
            await self.commands.aclose()
        if not self._owned:
            return
        if isinstance(self.client, redis.asyncio.cluster.RedisCluster):
            await self.client.aclose()
        else:
            await self.client.aclose(close_connection_pool=True)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close from sync code: now if the loop is idle, soon if it runs; a closed loop already did."""
        if loop.is_closed():
            return
        if loop.is_running():
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            if here is loop:
                self._keep(loop.create_task(self.aclose()))
            else:  # a loop running in another thread: only a thread-safe hand-over wakes it
                asyncio.run_coroutine_threadsafe(self.aclose(), loop)
        else:
            loop.run_until_complete(self.aclose())
