"""The drivers: perform the effects the replay protocol yields, sync or async.

This is the only code that differs between sync and async; every decision is in
``_core``. Each driver is one short loop: take the next effect, look up what performs
it, send back its outcome (or throw its exception back in). A ledger operation is
made by ``_operations``; the tool runs under its deadline (``_deadlines``) with its
lease kept alive (``_renewer``). An in-doubt call's reconciler, which answers in the
tool's place, has the lease kept alive too (it has no deadline of its own).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from datetime import datetime
from typing import Any, NamedTuple

from . import _renewer
from ._approvals import Approval
from ._clock import MACHINE, Clocks
from ._codec import JsonSerializer, Serializer
from ._constants import LEASE_MARGIN
from ._context import CallScope, _current
from ._core import (
    Claim,
    Complete,
    Effect,
    Get,
    Host,
    LedgerOp,
    Notify,
    Reconcile,
    Release,
    Renew,
    Run,
    Sleep,
    Takeover,
    ToolExit,
    ToolSpec,
    decide,
    held_after,
    report_late,
    request_decision,
    resolve,
    seconds,
    settle_error,
    settle_result,
    undo_for,
)
from ._deadlines import alarm_is_ours_to_use, await_with_timeout, run_in_worker, run_with_alarm
from ._errors import ReplaySafeError, describe
from ._events import emit, logger, wanted
from ._leases import Lease
from ._metrics import ledger_kind
from ._operations import aperform, interrupted, perform
from ._owners import owner_alive, owner_token
from ._pending import pending_writes
from ._records import CallKey, Record
from ._renewer import new_lease, renewer
from .ledgers import Ledger
from .ledgers._protocol import NO_RESULT, Handed, hand_in

#: The world as the protocol sees it: this machine's clocks and processes, the event sink.
#: (A test's stepped clock replaces the clocks: ``use_clocks``.)
HOST = Host(MACHINE.now, MACHINE.monotonic, owner_alive, emit, wanted)


class Driving(NamedTuple):
    """What the drivers need to perform one call's effects."""

    ledger: Ledger
    tool_name: str
    spec: ToolSpec | None = None
    scope: CallScope | None = None
    wrapped: Callable[..., Any] | None = None
    hard_deadline: bool = True


# --- the loops ------------------------------------------------------------------------


def _thrown(exc: BaseException) -> BaseException:
    # The protocol's own GeneratorExit means "closed": a tool's is carried as ToolExit.
    return ToolExit(exc) if isinstance(exc, GeneratorExit) else exc


def _returned(end: StopIteration | ToolExit) -> Any:
    """What the protocol returned (``end``: the StopIteration that ended it); or a tool's own
    GeneratorExit, which it raised (carried through the protocol as a ``ToolExit``)."""
    if isinstance(end, StopIteration):
        return end.value
    raise end.original from None


# Each loop resumes the protocol in its own frame (a helper would cost a call per effect);
# how the protocol ended is read once, outside the loop.


def drive(protocol: Generator[Effect, Any, Any], driving: Driving) -> Any:
    send, error = None, None
    try:
        while True:
            effect = protocol.send(send) if error is None else protocol.throw(error)
            try:
                send, error = _SYNC[type(effect)](effect, driving), None
            except BaseException as exc:
                send, error = None, _thrown(exc)
    except (StopIteration, ToolExit) as end:
        return _returned(end)


async def adrive(protocol: Generator[Effect, Any, Any], driving: Driving) -> Any:
    # A ledger that never waits (its .aio runs the same operations inline) has its operations
    # performed as the sync driver does: nothing to shield, no coroutine to make and await.
    inline = _INLINE if not getattr(driving.ledger, "blocking_io", True) else _NONE_INLINE
    send, error = None, None
    try:
        while True:
            effect = protocol.send(send) if error is None else protocol.throw(error)
            try:
                if type(effect) in inline:
                    send, error = perform(effect, driving), None  # type: ignore[arg-type]  # a LedgerOp: in _INLINE
                else:
                    send, error = await _ASYNC[type(effect)](effect, driving), None
            except BaseException as exc:
                send, error = None, _thrown(exc)
    except (StopIteration, ToolExit) as end:
        return _returned(end)


