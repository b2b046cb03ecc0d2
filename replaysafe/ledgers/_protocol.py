"""The ledger protocol: the few atomic operations the replay protocol needs.

A backend implements ``Ledger`` (sync) and offers an ``AsyncLedger`` as ``.aio``.
Backends without async I/O get one for free from ``LedgerBase`` (a worker thread
per operation), so adding a backend is one small module.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Iterator, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Concatenate, NamedTuple, ParamSpec, Protocol, TypeVar, cast, runtime_checkable

from .._codec import Serializer
from .._constants import LEDGER_RETRY_ATTEMPTS, LEDGER_RETRY_MAX_SECONDS
from .._errors import LedgerError
from .._records import CallKey, ClaimResult, Record, Status, Undone
from .._sealing import Sealer
from .._threads import ForkSafePool

_T = TypeVar("_T")
_P = ParamSpec("_P")

#: One signing key, or a list whose first key signs and all of which are accepted.
SigningKey = str | bytes | Sequence[str | bytes]

#: ``resolve()`` was given no ``result=``.
NO_RESULT: Any = object()


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a ledger operation that failed with a transient error is tried again."""

    attempts: int = LEDGER_RETRY_ATTEMPTS
    max_seconds: float = LEDGER_RETRY_MAX_SECONDS


@dataclasses.dataclass(frozen=True, slots=True)
class LedgerFault:
    """What a ledger error means: whether trying again can help, and the operator's next step.

    Transient faults (a refused or reset connection, a timeout, a locked file) follow
    ``on_ledger_error``. Permanent ones (a bad URL, a missing table, a denied
    permission, failed authentication) raise whatever it says: retrying cannot fix
    them, and running every call unprotected would hide them.
    """

    transient: bool
    fix: str


#: The next step for a fault a ledger does not know more about.
TRANSIENT_FIX = "Check that the ledger's server is reachable and answers within its timeouts."
PERMANENT_FIX = "Check the ledger's URL, credentials and table; ledger.check() tries a round trip."


def diagnose(ledger: Ledger, exc: BaseException) -> LedgerFault:
    """How ``ledger`` classifies ``exc``: its own ``diagnose()``, else its ``transient_errors``."""
    method = getattr(ledger, "diagnose", None)
    if method is not None:
        fault: LedgerFault = method(exc)
        return fault
    if isinstance(exc, ledger.transient_errors):
        return LedgerFault(True, TRANSIENT_FIX)
    return LedgerFault(False, PERMANENT_FIX)


def is_transient(ledger: Ledger, exc: BaseException) -> bool:
    """Whether trying ``exc``'s operation again may succeed."""
    return diagnose(ledger, exc).transient


#: The thread id of ``check()``'s probe records: no framework makes up this id, and
#: each probe adds a random suffix, so a probe never meets a real call or another probe.
PROBE_THREAD_PREFIX = "replaysafe-probe-"


