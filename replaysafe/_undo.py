"""Undo: run a completed call's compensation (``@replay_safe(undo=...)``) once, by an operator's hand.

A compensation runs as a protected call of its own: under ``undo_key(key)``, as the tool ``<tool>.undo``,
through the replay protocol and its drivers. So it runs once, a second undo replays its recorded
result, and a compensation killed mid-run is in doubt like any call (the tool's ``in_doubt`` policy).

Which calls may be undone, and in which order, is decided here without I/O (``judge_undo``,
``plan_undo``); ``undo`` and ``aundo`` read the records, decide, then drive each compensation.
Which function compensates a record is told by its tool name: a registry filled as tools are
decorated, in this process (the CLI imports the application's module first: ``--app``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import threading
from collections.abc import Callable, Generator, Iterable, Mapping
from datetime import datetime
from typing import Any, NamedTuple

from . import _config, _constants, _drivers, _unrecorded
from ._constants import UNSET
from ._context import CallScope
from ._core import Effect, Get, Host, ToolSpec, Verdict, _trusted_text, judge, replay
from ._drivers import Driving, adrive, drive
from ._errors import RecordUnreadableError, ReplayMismatchError, describe, ledger_command
from ._events import EventKind
from ._identity import args_digest, call_idempotency_key
from ._keys import step_parent, undo_key, undone_call
from ._owners import owner_token
from ._records import CallKey, Record, Status, Undone
from ._sealing import Sealer, unsealed
from .ledgers import Ledger
from .ledgers._protocol import hand_in_undo

#: What the tool name of a call's compensation ends with: ``refund`` is undone by ``refund.undo``.
UNDO_NAME_SUFFIX = ".undo"


@dataclasses.dataclass(frozen=True, slots=True)
class Undoer:
    """How one tool's calls are undone, fixed at decoration time."""

    #: The tool's spec: decodes a recorded result as a replay of the tool does.
    tool: ToolSpec
    #: The compensation's own spec: it runs as the protected call ``<tool>.undo``.
    spec: ToolSpec
    function: Callable[[Any], Any]
    is_async: bool
    #: The tool's ``timeout=`` (``UNSET`` when not given): the compensation runs under the same.
    timeout: float | None


_undoers: dict[str, Undoer] = {}
_lock = threading.Lock()


def register(tool: ToolSpec, undo: Callable[[Any], Any], timeout: float | None = UNSET) -> None:
    """Record ``undo`` as the compensation of the tool ``tool`` (by its name, in this process): what
    ``@replay_safe(undo=...)`` does. A tool decorated again under the same name replaces it."""
    if not callable(undo):
        raise TypeError(f"@replay_safe on {tool.name}: undo takes a function of the call's result")
    is_async = inspect.iscoroutinefunction(getattr(undo, "__func__", undo))
    spec = ToolSpec(
        name=tool.name + UNDO_NAME_SUFFIX,
        serializer=tool.serializer,
        record_errors=(),  # a compensation that raises is not recorded: undo again to retry it
        on_ledger_error="raise",  # never run a compensation unprotected: an operator can try again
        lease=tool.lease,
        wait_timeout=tool.wait_timeout,
        # Killed mid-run, a compensation is in doubt as its tool's calls are: rerun (the default) or raise.
        # A reconciler answers for the tool's calls, not for their compensations: those raise then.
        in_doubt=tool.in_doubt if isinstance(tool.in_doubt, str) else "raise",
        max_result_bytes=tool.max_result_bytes,
        function=undo,
        identity=(tool.identity or tool.name) + UNDO_NAME_SUFFIX,
    )
    with _lock:
        _undoers[tool.name] = Undoer(tool, spec, undo, is_async, timeout)


def undoer_for(tool_name: str) -> Undoer | None:
    """The compensation registered in this process for the tool named ``tool_name``, if any."""
    return _undoers.get(tool_name)


# --- decisions (no I/O) -------------------------------------------------------------------