# --- sync effects -----------------------------------------------------------------------


def _sleep(effect: Sleep, driving: Driving) -> None:
    time.sleep(effect.seconds)


def _stepped_sleep(effect: Sleep, driving: Driving) -> None:
    """A pause under a stepped clock (``use_clocks``): the clock is stepped by it, nobody sleeps."""
    step = _clocks.step
    assert step is not None
    step(effect.seconds)


def _reconciler_lease(effect: Reconcile, driving: Driving) -> Lease | None:
    """The call's lease while its reconciler answers in the tool's place: renewed as a run's under the
    built-in timeout is, up to the deadline plus the margin (a reconciler has no deadline of its own
    to stop it), not at all when the claim's lease already reaches that far, and with no limit when
    the call has no timeout (timeouts turned off, or a step), as for a run."""
    return _lease(effect.run, driving, past_deadline=False)


def _asked(effect: Reconcile, driving: Driving) -> Any:
    """The reconciler's answer (an awaitable, for an async one), the call's lease renewed meanwhile
    by the renewer thread: a sync reconciler blocks its thread, an event loop's too."""
    lease = _reconciler_lease(effect, driving)
    # The reconciler runs outside every call: a step's would otherwise run as its parent, and its
    # requests would take the parent's HTTP key ordinals, shifting the keys of the parent's own.
    token = _current.set(None)
    try:
        if lease is not None:
            renewer.add(lease)
        return effect.reconciler(effect.call)
    finally:
        _current.reset(token)
        if lease is not None:
            renewer.remove(lease)


def _reconcile(effect: Reconcile, driving: Driving) -> Any:
    answer = _asked(effect, driving)
    if inspect.isawaitable(answer):
        if inspect.iscoroutine(answer):
            answer.close()  # never awaited: closed, so no "never awaited" warning follows the error
        raise TypeError(f"{driving.tool_name} is a sync tool: its in_doubt reconciler must be sync too")
    return answer


def _lease(run: Run, driving: Driving, *, past_deadline: bool = True) -> Lease | None:
    """The lease to keep alive while the tool runs (none for an unprotected run, nor when
    it is not to be renewed past the deadline and the claim's own lease already reaches it)."""
    if past_deadline or run.timeout is None:
        return new_lease(driving.ledger, driving.tool_name, run.call.key, run.owner, run.lease)
    reach = seconds(run.timeout + LEASE_MARGIN)
    if run.lease >= reach:
        return None
    return new_lease(
        driving.ledger, driving.tool_name, run.call.key, run.owner, run.lease, until=run.host.now() + reach
    )


def _invoke(run: Run, driving: Driving) -> Any:
    """Run a sync tool, with ``current_call()`` set and its lease kept alive.

    Under the built-in timeout (no hard deadline) it runs in the caller's thread, never
    interrupted. That timeout is kept by the lease instead: renewed up to the deadline plus
    the lease margin and no further (with the default lease, not at all), so past that another
    host may take the call over as in doubt. Whether the tool ended late, and what that says,
    is the protocol's (``report_late``). Only a timeout the user gave stops the tool at its
    deadline: by SIGALRM in the main thread, or by leaving it in a worker thread.
    """
    spec, wrapped = driving.spec, driving.wrapped
    assert spec is not None
    assert wrapped is not None
    call, hard = run.call, driving.hard_deadline
    token = _current.set(call)
    try:  # current_call() is reset last, whatever ends the run (an interrupt in the lease's handling too)
        lease = _lease(run, driving, past_deadline=hard)
        if lease is not None:
            renewer.add(lease)  # renewed by the renewer thread, never by this one
        try:
            if hard and run.timeout is not None:
                if not alarm_is_ours_to_use():
                    # The tool may outlive its deadline in the worker: its lease is kept until it ends.
                    kept, lease = lease, None
                    return run_in_worker(
                        spec.name,
                        run,
                        wrapped,
                        on_end=lambda: renewer.remove(kept),
                        on_late=lambda done: _record_late(run, done, driving),
                    )
                return run_with_alarm(spec.name, run, wrapped)
            return wrapped(*call.args, **call.kwargs)
        finally:
            if lease is not None:
                renewer.remove(lease)
            if not hard:
                report_late(spec, run)
    finally:
        _current.reset(token)