@runtime_checkable
class Ledger(Protocol):
    """Where protected calls are claimed and recorded.

    Every write is atomic and fenced by ``owner``: a caller can only complete or
    release a record it owns, so a late finisher cannot overwrite another's record.
    """

    #: Exceptions worth trying again (a dropped connection, a locked database).
    transient_errors: tuple[type[BaseException], ...]
    retry: RetryPolicy
    #: Seals finished records and checks them on replay; ``None`` when not signing.
    sealer: Sealer | None

    @property
    def aio(self) -> AsyncLedger:
        """The same ledger with ``async`` operations."""
        ...

    def claim(
        self, key: CallKey, *, tool_name: str, args_digest: str, owner: str, now: datetime, lease_expires_at: datetime
    ) -> ClaimResult:
        """Atomically create a ``running`` record owned by ``owner``, or return the one there."""
        ...

    def takeover(
        self,
        record: Record,
        *,
        owner: str,
        now: datetime,
        lease_expires_at: datetime,
        status: Status = Status.RUNNING,
        result: str | None = None,
        args_digest: str | None = None,
    ) -> Record | None:
        """Replace ``record`` (still as read) by a ``running`` one for ``owner``, attempt + 1.

        ``status``, ``result`` and ``args_digest`` (``None``: the record's) are the new record's: a
        ``paused`` one with the call's approval state, when an approver decides or a run spends an
        approval (docs/approvals.md). It has no expiry. Returns ``None`` when the stored record changed
        since it was read.
        """
        ...

    def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: datetime) -> bool:
        """Finish the call ``owner`` claimed; ``False`` when ``owner`` no longer holds it."""
        ...

    def release(self, key: CallKey, *, owner: str) -> bool:
        """Delete the ``running`` record ``owner`` holds, so the call may run again."""
        ...

    def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool:
        """Move the lease of the ``running`` record ``owner`` holds to ``lease_expires_at``.

        Fenced like ``complete``: ``False``, and nothing changed, when the record is
        gone, finished or held by another owner. Called while the tool runs.
        """
        ...

    def get(self, key: CallKey) -> Record | None: ...

    def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        """The records among ``keys`` that exist, in one round trip."""
        ...

    def delete(self, key: CallKey) -> bool: ...

    def purge_thread(self, thread_id: str) -> int:
        """Delete every record of one thread; returns how many."""
        ...

    def records(self, *, thread_id: str | None = None) -> Iterator[Record]:
        """Every record (of one thread), oldest first."""
        ...

    def resolve(
        self,
        key: CallKey,
        *,
        result: Any = ...,
        rerun: bool = False,
        serializer: Serializer | None = None,
        force: bool = False,
    ) -> Record | None:
        """Settle an in-doubt call by hand: record ``result``, or ``rerun=True`` to let it run again."""
        ...

    def undo(self, key: CallKey, *, force: bool = False) -> list[Undone]:
        """Run the compensation (``@replay_safe(undo=...)``) of a completed call, and of its steps, once each."""
        ...

    def check(self) -> None:
        """Claim, complete, read and delete a probe record; ``LedgerError`` naming the fix if a step fails."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class AsyncLedger(Protocol):
    """``Ledger``'s operations as coroutines (only those the replay protocol needs)."""

    async def claim(
        self, key: CallKey, *, tool_name: str, args_digest: str, owner: str, now: datetime, lease_expires_at: datetime
    ) -> ClaimResult: ...

    async def takeover(
        self,
        record: Record,
        *,
        owner: str,
        now: datetime,
        lease_expires_at: datetime,
        status: Status = Status.RUNNING,
        result: str | None = None,
        args_digest: str | None = None,
    ) -> Record | None: ...

    async def complete(
        self, key: CallKey, *, owner: str, status: Status, result: str | None, now: datetime
    ) -> bool: ...

    async def release(self, key: CallKey, *, owner: str) -> bool: ...

    async def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool: ...

    async def get(self, key: CallKey) -> Record | None: ...

    async def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]: ...


#: The threads blocking ledger operations of async callers run in (sized like asyncio's default).
_offload_pool = ForkSafePool(max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="replaysafe-ledger")


async def _ended(running: concurrent.futures.Future[Any]) -> None:
    """Wait until ``running`` has ended (or was cancelled before it started), through any further
    cancellation; the caller raises its own cancellation afterwards."""
    waiter = asyncio.wrap_future(running)
    while not waiter.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([waiter])
    if not waiter.cancelled():
        waiter.exception()  # read: its caller leaves cancelled, whatever the operation raised