class UndoVerdict(enum.Enum):
    """What may be done about a record an undo is asked for."""

    UNDO = "undo"  #: completed: its compensation runs, handed its recorded result
    FORCED = "forced"  #: running, paused or in doubt, and forced: its compensation runs, handed ``None``
    NOTHING = "nothing"  #: failed: no side effect was recorded, nothing to undo
    RUNNING = "running"  #: its owner still runs it: refused
    IN_DOUBT = "in_doubt"  #: its owner died or gave up: refused
    PAUSED = "paused"  #: waiting for a resume: refused


_REFUSED = (UndoVerdict.RUNNING, UndoVerdict.IN_DOUBT, UndoVerdict.PAUSED)


def judge_undo(record: Record, now: datetime, owner_alive: Callable[[str], bool | None], force: bool) -> UndoVerdict:
    """What an undo may do about ``record`` at ``now``: only a completed call is undone; one running,
    paused or in doubt only when forced; a failed one never."""
    status = record.status
    if status is Status.COMPLETED:
        return UndoVerdict.UNDO
    if status is Status.FAILED:
        return UndoVerdict.NOTHING
    if force:
        return UndoVerdict.FORCED
    if status is Status.PAUSED:
        return UndoVerdict.PAUSED
    if status is Status.RUNNING and judge(record, now, owner_alive) is Verdict.WAIT:
        return UndoVerdict.RUNNING
    return UndoVerdict.IN_DOUBT


class Planned(NamedTuple):
    """One call an undo reaches, newest first: its record, its compensation (``None``: skipped, ``note``
    says why) and whether its compensation is handed its recorded result (else ``None``, forced)."""

    record: Record
    undoer: Undoer | None
    with_result: bool = True
    note: str = ""


def steps_of(key: CallKey, records: Iterable[Record]) -> list[Record]:
    """The steps made inside the call ``key``, and theirs, at any depth, newest first (by when each was first
    claimed: the reverse of the order they started in), among ``records`` (the records of its thread)."""
    records = list(records)
    children: dict[CallKey, list[CallKey]] = {}
    for record in records:
        parent = step_parent(record.key, record.tool_name)
        if parent is not None:
            children.setdefault(parent, []).append(record.key)
    inside: set[CallKey] = set()
    below = [key]
    while below:
        for step in children.get(below.pop(), ()):
            if step not in inside:
                inside.add(step)
                below.append(step)
    # Oldest first (a stable sort keeps the ledger's order between equal times), then reversed.
    found = sorted((record for record in records if record.key in inside), key=lambda record: record.created_at)
    return found[::-1]


def plan_undo(
    record: Record | None,
    key: CallKey,
    steps: Iterable[Record],
    undoers: Mapping[str, Undoer] | Callable[[str], Undoer | None],
    *,
    now: datetime,
    owner_alive: Callable[[str], bool | None],
    force: bool,
) -> list[Planned]:
    """What undoing the call ``key`` (whose record is ``record``) does: each of its ``steps`` (``steps_of``),
    newest first, then the call itself; or raise, before anything runs.

    ``LookupError`` when there is no record; ``ValueError`` when the call (or a step) is running, paused or in
    doubt and not ``force``, when the call failed (nothing to undo), or when no compensation is registered for
    the call nor for any of its steps. A step that failed, or whose tool has no compensation here, is skipped.
    """
    find = undoers if callable(undoers) else undoers.get
    if record is None:
        raise LookupError(f"no record for {key}: nothing to undo (the call never ran, or its record was deleted)")
    verdict = judge_undo(record, now, owner_alive, force)
    if verdict is UndoVerdict.NOTHING:
        raise ValueError(
            f"{describe(record.tool_name, key)} failed (its error is recorded): no side effect is recorded, so "
            f"there is nothing to undo. See it with {ledger_command('show', key)}."
        )
    _refuse(record, verdict)
    planned: list[Planned] = []
    for step in steps:
        step_verdict = judge_undo(step, now, owner_alive, force)
        _refuse(step, step_verdict, parent=record)
        undoer = find(step.tool_name)
        if step_verdict is UndoVerdict.NOTHING:
            planned.append(Planned(step, None, note="it failed: nothing to undo"))
        elif undoer is None:
            planned.append(Planned(step, None, note=f"no undo is registered for {step.tool_name!r} in this process"))
        else:
            planned.append(Planned(step, undoer, step_verdict is UndoVerdict.UNDO))
    own = find(record.tool_name)
    if own is None and not any(entry.undoer is not None for entry in planned):
        raise ValueError(
            f"no undo is registered in this process for the tool {record.tool_name!r} "
            f"({describe(record.tool_name, key)})"
            + (" nor for any of its steps" if planned else "")
            + ", so nothing was undone. Give the tool a compensation, @replay_safe(undo=...), and import the "
            "module that decorates it before undoing: replaysafe ledger undo --app MODULE ... (ledger.undo uses "
            "the tools decorated in its own process)."
        )
    note = "" if own is not None else f"no undo is registered for {record.tool_name!r} in this process"
    planned.append(Planned(record, own, verdict is UndoVerdict.UNDO, note))
    return planned