def _record_late(run: Run, done: concurrent.futures.Future[Any], driving: Driving) -> None:
    """A sync tool finished after its deadline: record its outcome (a late completion)."""
    spec, scope = driving.spec, driving.scope
    assert spec is not None
    assert scope is not None
    error = done.exception()
    protocol = settle_result(spec, run, done.result()) if error is None else settle_error(spec, scope, run, error)
    try:
        drive(protocol, driving)
    except ReplaySafeError:
        logger.exception("the late completion of %s could not be recorded", describe(spec.name, run.call.key))


def _told(effect: Notify) -> Any:
    """Hand the late result to the application's hook, outside every call (a protected call it makes is a
    call of its own, not a step); its failure is logged, never raised: the call's own outcome stands."""
    token = _current.set(None)
    try:
        return effect.hook(effect.late)
    except Exception:
        logger.exception("the on_late_result hook %s failed", getattr(effect.hook, "__qualname__", "of a tool"))
        return None
    finally:
        _current.reset(token)


def _notify(effect: Notify, driving: Driving) -> None:
    answer = _told(effect)
    if inspect.isawaitable(answer):
        if inspect.iscoroutine(answer):
            answer.close()  # never awaited: closed, so no "never awaited" warning follows the error
        logger.error("%s is a sync tool: its on_late_result hook must be sync too; it was not run", driving.tool_name)


#: Each effect's performer; a ledger operation is ``perform``'s directly (one frame above the ledger).
_SYNC: dict[type, Callable[[Any, Driving], Any]] = {
    Claim: perform,
    Takeover: perform,
    Complete: perform,
    Release: perform,
    Renew: perform,
    Get: perform,
    Sleep: _sleep,
    Reconcile: _reconcile,
    Notify: _notify,
    Run: _invoke,
}


# --- async effects ----------------------------------------------------------------------


_EAGER = sys.version_info >= (3, 12)
_INTERRUPTS = (KeyboardInterrupt, SystemExit)
#: What an operation's task returns when an interrupt ended it (handed to the caller): an unknown outcome.
_INTERRUPTED: Any = object()
#: Where a loop keeps the operations whose cancelled callers have left (``_kept_until_done``).
_KEPT = "_replaysafe_left_running"
#: The same, for a loop that takes no attributes of its own.
_kept_by_no_loop: set[asyncio.Future[Any]] = set()


async def _aledger_op(op: LedgerOp, driving: Driving) -> Any:
    """A ledger operation, shielded from the caller's cancellation.

    A command already sent (or a worker thread already running it) cannot be
    recalled: cancelling its await would leave a claim landed, or a finishing write
    half done, with nobody to undo it. So it runs to its end in a task of its own;
    a cancelled caller leaves at once, and the operation's outcome is undone or
    written later (``_after_interrupted``) once it is known. (``asyncio.shield`` would
    do the same, and hand the outcome over from a done callback: a loop turn later.)
    """
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[Any] = loop.create_future()
    task = _started(loop, _answering(op, driving, answer), answer)
    try:
        return await answer
    except asyncio.CancelledError:
        _undo_once_done(op, driving, task)
        interrupt = answer.exception() if answer.done() and not answer.cancelled() else None
        if interrupt is not None and interrupted(interrupt):
            raise interrupt from None  # handed over just before the cancel: the interrupt wins
        raise
    except BaseException as exc:
        if interrupted(exc):
            # Interrupted mid-operation (handed over by the task, or raised in this frame): the caller
            # stops here, so what the operation did is undone once its outcome is known, as the sync
            # driver's ``perform`` does; a claim that landed would otherwise stay running under a live owner.
            answer.cancel()  # nobody reads it now: a later failure of the operation is not left unread
            _undo_once_done(op, driving, task)
            raise
        if task.done() and not task.cancelled():  # it ended raising this same error: not to be logged as unread
            task.exception()
        raise


