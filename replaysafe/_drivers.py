"""The drivers: perform the effects the replay protocol yields, sync or async.

This is the only code that differs between sync and async; every decision is in
``_core``. Each driver is a loop: take the next effect, perform it, send back its
outcome (or throw its exception back in).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # CPython's C half of the signal module
import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
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
    Replay,
    Run,
    RunTool,
    Sleep,
    Takeover,
    ToolExit,
    ToolSpec,
    begin,
    settle_error,
    settle_result,
)
from ._errors import LedgerError, ReplaySafeError, ToolTimeoutError, describe
from ._events import logger
from ._leases import Lease
from ._pending import pending_writes
from ._records import Status
from ._renewer import new_lease, renewer, start_renewing
from ._sealing import Sealer
from ._threads import ForkSafePool
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


# --- running a sync tool under its deadline ---------------------------------------------


class _Deadline(BaseException):
    """Raised inside a sync tool by SIGALRM at its deadline (a BaseException, so that a
    tool's ``except Exception`` does not swallow it)."""


def _timeout_error(spec: ToolSpec, run: Run, *, still_running: bool) -> ToolTimeoutError:
    assert run.timeout is not None
    then = (
        "It still runs in a worker thread and records its result if it finishes."
        if still_running
        else "It was interrupted."
    )
    return ToolTimeoutError(
        f"{describe(spec.name, run.call.key)} passed its {run.timeout:g}s deadline (attempt {run.call.attempt}). "
        f"{then} The call is in doubt: a replay applies the in-doubt policy.",
        timeout=run.timeout,
        still_running=still_running,
        tool_name=spec.name,
        key=run.call.key,
    )


_HAS_ALARM = hasattr(signal, "setitimer")
# The C functions below ``signal.signal``/``getsignal``: the Python wrappers convert to and
# from enums on every call, which costs more than the timer itself.
_set_handler: Any = getattr(_signal, "signal", None)
_get_handler: Any = getattr(_signal, "getsignal", None)


def _alarm_is_ours_to_use() -> bool:
    """SIGALRM interrupts a tool cheaply, but only the main thread gets signals, and only
    when nobody else uses SIGALRM or its timer."""
    if not _HAS_ALARM or threading.get_ident() != threading.main_thread().ident:
        return False
    handler = _get_handler(signal.SIGALRM)
    if handler is _on_alarm:
        return True
    if handler in (signal.SIG_DFL, None) and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0):
        # Installed once and left in place (installing it for every call would cost more
        # than the timer): it acts only while a tool runs, and is the default otherwise.
        _set_handler(signal.SIGALRM, _on_alarm)
        return True
    return False


#: True while a tool body runs under our timer (only the main thread arms it).
_armed = False


def _on_alarm(signum: int, frame: Any) -> None:
    if _armed:
        raise _Deadline
    # Not our alarm: do what SIGALRM does without us (end the process).
    _set_handler(signal.SIGALRM, _signal.SIG_DFL)
    signal.raise_signal(signal.SIGALRM)