def _refuse(record: Record, verdict: UndoVerdict, parent: Record | None = None) -> None:
    if verdict not in _REFUSED:
        return
    call = describe(record.tool_name, record.key)
    where = "" if parent is None else f", a step of {describe(parent.tool_name, parent.key)},"
    if verdict is UndoVerdict.RUNNING:
        state = f"is still running in {record.owner}, which is alive: it may yet finish. Wait for it, then undo it"
    elif verdict is UndoVerdict.PAUSED:
        state = "is paused, waiting for a resume: resume it (or settle it) first, then undo it"
    else:
        state = (
            "is in doubt: its side effect may or may not have happened. Settle it first "
            f"({ledger_command('resolve', record.key)} --result '<json>' if it happened, then undo it)"
        )
    raise ValueError(
        f"{call}{where} {state}; or run its compensation now, handed null for a result: "
        f"{_undo_command(record.key)} --force. Nothing was undone."
    )


def _undo_command(key: CallKey) -> str:
    return f"{ledger_command('undo', key)} --app MODULE"


def check_undo_record(found: Record | None, undoer: Undoer, key: CallKey, digest: str) -> None:
    """Refuse (``ReplayMismatchError``) an undo record made for another execution of the call ``key``: the call
    was deleted and ran again, or was undone by force before it had a result. Replayed, it would skip the
    compensation of the side effect recorded now."""
    if found is None or (found.tool_name == undoer.spec.name and found.args_digest == digest):
        return
    message = (
        f"the undo of {describe(undoer.tool.name, key)} is recorded ({describe(found.tool_name, found.key)}) for "
        "another result of the call than the one recorded now (the call ran again after its record was deleted, "
        "or was undone by force before it finished), so nothing ran. If the side effect recorded now is to be "
        f"undone too, delete the undo's record ({ledger_command('delete', found.key)}) and undo again."
    )
    raise ReplayMismatchError(message, tool_name=undoer.spec.name, key=found.key)


# --- reading and running ------------------------------------------------------------------


def _read(key: CallKey) -> Generator[Effect, Any, Record | None]:
    record: Record | None = yield Get(key)
    return record


def _digest(undoer: Undoer, record: Record) -> str:
    """The undo call's argument digest: that of the call's result as stored, so that an undo recorded for
    another result is told apart (``check_undo_record``)."""
    return args_digest({"recorded": unsealed(record.result)}, tool_name=undoer.spec.name)