async def _answering(op: LedgerOp, driving: Driving, answer: asyncio.Future[Any]) -> Any:
    """``op``'s outcome, handed to ``answer`` the moment it is known (unless the caller left:
    ``answer`` is cancelled then). The task keeps it too, for ``_after_interrupted``."""
    try:
        result = await aperform(op, driving)
    except asyncio.CancelledError:
        answer.cancel()  # the operation itself was cancelled (the loop is closing): its outcome is unknown
        raise
    except _INTERRUPTS as exc:  # the two that asyncio would raise out of the loop; any other is set below
        if answer.done():
            raise
        # Raised by the caller's await instead, out of the loop as before: raised here, it would
        # leave this task's exception unread (and, started eagerly, come out of its constructor).
        answer.set_exception(exc)
        return _INTERRUPTED
    except BaseException as exc:
        if not answer.done():
            answer.set_exception(exc)
        raise
    if not answer.done():
        answer.set_result(result)
    return result


def _started(loop: asyncio.AbstractEventLoop, answering: Coroutine[Any, Any, Any], answer: asyncio.Future[Any]) -> Any:
    """The task of ``_answering``: started at once, up to its first wait, where it can be (Python
    3.12+, no task factory set); a task left for the loop to start costs a loop turn more."""
    if _EAGER and loop.get_task_factory() is None:
        return asyncio.Task(answering, loop=loop, eager_start=True)  # type: ignore[call-arg, unused-ignore]
    task = loop.create_task(answering)  # through the loop's task factory, if one is set
    # Cancelled before its first step, it never enters _answering, which would then never answer.
    task.add_done_callback(functools.partial(_unanswered, answer))
    return task


def _undo_once_done(op: LedgerOp, driving: Driving, task: asyncio.Future[Any]) -> None:
    """The caller of ``op`` leaves before it ends: undo or finish it once its outcome is known."""
    if task.done():  # now, not on a loop turn that an interrupt raised may never come to
        _after_interrupted(op, driving, task)
    else:
        _kept_until_done(task)
        task.add_done_callback(functools.partial(_after_interrupted, op, driving))


def _kept_until_done(task: asyncio.Future[Any]) -> None:
    """Keep ``task``, whose caller (and only holder) is leaving, from being collected before it ends:
    the loop holds its tasks weakly. The loop keeps it, not this module: a loop closed before the
    task ended then goes, task and ledger with it, instead of being held for good."""
    loop = task.get_loop()
    kept: set[asyncio.Future[Any]] | None = getattr(loop, _KEPT, None)
    if kept is None:
        kept = set()
        try:
            setattr(loop, _KEPT, kept)
        except AttributeError:  # a loop with no attributes of its own (``__slots__``, an extension type)
            kept = _kept_by_no_loop
    kept.add(task)
    task.add_done_callback(kept.discard)


def _unanswered(answer: asyncio.Future[Any], task: asyncio.Future[Any]) -> None:
    if not answer.done():
        answer.cancel()


def _after_interrupted(op: LedgerOp, driving: Driving, task: asyncio.Future[Any]) -> None:
    """A shielded ledger operation whose caller was cancelled or interrupted has ended: undo or finish it."""
    if task.cancelled():
        undo = undo_for(op)  # its outcome is unknown
    elif (error := task.exception()) is not None:
        # An interrupt: its outcome is unknown. A LedgerError: kept for later already (by ledger_error) when
        # it, or an attempt before it, was transient.
        undo = undo_for(op) if interrupted(error) else None
    elif (outcome := task.result()) is _INTERRUPTED:
        undo = undo_for(op)  # interrupted, the interrupt handed to the caller: its outcome is unknown
    else:
        undo = held_after(op, outcome)
    if undo is not None:
        pending_writes.defer(undo, driving.ledger, driving.tool_name)


