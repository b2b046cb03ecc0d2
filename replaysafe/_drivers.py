"""The drivers: perform the effects the replay protocol yields, sync or async.

This is the only code that differs between sync and async; every decision is in
``_core``. Each driver is a loop: take the next effect, perform it, send back its
outcome (or throw its exception back in).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import sqlite3
import time
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

import tenacity

from ._context import CallScope, _current
from ._core import (
    Claim,
    Complete,
    Effect,
    LedgerOp,
    Reconcile,
    Release,
    Run,
    RunTool,
    Sleep,
    Takeover,
    ToolExit,
    ToolSpec,
    settle_error,
    settle_result,
)
from ._deadlines import alarm_is_ours_to_use, await_with_timeout, run_in_worker, run_with_alarm
from ._errors import LedgerError, ReplaySafeError, describe
from ._events import logger
from ._leases import Lease
from ._pending import pending_writes
from ._records import Status
from ._renewer import new_lease, renewer, start_renewing
from ._sealing import Sealer
from .ledgers import Ledger
from .ledgers._protocol import diagnose, is_transient


class Plan(NamedTuple):
    """Everything a protected call needs besides its arguments."""

    ledger: Ledger
    scope: CallScope
    digest: str
    timeout: float | None
    sealer: Sealer | None = None


# --- ledger operations, retried when the error is transient --------------------------


def _ledger_error(effect: LedgerOp, spec: ToolSpec, ledger: Ledger, exc: BaseException) -> LedgerError:
    """The error a failed operation raises into the protocol; a finishing write is kept for later."""
    fault = diagnose(ledger, exc)
    transient = fault.transient
    cleanup = _cleanup_for(effect) if transient else None
    if cleanup is not None:
        pending_writes.defer(cleanup, ledger, spec.name)
    deferred = cleanup is effect
    operation = type(effect).__name__.lower()
    # A driver's own error, not SQLAlchemy's wrapper, whose text would quote the
    # statement's parameters: those hold the tool's result.
    cause = getattr(exc, "orig", None) or exc
    return LedgerError(
        f"ledger {operation} failed for {describe(spec.name, effect.key)} on {ledger!r} "
        f"({_reason(cause)}). {fault.fix}"
        + (" The write will be tried again in the background until the ledger answers." if deferred else ""),
        tool_name=spec.name,
        key=effect.key,
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


def _held_after(effect: LedgerOp, outcome: Any) -> Complete | Release | None:
    """What to undo if the call stops now, ``effect`` having returned ``outcome``: the
    claim (or takeover) it holds; ``None`` once a finishing write has landed."""
    if isinstance(effect, Claim):
        record = outcome.record
        ours = outcome.claimed or (record.status is Status.RUNNING and record.owner == effect.owner)
        return Release(effect.key, effect.owner) if ours else None
    if isinstance(effect, Takeover):
        return _cleanup_for(effect) if outcome is not None else None
    return None


def _after_interrupted(effect: LedgerOp, ledger: Ledger, tool_name: str, op: asyncio.Future[Any]) -> None:
    """A shielded ledger operation whose caller was cancelled has ended: undo or finish it."""
    if op.cancelled():
        cleanup: Complete | Release | None = _cleanup_for(effect)  # its outcome is unknown
    elif op.exception() is not None:
        cleanup = None  # a LedgerError: kept for later already when it was transient
    else:
        cleanup = _held_after(effect, op.result())
    if cleanup is not None:
        pending_writes.defer(cleanup, ledger, tool_name)


def _cleanup_for(effect: LedgerOp) -> Complete | Release:
    """What to write once the ledger answers again, after ``effect`` failed in transit.

    A finishing write is itself written later. A claim or takeover whose answer was
    lost may still have landed under this call's owner token: undo it (fenced, so
    it does nothing if it did not land), or the call would look running forever.
    """
    if isinstance(effect, Claim):
        return Release(effect.key, effect.owner)
    if isinstance(effect, Takeover):
        return Complete(effect.key, effect.owner, Status.IN_DOUBT, None, effect.now)
    return effect


def _retrying_kwargs(ledger: Ledger) -> dict[str, Any]:
    """Bounded retry of transient errors; the first attempt was made already."""
    return {
        "stop": tenacity.stop_after_attempt(max(ledger.retry.attempts - 1, 1))
        | tenacity.stop_after_delay(ledger.retry.max_seconds),
        "wait": tenacity.wait_random_exponential(multiplier=0.01, max=0.1),
        "retry": tenacity.retry_if_exception(lambda exc: is_transient(ledger, exc)),
        "reraise": True,
    }


def _perform_ledger_op(effect: LedgerOp, ledger: Ledger, spec: ToolSpec) -> Any:
    try:
        return effect.on(ledger)
    except Exception as exc:
        if ledger.retry.attempts <= 1 or not is_transient(ledger, exc):
            raise _ledger_error(effect, spec, ledger, exc) from exc
    try:
        for attempt in tenacity.Retrying(**_retrying_kwargs(ledger)):
            with attempt:
                return effect.on(ledger)
    except Exception as exc:
        raise _ledger_error(effect, spec, ledger, exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover


async def _aperform_shielded(effect: LedgerOp, ledger: Ledger, spec: ToolSpec) -> Any:
    """``_aperform_ledger_op``, shielded from the caller's cancellation.

    A command already sent (or a worker thread already running it) cannot be
    recalled: cancelling its await would leave a claim landed, or a finishing write
    half done, with nobody to undo it. So it runs to its end in a task of its own;
    a cancelled caller leaves at once, and the operation's outcome is undone or
    written later (``_after_interrupted``) once it is known.
    """
    if not getattr(ledger, "blocking_io", True):
        return await _aperform_ledger_op(effect, ledger, spec)  # never suspends: nothing to shield
    op = asyncio.ensure_future(_aperform_ledger_op(effect, ledger, spec))
    try:
        return await asyncio.shield(op)
    except asyncio.CancelledError:
        op.add_done_callback(functools.partial(_after_interrupted, effect, ledger, spec.name))
        raise


async def _aperform_ledger_op(effect: LedgerOp, ledger: Ledger, spec: ToolSpec) -> Any:
    aio = ledger.aio
    try:
        return await effect.on(aio)
    except Exception as exc:
        if ledger.retry.attempts <= 1 or not is_transient(ledger, exc):
            raise _ledger_error(effect, spec, ledger, exc) from exc
    try:
        async for attempt in tenacity.AsyncRetrying(**_retrying_kwargs(ledger)):
            with attempt:
                return await effect.on(aio)
    except Exception as exc:
        raise _ledger_error(effect, spec, ledger, exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover


# --- running the tool ----------------------------------------------------------------


def _record_late(
    spec: ToolSpec, scope: CallScope, run: Run, done: concurrent.futures.Future[Any], ledger: Ledger
) -> None:
    """A sync tool finished after its deadline: record its outcome (a late completion)."""
    error = done.exception()
    protocol = settle_result(spec, run, done.result()) if error is None else settle_error(spec, scope, run, error)
    try:
        drive(protocol, ledger, spec, scope, _no_tool)
    except ReplaySafeError:
        logger.exception("the late completion of %s could not be recorded", describe(spec.name, run.call.key))


def _no_tool(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - settling never runs a tool
    raise AssertionError("settling a call never runs its tool")


def _lease(spec: ToolSpec, run: Run, ledger: Ledger) -> Lease | None:
    """The lease to keep alive while the tool runs (none for an unprotected run)."""
    return new_lease(ledger, spec.name, run.call.key, run.owner, spec.lease_for(run.timeout))


def _invoke(spec: ToolSpec, scope: CallScope, run: Run, wrapped: Callable[..., Any], ledger: Ledger) -> Any:
    token = _current.set(run.call)
    lease = _lease(spec, run, ledger)
    renewer.add(lease)  # renewed by the renewer thread, never by this one
    try:
        if run.timeout is not None and not alarm_is_ours_to_use():
            # The tool may outlive its deadline in the worker: its lease is kept until it ends.
            return run_in_worker(
                spec.name,
                run,
                wrapped,
                on_end=lambda: renewer.remove(lease),
                on_late=lambda done: _record_late(spec, scope, run, done, ledger),
            )
        try:
            if run.timeout is None:
                return wrapped(*run.call.args, **run.call.kwargs)
            return run_with_alarm(spec.name, run, wrapped)
        finally:
            renewer.remove(lease)
    finally:
        _current.reset(token)


async def _ainvoke(spec: ToolSpec, run: Run, wrapped: Callable[..., Any], ledger: Ledger) -> Any:
    token = _current.set(run.call)
    renewing = start_renewing(_lease(spec, run, ledger))  # a task in this loop, while the tool runs
    try:
        if run.timeout is None:
            return await wrapped(*run.call.args, **run.call.kwargs)
        return await await_with_timeout(spec.name, run, wrapped(*run.call.args, **run.call.kwargs))
    finally:
        _current.reset(token)
        if renewing is not None:
            renewing.cancel()


# --- the drive loops --------------------------------------------------------------------


# What is held, and undone if the call ends by an exception before its tool runs or
# while a finishing write is in flight (an interrupt, SystemExit): the claim is
# released, a takeover put back in doubt, a finishing write kept for the pending-write
# recovery. Each is fenced by owner, so it does nothing if the operation never landed.
# Once the tool has run, ``settle_error`` owns the outcome.


def _thrown(exc: BaseException) -> BaseException:
    # The protocol's own GeneratorExit means "closed": a tool's is carried as ToolExit.
    return ToolExit(exc) if isinstance(exc, GeneratorExit) else exc


def _ended(exc: BaseException, held: Complete | Release | None, ledger: Ledger, spec: ToolSpec) -> BaseException:
    if held is not None:
        pending_writes.defer(held, ledger, spec.name)
    return exc.original if isinstance(exc, ToolExit) else exc


def drive(
    protocol: Generator[Effect, Any, Any], ledger: Ledger, spec: ToolSpec, scope: CallScope, wrapped: Callable[..., Any]
) -> Any:
    send: Any = None
    error: BaseException | None = None
    held: Complete | Release | None = None
    try:
        while True:
            try:
                effect = protocol.send(send) if error is None else protocol.throw(error)
            except StopIteration as stop:
                return stop.value
            send = error = None
            try:
                if isinstance(effect, RunTool):
                    held = None
                    send = _invoke(spec, scope, effect.run, wrapped, ledger)
                elif isinstance(effect, Sleep):
                    time.sleep(effect.seconds)
                elif isinstance(effect, Reconcile):
                    send = effect.reconciler(effect.call)
                    if inspect.isawaitable(send):
                        raise TypeError(f"{spec.name} is a sync tool: its in_doubt reconciler must be sync too")
                else:
                    held = _cleanup_for(effect)  # until it returns, whether it landed is unknown
                    send = _perform_ledger_op(effect, ledger, spec)
                    held = _held_after(effect, send)
            except LedgerError as exc:
                held, error = None, exc  # a transient failure's cleanup is kept already
            except BaseException as exc:
                error = _thrown(exc)
    except BaseException as exc:
        original = _ended(exc, held, ledger, spec)
        if original is exc:
            raise
        raise original from None


async def adrive(
    protocol: Generator[Effect, Any, Any], ledger: Ledger, spec: ToolSpec, scope: CallScope, wrapped: Callable[..., Any]
) -> Any:
    send: Any = None
    error: BaseException | None = None
    held: Complete | Release | None = None
    try:
        while True:
            try:
                effect = protocol.send(send) if error is None else protocol.throw(error)
            except StopIteration as stop:
                return stop.value
            send = error = None
            try:
                if isinstance(effect, RunTool):
                    held = None
                    send = await _ainvoke(spec, effect.run, wrapped, ledger)
                elif isinstance(effect, Sleep):
                    await asyncio.sleep(effect.seconds)
                elif isinstance(effect, Reconcile):
                    send = effect.reconciler(effect.call)
                    if inspect.isawaitable(send):
                        send = await send
                else:
                    held = _cleanup_for(effect)
                    try:
                        send = await _aperform_shielded(effect, ledger, spec)
                    except asyncio.CancelledError:
                        held = None  # the shielded operation undoes itself once it ends
                        raise
                    held = _held_after(effect, send)
            except LedgerError as exc:
                held, error = None, exc
            except BaseException as exc:
                error = _thrown(exc)
    except BaseException as exc:
        original = _ended(exc, held, ledger, spec)
        if original is exc:
            raise
        raise original from None