def _recorded_value(entry: Planned, host: Host, sealer: Sealer | None, force: bool) -> Any:
    """What the compensation is handed: the call's recorded result, decoded as a replay returns it (its seal
    checked first); ``None`` when forced on a call with no result (not finished, or its result not recorded)."""
    assert entry.undoer is not None
    record, tool = entry.record, entry.undoer.tool
    if not entry.with_result:
        return None
    text = _trusted_text(tool, host, record, sealer)
    idempotency_key = call_idempotency_key(*record.key, record.tool_name)
    if _unrecorded.parse(text) is not None:
        if force:
            return None
        raise ValueError(
            f"{describe(record.tool_name, record.key)} ran, but its result was not recorded, so its compensation "
            f"has nothing to be handed. Settle it first ({ledger_command('resolve', record.key)} --result '<json>'), "
            f"or undo it handing null: {_undo_command(record.key)} --force. Nothing was undone."
        )
    try:
        return tool.decode(text)
    except Exception as exc:  # never quoted: a decode error's text may hold the stored value
        raise RecordUnreadableError(
            f"the recorded result of {describe(record.tool_name, record.key)} cannot be decoded "
            f"({type(exc).__name__}), so its compensation cannot be handed it. Nothing was undone. Import the "
            "module that defines its type (--app), or inspect it with replaysafe ledger show.",
            idempotency_key=idempotency_key,
            tool_name=record.tool_name,
            key=record.key,
        ) from None


def _timeout(undoer: Undoer) -> tuple[float | None, bool]:
    """The compensation's timeout and whether it is a hard deadline, as a call of its tool would have them."""
    timeout = undoer.timeout
    if timeout is UNSET:
        timeout = _config.default_tool_timeout
    hard = timeout is not None and timeout is not UNSET
    return (_constants.TOOL_TIMEOUT if timeout is UNSET else timeout), hard


class _Compensation(NamedTuple):
    """One compensation ready to drive: its protocol and driving, and whether its body ran (``ran[0]``)."""

    protocol: Generator[Effect, Any, Any]
    driving: Driving
    ran: list[bool]


def _compensation(
    ledger: Ledger, entry: Planned, value: Any, body: Callable[..., Any], ran: list[bool]
) -> _Compensation:
    undoer = entry.undoer
    assert undoer is not None
    key = undo_key(entry.record.key)
    timeout, hard = _timeout(undoer)
    scope = CallScope(key, ledger)
    host = _drivers.hosts.get(type(ledger)) or _drivers.host_for(ledger)
    protocol = replay(
        undoer.spec, scope, _digest(undoer, entry.record), (value,), {}, timeout, ledger.sealer, owner_token(), host
    )
    return _Compensation(protocol, Driving(ledger, undoer.spec.name, undoer.spec, scope, body, hard), ran)


def _outcome(entry: Planned, ran: bool, result: Any, host: Host) -> Undone:
    record, undoer = entry.record, entry.undoer
    assert undoer is not None
    if not ran:
        return Undone(record.key, record.tool_name, "already_undone", result)
    host.emit(
        EventKind.UNDONE,
        f"{describe(record.tool_name, record.key)} was undone: its compensation {undoer.spec.name} ran "
        f"(its record: {ledger_command('show', undo_key(record.key))})",
        tool_name=record.tool_name,
        key=record.key,
        attempt=record.attempt,
    )
    return Undone(record.key, record.tool_name, "undone", result)


def _skipped(entry: Planned) -> Undone:
    return Undone(entry.record.key, entry.record.tool_name, "skipped", None, entry.note)


def plan(ledger: Ledger, key: CallKey, force: bool = False) -> list[Planned]:
    """Read the call ``key`` and its steps, and decide what undoing it does (``plan_undo``)."""
    record = drive(_read(key), Driving(ledger, "undo"))
    steps = steps_of(key, ledger.records(thread_id=key.thread_id)) if record is not None else []
    return _decided(record, key, steps, force)


def _decided(record: Record | None, key: CallKey, steps: list[Record], force: bool) -> list[Planned]:
    host = _drivers.HOST
    if undone_call(key) is not None:
        raise ValueError(f"{key} is the record of an undo: undo the call itself ({undone_call(key)})")
    return plan_undo(record, key, steps, undoer_for, now=host.now(), owner_alive=host.owner_alive, force=force)