async def _asleep(effect: Sleep, driving: Driving) -> None:
    await asyncio.sleep(effect.seconds)


async def _astepped_sleep(effect: Sleep, driving: Driving) -> None:
    _stepped_sleep(effect, driving)
    await asyncio.sleep(0)  # the loop's other tasks run, as during a sleep


async def _areconcile(effect: Reconcile, driving: Driving) -> Any:
    answer = _asked(effect, driving)
    if not inspect.isawaitable(answer):
        return answer
    lease = None
    try:
        lease = _reconciler_lease(effect, driving)
        renewer.add(lease)  # by the renewer thread, as _ainvoke's: the reconciler may block this loop
        token = _current.set(None)  # outside every call, as _asked says
        try:
            return await answer
        finally:
            _current.reset(token)
    finally:
        renewer.remove(lease)
        if inspect.iscoroutine(answer) and inspect.getcoroutinestate(answer) == inspect.CORO_CREATED:
            answer.close()  # never awaited (the lease could not be made): closed, with no warning to follow


async def _ainvoke(run: Run, driving: Driving) -> Any:
    spec, wrapped = driving.spec, driving.wrapped
    assert spec is not None
    assert wrapped is not None
    hard = driving.hard_deadline
    token = _current.set(run.call)
    # Under the built-in timeout the lease keeps the deadline, as for a sync tool: it is renewed up to
    # the deadline plus the margin and no further (with the default lease, not at all), and the tool
    # is never cancelled; a run past the deadline is reported late. Only a timeout the user gave cancels.
    # Renewed by the renewer thread, not a timer on this loop: a tool that blocks the loop past its
    # lease would stop the timer, and another host would take the call over and run it again.
    lease = _lease(run, driving, past_deadline=hard)
    renewer.add(lease)
    try:
        if run.timeout is None or not hard:
            return await wrapped(*run.call.args, **run.call.kwargs)
        return await await_with_timeout(spec.name, run, wrapped(*run.call.args, **run.call.kwargs))
    finally:
        # The lease first: closed outside its context (its event loop closed under it), the coroutine
        # cannot reset the variable, and a lease left behind would be renewed for as long as the process lives.
        renewer.remove(lease)
        with contextlib.suppress(ValueError):
            _current.reset(token)
        if not hard:
            report_late(spec, run)


async def _anotify(effect: Notify, driving: Driving) -> None:
    answer = _told(effect)
    if inspect.isawaitable(answer):
        token = _current.set(None)
        try:
            await answer
        except Exception:
            logger.exception("the on_late_result hook of %s failed", driving.tool_name)
        finally:
            _current.reset(token)


_ASYNC: dict[type, Callable[[Any, Driving], Awaitable[Any]]] = {
    Claim: _aledger_op,
    Takeover: _aledger_op,
    Complete: _aledger_op,
    Release: _aledger_op,
    Renew: _aledger_op,
    Get: _aledger_op,
    Sleep: _asleep,
    Reconcile: _areconcile,
    Notify: _anotify,
    Run: _ainvoke,
}

#: The effects ``adrive`` performs inline for a ledger that never waits: its ledger operations.
_INLINE = frozenset(kind for kind, performer in _ASYNC.items() if performer is _aledger_op)
_NONE_INLINE: frozenset[type] = frozenset()


# --- entry points -------------------------------------------------------------------------


#: A protected call ready to drive: its protocol, and what performing its effects needs.
Planned = tuple[Generator[Effect, Any, Any], Driving]

#: A host per ledger class: its events name the ledger's kind (for metrics and logs).
hosts: dict[type, Host] = {}


def host_for(ledger: Ledger) -> Host:
    """The host a call on ``ledger`` is handed (``hosts.get(type(ledger)) or host_for(ledger)``)."""
    host = HOST._replace(emit=functools.partial(emit, ledger=ledger_kind(ledger)))
    hosts[type(ledger)] = host
    return host