class OffloadedAsyncLedger:
    """An ``AsyncLedger`` over a sync one: blocking I/O runs in a worker thread.

    With ``blocking=False`` (a ledger that never waits, like the memory one) the
    operations run inline, which is cheaper than a thread hop.
    """

    __slots__ = ("_blocking", "_ledger")

    def __init__(self, ledger: Ledger, *, blocking: bool = True) -> None:
        self._ledger = ledger
        self._blocking = blocking

    async def _run(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._blocking:
            return method(*args, **kwargs)
        # Our own pool rather than the loop's default executor: a forked child gets a
        # new one (see _offload_pool), even when it goes on with a loop of its parent.
        call = functools.partial(contextvars.copy_context().run, method, *args, **kwargs)
        running = _offload_pool.get().submit(call)
        try:
            return await asyncio.wrap_future(running)
        except asyncio.CancelledError:
            # A thread cannot be stopped: cancelled while its operation runs, this leaves only once
            # the operation has ended. What the cancellation undoes (a claim's release) then comes
            # after it; made first, it would find nothing, and the claim would land after it.
            await _ended(running)
            raise

    async def claim(self, key: CallKey, **kwargs: Any) -> ClaimResult:
        result: ClaimResult = await self._run(self._ledger.claim, key, **kwargs)
        return result

    async def takeover(self, record: Record, **kwargs: Any) -> Record | None:
        result: Record | None = await self._run(self._ledger.takeover, record, **kwargs)
        return result

    async def complete(self, key: CallKey, **kwargs: Any) -> bool:
        result: bool = await self._run(self._ledger.complete, key, **kwargs)
        return result

    async def release(self, key: CallKey, *, owner: str) -> bool:
        result: bool = await self._run(self._ledger.release, key, owner=owner)
        return result

    async def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool:
        result: bool = await self._run(self._ledger.renew, key, owner=owner, lease_expires_at=lease_expires_at)
        return result

    async def get(self, key: CallKey) -> Record | None:
        result: Record | None = await self._run(self._ledger.get, key)
        return result

    async def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        result: dict[CallKey, Record] = await self._run(self._ledger.get_many, list(keys))
        return result


class Handed(NamedTuple):
    """What the drivers hand the ledger package when replaysafe is imported (``hand_in``): the
    protocol decides, a ledger only stores, and the ledger package never imports the protocol."""

    #: How ``LedgerBase.resolve`` settles a call: the protocol's ``resolve``, driven on the ledger.
    resolve: Callable[..., Record | None]
    #: The wall clock (timezone-aware UTC) and this process's owner token, which a ``check()``
    #: probe claims with: the ledger reads neither itself.
    now: Callable[[], datetime]
    owner_token: Callable[[], str]


_handed: Handed | None = None


def hand_in(handed: Handed) -> None:
    global _handed
    _handed = handed


def _from_drivers() -> Handed:
    if _handed is None:  # pragma: no cover - importing replaysafe hands them in
        raise RuntimeError("replaysafe's drivers are not loaded: import replaysafe first")
    return _handed


#: How ``LedgerBase.undo`` runs a call's compensations: ``replaysafe._undo.undo``, handed in when replaysafe is
#: imported (as ``resolve`` is, apart from it: ``use_clocks`` hands the drivers' part in again).
_undo: Callable[[Any, CallKey, bool], list[Undone]] | None = None


def hand_in_undo(undo: Callable[[Any, CallKey, bool], list[Undone]]) -> None:
    global _undo
    _undo = undo


def handed_now() -> datetime:
    """The wall clock the drivers hand in, for a ledger that hides records whose ttl ran out."""
    return _from_drivers().now()


#: The ledgers of this process that hold a lock or connections: a forked child makes each
#: forget what it shares with the parent.
_ledgers: weakref.WeakSet[LedgerBase] = weakref.WeakSet()


def forget_in_forked_child(ledger: LedgerBase) -> None:
    """Have a forked child call ``ledger._forget_parent()``; a backend calls it at the end of its
    ``__init__``, once what that forgets is built."""
    _ledgers.add(ledger)


def _after_fork_in_child() -> None:
    for ledger in list(_ledgers):
        # One ledger's failure must not leave the others on the parent's sockets. (A ledger
        # forked while another thread was still building it is never used here: that thread
        # does not exist in the child.)
        try:
            ledger._forget_parent()
        except Exception as exc:  # reported; the other ledgers still forget
            logging.getLogger("replaysafe").warning(
                "a forked child could not reset a %s (%s); do not use it in this process",
                type(ledger).__name__,
                type(exc).__name__,
            )


os.register_at_fork(after_in_child=_after_fork_in_child)


class LedgerBase:
    """What every ledger shares: context management, lazy open, retry settings, resolve."""

    transient_errors: tuple[type[BaseException], ...] = ()
    #: Whether operations wait on I/O (then ``.aio`` runs them in a worker thread). A ledger that
    #: says ``False`` runs its operations inline on the event loop, retries included: it must
    #: never fail transiently (a retry would sleep on the loop).
    blocking_io = True
    #: How transient errors are retried.
    retry: RetryPolicy
    #: Seals records when a signing key is set; ``None`` otherwise.
    sealer: Sealer | None

    def __init__(self, *, retry: RetryPolicy | None = None, signing_key: SigningKey | None = None) -> None:
        self.retry = retry or RetryPolicy()
        self.sealer = Sealer.from_setting(signing_key)
        self._aio: AsyncLedger | None = None
        #: How many times ``close()`` ran: a write made in the background after it closes again.
        self._closes = 0

    def _forget_parent(self) -> None:
        """In a forked child: replace what the parent's threads may hold (a lock) and what its
        sockets are (connections), which the child must never use. A backend that holds any says
        how, and registers with ``forget_in_forked_child``."""

    @property
    def aio(self) -> AsyncLedger:
        if self._aio is None:
            self._aio = OffloadedAsyncLedger(self, blocking=self.blocking_io)  # type: ignore[arg-type]
        return self._aio

    def close(self) -> None:
        """Release the ledger's resources; it reopens lazily if used again.

        A backend's ``close()`` calls this one last."""
        self._closes += 1

    def resolve(
        self: Any,
        key: CallKey,
        *,
        result: Any = NO_RESULT,
        rerun: bool = False,
        serializer: Serializer | None = None,
        force: bool = False,
    ) -> Record | None:
        """Settle an in-doubt (or paused) call by hand, after checking with the provider.

        ``result=...`` records it as the call's result (a replay returns it, the tool
        does not run); ``rerun=True`` removes the record, so the next replay runs the
        tool; a call decided on a human's answers (``approvals.approve(answer=...)``) is
        kept paused for a new decision instead, keeping their ids (on a signing ledger,
        only with its key). Returns the new record (``None`` after a removal). A call whose owner is
        still alive is refused unless ``force=True`` (its owner would then find its
        claim gone when it finishes, and report a duplicate execution).
        """
        return _from_drivers().resolve(self, key, result, rerun, serializer, force)

    def undo(self, key: CallKey, *, force: bool = False) -> list[Undone]:
        """Run the compensation of the completed call ``key`` (its ``@replay_safe(undo=...)``, registered in
        this process), once: recorded under a key of its own, so a second undo replays it. A call with steps
        has its steps' compensations run first, newest first, each once. A call running, paused or in doubt
        is refused unless ``force=True`` (the compensation is then handed ``None``); a failed one always
        (docs/approvals.md, Undo). ``await replaysafe.aundo(ledger, key)`` from async code.
        """
        if _undo is None:  # pragma: no cover - importing replaysafe hands it in
            raise RuntimeError("replaysafe's drivers are not loaded: import replaysafe first")
        return _undo(self, key, force)

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def diagnose(self, exc: BaseException) -> LedgerFault:
        """Whether ``exc`` is transient, and what fixes it; backends refine this."""
        if isinstance(exc, self.transient_errors):
            return LedgerFault(True, TRANSIENT_FIX)
        return LedgerFault(False, PERMANENT_FIX)

    def check(self) -> None:
        """A round trip on a probe record, for readiness probes: claim, complete, read, delete.

        Raises ``LedgerError`` naming the step that failed and the fix. The probe's
        thread id starts with ``replaysafe-probe-`` and ends with a random suffix.
        """
        probe, reply, error = _probe(self), None, None
        while (request := _next_step(probe, reply, error)) is not None:
            reply, error = _tried(self, *request)

    async def acheck(self) -> None:
        """``check()`` for async code, on ``.aio`` where it has the operation."""
        probe, reply, error = _probe(self), None, None
        while (request := _next_step(probe, reply, error)) is not None:
            reply, error = await _atried(self, *request)


class OperationBuilders(Protocol):
    """A backend's operations as data: each takes the arguments of the ``Ledger`` method of its
    name (``claim``: the record it stores) and returns what the backend's runners run (a statement
    or a command, and how its reply reads). No I/O: the sync and async runners share every one."""

    def claim(self, record: Record) -> Any:
        """Store ``record``, a first claim's (``Record.claimed``), unless a live one is there."""
        ...

    def takeover(
        self,
        record: Record,
        *,
        owner: str,
        now: datetime,
        lease_expires_at: datetime,
        status: Status = Status.RUNNING,
        result: str | None = None,
        args_digest: str | None = None,
    ) -> Any: ...

    def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: datetime) -> Any: ...

    def release(self, key: CallKey, *, owner: str) -> Any: ...

    def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> Any: ...

    def get(self, key: CallKey) -> Any: ...

    def get_many(self, keys: Iterable[CallKey]) -> Any: ...

    def delete(self, key: CallKey) -> Any: ...


