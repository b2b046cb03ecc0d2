"""Making the protocol's ledger operations: retried when the error is transient, failures explained.

``perform`` and ``aperform`` make one operation (``_calls``) on a ``Target`` (a ledger
and the tool it is for: a driver's ``Driving``, a ``Lease``), try it again when the error
is transient (``_retry``), and turn a failure into the ``LedgerError`` the protocol gets;
what a failure leaves to undo is kept for the background (``_pending``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any, Protocol

from . import _crash_points, _metrics
from ._calls import CALLS
from ._core import LedgerOp, undo_for
from ._errors import LedgerError, describe
from ._events import logger
from ._pending import pending_writes
from ._retry import ledger_retrying
from .ledgers._protocol import diagnose, is_transient


class Target(Protocol):
    """Where an operation is made: the ledger, and the tool it is made for (for messages)."""

    @property
    def ledger(self) -> Any: ...
    @property
    def tool_name(self) -> str: ...


def perform(op: LedgerOp, target: Target) -> Any:
    """Make ``op`` on ``target.ledger``; a ``LedgerError`` when it fails for good.

    The hot path is one frame above the ``Ledger`` method: the first attempt is made
    here, and only a failure enters the retry machinery (``_failed``).
    """
    call = CALLS[type(op)]
    if _metrics.observers is not None or _crash_points.watcher is not None:
        return _measured(op, target, call)
    try:
        return call(target.ledger, op)
    except BaseException as exc:
        return _failed(op, target, call, exc)


async def aperform(op: LedgerOp, target: Target) -> Any:
    """``perform`` on the ledger's async operations (``.aio``)."""
    if _metrics.observers is None and _crash_points.watcher is None:
        return await _aperform(op, target.ledger, target.tool_name)
    _crash_points.before(op, target.tool_name)
    start, ok = time.perf_counter(), False
    try:
        result = await _aperform(op, target.ledger, target.tool_name)
        ok = True
    finally:
        _observed(op, target.ledger, time.perf_counter() - start, ok)
    _crash_points.after(op, target.tool_name)
    return result