def resolve_by_hand(
    ledger: Ledger, key: CallKey, result: Any, rerun: bool, serializer: Serializer | None, force: bool
) -> Record | None:
    """``Ledger.resolve``: the protocol's ``resolve``, driven on ``ledger``."""
    if rerun == (result is not NO_RESULT):
        raise TypeError("resolve() takes exactly one of result=... or rerun=True")
    encode = None if rerun else functools.partial((serializer or JsonSerializer()).dumps, result)
    protocol = resolve(key, encode, force=force, sealer=ledger.sealer, owner=f"resolve@{owner_token()}", host=HOST)
    settled: Record | None = drive(protocol, Driving(ledger, "resolve"))
    return settled


def request_by_hand(ledger: Ledger, key: CallKey, tool_name: str, args_digest: str) -> Record:
    """``replaysafe.approvals.request``: the protocol's ``request_decision``, driven on ``ledger``."""
    protocol = request_decision(
        key, tool_name, args_digest, sealer=ledger.sealer, owner=f"approve@{owner_token()}", host=HOST
    )
    requested: Record = drive(protocol, Driving(ledger, tool_name))
    return requested


async def arequest_by_hand(ledger: Ledger, key: CallKey, tool_name: str, args_digest: str) -> Record:
    """``request_by_hand`` on the ledger's async operations."""
    protocol = request_decision(
        key, tool_name, args_digest, sealer=ledger.sealer, owner=f"approve@{owner_token()}", host=HOST
    )
    requested: Record = await adrive(protocol, Driving(ledger, tool_name))
    return requested


def decide_by_hand(
    ledger: Ledger, key: CallKey, approval: Callable[[Record, datetime], Approval], answer: str | None
) -> Record:
    """``replaysafe.approvals.approve`` / ``reject``: the protocol's ``decide``, driven on ``ledger``."""
    protocol = decide(key, approval, sealer=ledger.sealer, owner=f"approve@{owner_token()}", host=HOST, answer=answer)
    decided: Record = drive(protocol, Driving(ledger, "approve"))
    return decided


async def adecide_by_hand(
    ledger: Ledger, key: CallKey, approval: Callable[[Record, datetime], Approval], answer: str | None
) -> Record:
    """``decide_by_hand`` on the ledger's async operations."""
    protocol = decide(key, approval, sealer=ledger.sealer, owner=f"approve@{owner_token()}", host=HOST, answer=answer)
    decided: Record = await adrive(protocol, Driving(ledger, "approve"))
    return decided


# Ledger.resolve() runs the protocol's resolve through this driver; check() probes at this host's time and owner.
hand_in(Handed(resolve_by_hand, HOST.now, owner_token))


#: The clocks handed in last (``use_clocks``).
_clocks = MACHINE


def use_clocks(clocks: Clocks) -> Clocks:
    """Hand ``clocks`` to the protocol (``HOST``, and the per-ledger hosts built from it), the lease
    renewer, and the ledgers (the time SQL ledgers hide expired records at); return the clocks they had.

    Module attributes (and the performers of ``Sleep``) swapped once, for a test
    (``replaysafe.testing.SteppedClock``): nothing on a call's path looks the clock up further than
    it did. Under clocks that a test steps, the protocol's pauses step them instead of sleeping. Hard
    deadlines stay the machine's timers (``_deadlines``).
    """
    global HOST, _clocks
    before, _clocks = _clocks, clocks
    HOST = HOST._replace(now=clocks.now, monotonic=clocks.monotonic)
    hosts.clear()  # built from the HOST before (the decorator builds them again, from this one)
    hand_in(Handed(resolve_by_hand, clocks.now, owner_token))
    _SYNC[Sleep], _ASYNC[Sleep] = (_sleep, _asleep) if clocks.step is None else (_stepped_sleep, _astepped_sleep)
    _renewer.use_clocks(clocks)
    return before