class StoredLedger(LedgerBase):
    """The ledger operations, written once for every backend with operations as data: each
    builds the backend's operation (``_ops``) and runs it with the backend's sync runner
    (``_run``). ``AsyncStoredLedger`` runs the same bodies with the backend's async runner,
    so a body returns what ``_run`` returns, as is."""

    _ops: OperationBuilders

    def _run(self, op: Any) -> Any:
        """Run ``op`` and return what its reply reads as: the backend's sync runner."""
        raise NotImplementedError

    def claim(
        self, key: CallKey, *, tool_name: str, args_digest: str, owner: str, now: datetime, lease_expires_at: datetime
    ) -> ClaimResult:
        """Atomically create a ``running`` record owned by ``owner``, or return the one there."""
        record = Record.claimed(key, tool_name, args_digest, owner, now, lease_expires_at)
        result: ClaimResult = self._run(self._ops.claim(record))
        return result

    def takeover(
        self,
        record: Record,
        *,
        owner: str,
        now: datetime,
        lease_expires_at: datetime,
        status: Status = Status.RUNNING,
        result: str | None = None,
        args_digest: str | None = None,
    ) -> Record | None:
        """Replace ``record`` (still as read) by a ``running`` one for ``owner``, attempt + 1."""
        result_: Record | None = self._run(
            self._ops.takeover(
                record,
                owner=owner,
                now=now,
                lease_expires_at=lease_expires_at,
                status=status,
                result=result,
                args_digest=args_digest,
            )
        )
        return result_

    def complete(self, key: CallKey, *, owner: str, status: Status, result: str | None, now: datetime) -> bool:
        """Finish the call ``owner`` claimed (fenced); with a ttl, a finished record expires unless in doubt."""
        done: bool = self._run(self._ops.complete(key, owner=owner, status=status, result=result, now=now))
        return done

    def release(self, key: CallKey, *, owner: str) -> bool:
        """Delete the ``running`` record ``owner`` holds."""
        done: bool = self._run(self._ops.release(key, owner=owner))
        return done

    def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool:
        """Move the lease of the ``running`` record ``owner`` holds (fenced)."""
        done: bool = self._run(self._ops.renew(key, owner=owner, lease_expires_at=lease_expires_at))
        return done

    def get(self, key: CallKey) -> Record | None:
        """The record of ``key``, or ``None``."""
        result: Record | None = self._run(self._ops.get(key))
        return result

    def get_many(self, keys: Iterable[CallKey]) -> dict[CallKey, Record]:
        """The records among ``keys`` that exist, in one round trip."""
        result: dict[CallKey, Record] = self._run(self._ops.get_many(keys))
        return result

    def delete(self, key: CallKey) -> bool:
        """Delete the record of ``key``, whatever its state."""
        done: bool = self._run(self._ops.delete(key))
        return done