def _measured(op: LedgerOp, target: Target, call: Callable[[Any, Any], Any]) -> Any:
    """``perform``'s path while someone watches: the observers time it, a crash test's child sees its points."""
    _crash_points.before(op, target.tool_name)
    start, ok = time.perf_counter(), False
    try:
        try:
            result = call(target.ledger, op)
        except BaseException as exc:
            result = _failed(op, target, call, exc)
        ok = True
    finally:
        _observed(op, target.ledger, time.perf_counter() - start, ok)
    _crash_points.after(op, target.tool_name)
    return result


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` stops its caller as an interrupt does: any ``BaseException`` that is not an
    ``Exception`` (``KeyboardInterrupt``, ``SystemExit``, an application's own; the async driver
    handles a cancellation before it asks). An operation it ends has an unknown outcome, undone (or
    made) later, and no ``LedgerError`` is made of it. The one rule for both drivers."""
    return not isinstance(exc, Exception)


def _failed(op: LedgerOp, target: Target, call: Callable[[Any, Any], Any], exc: BaseException) -> Any:
    """The first attempt of ``op`` raised ``exc``: try again when it is transient, or give up."""
    ledger, tool_name = target.ledger, target.tool_name
    try:
        if isinstance(exc, Exception):  # not interrupted: tried again if it is transient
            return _retrying(op, ledger, tool_name, exc, asynchronous=False)(call, ledger, op)
        raise exc
    except BaseException as error:
        if interrupted(error):  # the first attempt, or a retry or its backoff (a LedgerError is kept already)
            # Interrupted mid-operation: whether it landed is unknown, so it is undone (or made) later.
            _defer(undo_for(op), ledger, tool_name)
        raise


def _observed(op: LedgerOp, ledger: Any, seconds: float, ok: bool) -> None:
    kind, operation = _metrics.ledger_kind(ledger), type(op).__name__.lower()
    for observer in _metrics.observers or ():
        try:
            observer(kind, operation, seconds, ok)
        except Exception:  # a metrics failure never fails the call
            logger.exception("replaysafe ledger observer %r failed", observer)


async def _aperform(op: LedgerOp, ledger: Any, tool_name: str) -> Any:
    call, aio = CALLS[type(op)], ledger.aio
    try:
        return await call(aio, op)
    except Exception as exc:
        # A coroutine function, so that tenacity awaits each attempt (it tells by the callable).
        return await _retrying(op, ledger, tool_name, exc, asynchronous=True)(_awaited, call, aio, op)


async def _awaited(call: Any, aio: Any, op: LedgerOp) -> Any:
    return await call(aio, op)


def _retrying(op: LedgerOp, ledger: Any, tool_name: str, failure: Exception, *, asynchronous: bool) -> Any:
    """What tries ``op`` again after its first ``failure``; raises at once when that cannot help."""

    if ledger.retry.attempts <= 1 or not is_transient(ledger, failure):
        raise ledger_error(op, ledger, tool_name, failure) from failure

    def give_up(error: BaseException) -> LedgerError:
        # The first attempt failed transiently, so it may have landed, whatever the last error says.
        return ledger_error(op, ledger, tool_name, error, landed_maybe=True)

    return ledger_retrying(ledger, lambda error: is_transient(ledger, error), give_up, asynchronous=asynchronous)


def _defer(write: Any, ledger: Any, tool_name: str) -> None:
    if write is not None:
        pending_writes.defer(write, ledger, tool_name)


def ledger_error(
    op: LedgerOp, ledger: Any, tool_name: str, exc: BaseException, *, landed_maybe: bool = False
) -> LedgerError:
    """The error a failed operation raises into the protocol. What it may have done is undone, and a
    finishing write kept, for later: when ``exc`` is transient (its outcome is unknown), or when an
    earlier attempt was (``landed_maybe``, or ``exc`` raised from a transient error), whatever
    ``exc`` says."""
    fault = diagnose(ledger, exc)
    transient = fault.transient
    # An error raised from a transient one: the ledger's client tried the operation again within
    # this attempt (redis-py does, on a dropped connection), and the first try may have landed.
    raised_from = exc.__cause__
    landed_maybe = landed_maybe or (raised_from is not None and is_transient(ledger, raised_from))
    undo = undo_for(op) if transient or landed_maybe else None
    _defer(undo, ledger, tool_name)
    deferred = undo is op
    operation = type(op).__name__.lower()
    # A driver's own error, not SQLAlchemy's wrapper, whose text would quote the
    # statement's parameters: those hold the tool's result.
    cause = getattr(exc, "orig", None) or exc
    return LedgerError(
        f"ledger {operation} failed for {describe(tool_name, op.key)} on {ledger!r} "
        f"({_reason(cause)}). {fault.fix}"
        + (" The write will be tried again in the background until the ledger takes it." if deferred else ""),
        tool_name=tool_name,
        key=op.key,
        transient=transient,
        permanent=not transient,
    )


def _reason(cause: BaseException) -> str:
    """A driver error as a message may quote it: its text only when it cannot hold a value.

    Connection and file errors, SQLite's and Redis's connection errors name no
    parameter; a PostgreSQL error's primary message does not either, except for data
    errors (SQLSTATE class 22), which quote the offending value. Anything else: its type.
    """
    name = type(cause).__name__
    sqlstate = getattr(cause, "sqlstate", None)
    if isinstance(sqlstate, str):
        primary = getattr(getattr(cause, "diag", None), "message_primary", None)
        if primary and not sqlstate.startswith("22"):
            return f"{name} {sqlstate}: {primary}"
        return f"{name} {sqlstate}"
    module = type(cause).__module__
    if (
        isinstance(cause, (OSError, sqlite3.Error))
        or (module.startswith("redis") and name in ("ConnectionError", "TimeoutError", "BusyLoadingError"))
        or (module.startswith("psycopg") and name == "OperationalError")  # no SQLSTATE: a connection failure
    ):
        return f"{name}: {str(cause).strip()}"
    return name
