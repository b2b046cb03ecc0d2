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
import inspect
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator
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
    ToolSpec,
    begin,
    settle_error,
    settle_result,
)
from ._errors import LedgerError, ReplaySafeError, ToolTimeoutError, describe
from ._events import logger
from ._pending import pending_writes
from ._records import Status
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
        f"({type(cause).__name__}: {_first_line(cause)}). {fault.fix}"
        + (" The write will be tried again in the background until the ledger answers." if deferred else ""),
        tool_name=spec.name,
        key=effect.key,
        transient=transient,
        permanent=not transient,
    )


def _first_line(exc: BaseException) -> str:
    """The driver's own message; its further lines quote the statement (PostgreSQL's LINE/HINT)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


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


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _worker_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            # Idle threads are reused; a tool running past its deadline holds one until it ends.
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="replaysafe-tool")
        return _pool


def _run_in_worker(spec: ToolSpec, scope: CallScope, run: Run, wrapped: Callable[..., Any], ledger: Ledger) -> Any:
    context = contextvars.copy_context()  # carries current_call() into the worker
    future = _worker_pool().submit(context.run, wrapped, *run.call.args, **run.call.kwargs)
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


def _invoke(spec: ToolSpec, scope: CallScope, run: Run, wrapped: Callable[..., Any], ledger: Ledger) -> Any:
    token = _current.set(run.call)
    try:
        if run.timeout is None:
            return wrapped(*run.call.args, **run.call.kwargs)
        if _alarm_is_ours_to_use():
            return _run_with_alarm(spec, run, wrapped)
        return _run_in_worker(spec, scope, run, wrapped, ledger)
    finally:
        _current.reset(token)


async def _ainvoke(spec: ToolSpec, run: Run, wrapped: Callable[..., Any]) -> Any:
    token = _current.set(run.call)
    try:
        if run.timeout is None:
            return await wrapped(*run.call.args, **run.call.kwargs)
        return await _await_with_timeout(spec, run, wrapped(*run.call.args, **run.call.kwargs))
    finally:
        _current.reset(token)


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


def drive(
    protocol: Generator[Effect, Any, Any], ledger: Ledger, spec: ToolSpec, scope: CallScope, wrapped: Callable[..., Any]
) -> Any:
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = protocol.send(send) if error is None else protocol.throw(error)
        except StopIteration as stop:
            return stop.value
        send = error = None
        try:
            if isinstance(effect, RunTool):
                send = _invoke(spec, scope, effect.run, wrapped, ledger)
            elif isinstance(effect, Sleep):
                time.sleep(effect.seconds)
            elif isinstance(effect, Reconcile):
                send = effect.reconciler(effect.call)
                if inspect.isawaitable(send):
                    raise TypeError(f"{spec.name} is a sync tool: its in_doubt reconciler must be sync too")
            else:
                send = _perform_ledger_op(effect, ledger, spec)
        except BaseException as exc:
            error = exc


async def adrive(
    protocol: Generator[Effect, Any, Any], ledger: Ledger, spec: ToolSpec, scope: CallScope, wrapped: Callable[..., Any]
) -> Any:
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = protocol.send(send) if error is None else protocol.throw(error)
        except StopIteration as stop:
            return stop.value
        send = error = None
        try:
            if isinstance(effect, RunTool):
                send = await _ainvoke(spec, effect.run, wrapped)
            elif isinstance(effect, Sleep):
                await asyncio.sleep(effect.seconds)
            elif isinstance(effect, Reconcile):
                send = effect.reconciler(effect.call)
                if inspect.isawaitable(send):
                    send = await send
            else:
                send = await _aperform_ledger_op(effect, ledger, spec)
        except BaseException as exc:
            error = exc


# --- streaming tools: chunks flow to the caller between the two phases ------------------


def _past(run: Run) -> bool:
    return run.timeout is not None and time.monotonic() - run.started > run.timeout


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
    source = wrapped(*args, **kwargs)
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
    source = wrapped(*args, **kwargs)
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