def _run_with_alarm(spec: ToolSpec, run: Run, wrapped: Callable[..., Any]) -> Any:
    global _armed
    assert run.timeout is not None
    try:
        # Armed around the tool body only, never around ledger I/O.
        _armed = True
        signal.setitimer(signal.ITIMER_REAL, run.timeout)
        try:
            return wrapped(*run.call.args, **run.call.kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            _armed = False
    except _Deadline:
        raise _timeout_error(spec, run, still_running=False) from None


# Idle threads are reused; a tool running past its deadline holds one until it ends.
_worker_pool = ForkSafePool(max_workers=256, thread_name_prefix="replaysafe-tool")


def _run_in_worker(
    spec: ToolSpec, scope: CallScope, run: Run, wrapped: Callable[..., Any], ledger: Ledger, lease: Lease | None
) -> Any:
    context = contextvars.copy_context()  # carries current_call() into the worker
    future = _worker_pool.get().submit(context.run, wrapped, *run.call.args, **run.call.kwargs)
    # The tool may outlive its deadline in the worker: its lease is kept until it ends.
    future.add_done_callback(lambda _: renewer.remove(lease))
    try:
        return future.result(timeout=run.timeout)
    except concurrent.futures.TimeoutError:
        future.add_done_callback(lambda done: _record_late(spec, scope, run, done, ledger))
        raise _timeout_error(spec, run, still_running=True) from None


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
        if run.timeout is not None and not _alarm_is_ours_to_use():
            return _run_in_worker(spec, scope, run, wrapped, ledger, lease)  # ends the lease itself
        try:
            if run.timeout is None:
                return wrapped(*run.call.args, **run.call.kwargs)
            return _run_with_alarm(spec, run, wrapped)
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
        return await _await_with_timeout(spec, run, wrapped(*run.call.args, **run.call.kwargs))
    finally:
        _current.reset(token)
        if renewing is not None:
            renewing.cancel()


async def _await_with_timeout(spec: ToolSpec, run: Run, awaitable: Any) -> Any:
    assert run.timeout is not None
    if sys.version_info >= (3, 11):
        # Only this context manager's expiry is our timeout; a TimeoutError the tool raises is its own.
        scope = asyncio.timeout(run.timeout)
        try:
            async with scope:
                return await awaitable
        except TimeoutError:
            if scope.expired():
                raise _timeout_error(spec, run, still_running=False) from None
            raise
    started = time.monotonic()  # pragma: no cover - Python 3.10
    try:  # pragma: no cover
        return await asyncio.wait_for(awaitable, run.timeout)
    except asyncio.TimeoutError:  # pragma: no cover
        if time.monotonic() - started >= run.timeout:
            raise _timeout_error(spec, run, still_running=False) from None
        raise


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


# --- streaming tools: chunks flow to the caller between the two phases ------------------


def _past(run: Run) -> bool:
    return run.timeout is not None and time.monotonic() - run.started > run.timeout


def _leased(source: Iterator[Any], lease: Lease | None) -> Generator[Any, None, None]:
    """``source``'s chunks, with the call's lease renewed from the first chunk until the
    stream ends or is closed (the consumer's time between chunks included)."""
    renewer.add(lease)
    try:
        yield from source
    finally:
        renewer.remove(lease)


async def _aleased(source: AsyncGenerator[Any, None], lease: Lease | None) -> AsyncGenerator[Any, None]:
    """``_leased`` for async streams: a renewal task in this loop."""
    renewing = start_renewing(lease)
    try:
        async for chunk in source:
            yield chunk
    finally:
        if renewing is not None:
            renewing.cancel()
        await source.aclose()


def stream(
    spec: ToolSpec, plan: Plan, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Iterator[Any]:
    """Yield a streaming tool's chunks as they come; record them all when it ends.

    Its deadline is checked between chunks: a stream cannot be interrupted mid-chunk.
    """
    ledger, scope, digest, timeout, sealer = plan
    decision = drive(begin(spec, scope, digest, args, kwargs, timeout, sealer), ledger, spec, scope, wrapped)
    if isinstance(decision, Replay):
        yield from decision.value
        return
    run = decision
    source = _leased(wrapped(*args, **kwargs), _lease(spec, run, ledger))
    chunks: list[Any] = []
    try:
        while True:
            # current_call() is set around each step only: the consumer runs in between.
            token = _current.set(run.call)
            try:
                chunk = next(source)
            except StopIteration:
                break
            finally:
                _current.reset(token)
            chunks.append(chunk)
            if _past(run):
                raise _timeout_error(spec, run, still_running=False)
            yield chunk
    except BaseException as exc:
        source.close()
        drive(settle_error(spec, scope, run, exc), ledger, spec, scope, wrapped)
        raise
    drive(settle_result(spec, run, chunks), ledger, spec, scope, wrapped)


async def astream(
    spec: ToolSpec, plan: Plan, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> AsyncIterator[Any]:
    """``stream`` for async generator tools."""
    ledger, scope, digest, timeout, sealer = plan
    decision = await adrive(begin(spec, scope, digest, args, kwargs, timeout, sealer), ledger, spec, scope, wrapped)
    if isinstance(decision, Replay):
        for chunk in decision.value:
            yield chunk
        return
    run = decision
    source = _aleased(wrapped(*args, **kwargs), _lease(spec, run, ledger))
    chunks: list[Any] = []
    try:
        while True:
            token = _current.set(run.call)
            try:
                chunk = await source.__anext__()
            except StopAsyncIteration:
                break
            finally:
                _current.reset(token)
            chunks.append(chunk)
            if _past(run):
                raise _timeout_error(spec, run, still_running=False)
            yield chunk
    except BaseException as exc:
        await source.aclose()
        await adrive(settle_error(spec, scope, run, exc), ledger, spec, scope, wrapped)
        raise
    await adrive(settle_result(spec, run, chunks), ledger, spec, scope, wrapped)