#: What ``_undoing`` asks its driver to drive (a protocol, on its ``Driving``), the answer sent back.
Drivable = tuple[Generator[Effect, Any, Any], Driving]
#: A compensation's body for one planned entry: it calls the undo function (sets ``ran[0]`` when it does).
BodyFor = Callable[[Planned, list[bool]], Callable[..., Any]]


def _undoing(
    ledger: Ledger, planned: list[Planned], body_for: BodyFor, force: bool
) -> Generator[Drivable, Any, list[Undone]]:
    """The undo of ``planned``, once for sync and async: each compensation's undo record read and checked,
    then its protocol run; each yielded to the caller's driver (``drive`` or ``adrive``), as httpx's
    ``auth_flow`` yields its requests."""
    host = _drivers.hosts.get(type(ledger)) or _drivers.host_for(ledger)
    values = [_recorded_value(entry, host, ledger.sealer, force) if entry.undoer else None for entry in planned]
    done: list[Undone] = []
    for entry, value in zip(planned, values, strict=True):
        undoer = entry.undoer
        if undoer is None:
            done.append(_skipped(entry))
            continue
        found = yield (_read(undo_key(entry.record.key)), Driving(ledger, undoer.spec.name))
        check_undo_record(found, undoer, entry.record.key, _digest(undoer, entry.record))
        ran = [False]
        compensation = _compensation(ledger, entry, value, body_for(entry, ran), ran)
        result = yield (compensation.protocol, compensation.driving)
        done.append(_outcome(entry, ran[0], result, host))
    return done


def _sync_body(entry: Planned, ran: list[bool]) -> Callable[..., Any]:
    assert entry.undoer is not None
    function, name = entry.undoer.function, entry.record.tool_name

    def body(value: Any) -> Any:
        ran[0] = True
        answer = function(value)
        if inspect.isawaitable(answer):
            if inspect.iscoroutine(answer):
                answer.close()
            raise TypeError(
                f"the undo of {name} returned an awaitable: run it with await replaysafe.aundo(ledger, key)"
            )
        return answer

    return body


def _async_body(entry: Planned, ran: list[bool]) -> Callable[..., Any]:
    undoer = entry.undoer
    assert undoer is not None

    async def body(value: Any) -> Any:
        ran[0] = True
        if undoer.is_async:
            return await undoer.function(value)
        return await asyncio.to_thread(undoer.function, value)  # current_call() is copied into the thread

    return body


def undo(ledger: Ledger, key: CallKey, force: bool = False) -> list[Undone]:
    """``ledger.undo(key)``: run the compensations of the call ``key`` and its steps, newest first, once each."""
    planned = plan(ledger, key, force)
    asynchronous = [entry.record.tool_name for entry in planned if entry.undoer is not None and entry.undoer.is_async]
    if asynchronous:
        raise TypeError(
            f"the undo of {', '.join(sorted(set(asynchronous)))} is async: run it with "
            f"await replaysafe.aundo(ledger, key) (the CLI runs either). Nothing was undone ({key})."
        )
    flow, answer = _undoing(ledger, planned, _sync_body, force), None
    try:
        while True:
            answer = drive(*flow.send(answer))
    except StopIteration as end:
        finished: list[Undone] = end.value
        return finished


async def aundo(ledger: Ledger, key: CallKey, *, force: bool = False) -> list[Undone]:
    """``ledger.undo(key)`` for async code: an async compensation is awaited, a sync one runs in a worker thread.

    Run the compensation (``@replay_safe(undo=...)``) of the completed call ``key``, and first those of its
    steps, newest first, once each (docs/approvals.md, Undo)."""
    record = await adrive(_read(key), Driving(ledger, "undo"))
    steps: list[Record] = []
    if record is not None:
        steps = steps_of(key, await asyncio.to_thread(lambda: list(ledger.records(thread_id=key.thread_id))))
    flow, answer = _undoing(ledger, _decided(record, key, steps, force), _async_body, force), None
    try:
        while True:
            answer = await adrive(*flow.send(answer))
    except StopIteration as end:
        finished: list[Undone] = end.value
        return finished


hand_in_undo(undo)
