"""Running a tool under its deadline: SIGALRM or a worker thread for sync tools, a timeout scope for async ones.

Only the mechanics live here; what a missed deadline means for the call (in doubt,
or recorded late) is the protocol's decision in ``_core``.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # CPython's C half of the signal module
import asyncio
import concurrent.futures
import contextvars
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from ._core import Run
from ._errors import ToolTimeoutError, describe
from ._threads import ForkSafePool


class _Deadline(BaseException):
    """Raised inside a sync tool by SIGALRM at its deadline (a BaseException, so that a
    tool's ``except Exception`` does not swallow it)."""


def timeout_error(tool_name: str, run: Run, *, still_running: bool) -> ToolTimeoutError:
    assert run.timeout is not None
    then = (
        "It still runs in a worker thread and records its result if it finishes."
        if still_running
        else "It was interrupted."
    )
    return ToolTimeoutError(
        f"{describe(tool_name, run.call.key)} passed its {run.timeout:g}s deadline (attempt {run.call.attempt}). "
        f"{then} The call is in doubt: a replay applies the in-doubt policy.",
        timeout=run.timeout,
        still_running=still_running,
        tool_name=tool_name,
        key=run.call.key,
    )


_HAS_ALARM = hasattr(signal, "setitimer")
# The C functions below ``signal.signal``/``getsignal``: the Python wrappers convert to and
# from enums on every call, which costs more than the timer itself.
_set_handler: Any = getattr(_signal, "signal", None)
_get_handler: Any = getattr(_signal, "getsignal", None)


def alarm_is_ours_to_use() -> bool:
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


def run_with_alarm(tool_name: str, run: Run, wrapped: Callable[..., Any]) -> Any:
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
        raise timeout_error(tool_name, run, still_running=False) from None


# Idle threads are reused; a tool running past its deadline holds one until it ends.
_worker_pool = ForkSafePool(max_workers=256, thread_name_prefix="replaysafe-tool")


def run_in_worker(
    tool_name: str,
    run: Run,
    wrapped: Callable[..., Any],
    on_end: Callable[[], None],
    on_late: Callable[[concurrent.futures.Future[Any]], None],
) -> Any:
    """Run a sync tool in a worker thread, waiting up to its deadline. ``on_end`` runs when
    it ends, whenever that is; ``on_late`` when it ends after its deadline."""
    context = contextvars.copy_context()  # carries current_call() into the worker
    future = _worker_pool.get().submit(context.run, wrapped, *run.call.args, **run.call.kwargs)
    future.add_done_callback(lambda _: on_end())
    try:
        return future.result(timeout=run.timeout)
    except concurrent.futures.TimeoutError:
        future.add_done_callback(on_late)
        raise timeout_error(tool_name, run, still_running=True) from None


async def await_with_timeout(tool_name: str, run: Run, awaitable: Any) -> Any:
    assert run.timeout is not None
    if sys.version_info >= (3, 11):
        # Only this context manager's expiry is our timeout; a TimeoutError the tool raises is its own.
        scope = asyncio.timeout(run.timeout)
        try:
            async with scope:
                return await awaitable
        except TimeoutError:
            if scope.expired():
                raise timeout_error(tool_name, run, still_running=False) from None
            raise
    # Python 3.10: the same scope by hand. Not asyncio.wait_for: it runs the tool in a task of its own, out of
    # which a SystemExit or KeyboardInterrupt escapes to the event loop instead of to the call.
    task = asyncio.current_task()  # pragma: no cover - Python 3.10
    assert task is not None  # pragma: no cover
    expired = False  # pragma: no cover

    def expire() -> None:  # pragma: no cover
        nonlocal expired
        expired = True
        task.cancel()

    deadline = asyncio.get_running_loop().call_later(run.timeout, expire)  # pragma: no cover
    try:  # pragma: no cover
        return await awaitable
    except asyncio.CancelledError:  # pragma: no cover
        if expired:
            raise timeout_error(tool_name, run, still_running=False) from None
        raise
    finally:  # pragma: no cover
        deadline.cancel()


def past(run: Run) -> bool:
    """Whether a run has passed its deadline (a stream checks between chunks), on the clock its
    start was read from: the host's, which the drivers hand in."""
    return run.timeout is not None and run.host.monotonic() - run.started > run.timeout