def _async(
    method: Callable[Concatenate[Any, _P], _T],
) -> Callable[Concatenate[AsyncStoredLedger, _P], Coroutine[Any, Any, _T]]:
    """The async form of a ``StoredLedger`` operation: its one body, run on the async ledger, whose
    runner returns a coroutine the body hands back as is (so a body never wraps what it runs)."""

    async def operation(self: AsyncStoredLedger, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return await cast("Awaitable[_T]", method(self, *args, **kwargs))

    operation.__name__ = operation.__qualname__ = method.__name__
    operation.__doc__ = method.__doc__
    return operation


class AsyncStoredLedger:
    """``StoredLedger``'s operations as coroutines, each made from the sync one (``_async``): the
    same body, the same operation built by ``_ops``, run by the backend's async runner (``_run``)."""

    _ops: OperationBuilders

    async def _run(self, op: Any) -> Any:
        """Run ``op`` and return what its reply reads as: the backend's async runner."""
        raise NotImplementedError

    claim = _async(StoredLedger.claim)
    takeover = _async(StoredLedger.takeover)
    complete = _async(StoredLedger.complete)
    release = _async(StoredLedger.release)
    renew = _async(StoredLedger.renew)
    get = _async(StoredLedger.get)
    get_many = _async(StoredLedger.get_many)


#: A probe's step: the ``Ledger`` operation, its arguments and keyword arguments.
ProbeStep = tuple[str, tuple[Any, ...], dict[str, Any]]


def _next_step(probe: Generator[ProbeStep, Any, None], reply: Any, error: LedgerError | None) -> ProbeStep | None:
    """The probe's next step, given the last one's reply or error; ``None`` once it passed."""
    try:
        return probe.send(reply) if error is None else probe.throw(error)
    except StopIteration:
        return None


def _tried(ledger: Any, step: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, LedgerError | None]:
    """A probe step on the ledger: its reply, or the ``LedgerError`` naming the step and the fix."""
    try:
        return getattr(ledger, step)(*args, **kwargs), None
    except Exception as exc:
        return None, _probe_error(ledger, step, exc)


async def _atried(
    ledger: Any, step: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, LedgerError | None]:
    """``_tried`` on ``.aio``; in a worker thread for what it lacks (``delete``)."""
    operation: Any = getattr(ledger.aio, step, None) or functools.partial(asyncio.to_thread, getattr(ledger, step))
    try:
        return await operation(*args, **kwargs), None
    except Exception as exc:
        return None, _probe_error(ledger, step, exc)


_PROBE_RESULT = '"replaysafe-probe"'


def _probe_error(ledger: Any, step: str, exc: BaseException) -> LedgerError:
    fault = diagnose(ledger, exc)
    cause = getattr(exc, "orig", None) or exc  # the driver's error, not SQLAlchemy's wrapper
    return LedgerError(
        f"ledger check failed at {step} on {ledger!r} ({type(cause).__name__}, "
        f"{'transient' if fault.transient else 'permanent'}). {fault.fix}",
        transient=fault.transient,
        permanent=not fault.transient,
    )


def _probe(ledger: Any) -> Generator[ProbeStep, Any, None]:
    """``check()``'s steps, shared by its sync and async forms: each yields (operation, args, kwargs).

    It claims as this process's owner token, at the time, both handed in by the drivers."""
    handed = _from_drivers()
    key = CallKey(f"{PROBE_THREAD_PREFIX}{uuid.uuid4().hex}", "probe", "probe")
    owner = f"probe@{handed.owner_token()}"
    now = handed.now()
    claimed = yield (
        "claim",
        (key,),
        {
            "tool_name": "replaysafe.check",
            "args_digest": "0" * 64,
            "owner": owner,
            "now": now,
            "lease_expires_at": now,
        },
    )
    if not claimed.claimed:
        raise LedgerError(f"ledger check on {ledger!r}: the probe claim found a record already there; run it again")
    try:
        completed = yield (
            "complete",
            (key,),
            {
                "owner": owner,
                "status": Status.COMPLETED,
                "result": _PROBE_RESULT,
                "now": now,
            },
        )
        stored = (yield "get", (key,), {}) if completed else None
    except LedgerError:
        yield "delete", (key,), {}  # best effort: leave no probe behind
        raise
    deleted = yield "delete", (key,), {}
    if not completed:
        raise LedgerError(f"ledger check on {ledger!r}: the probe's completion was refused; run it again")
    if stored is None or stored.status is not Status.COMPLETED or stored.result != _PROBE_RESULT:
        raise LedgerError(
            f"ledger check on {ledger!r}: the probe record did not read back as written; check that the store "
            "keeps what it is given (no eviction, no proxy rewriting values)"
        )
    if not deleted:
        raise LedgerError(f"ledger check on {ledger!r}: the probe record could not be deleted")
