"""The replay protocol: every claim, replay and record decision, with no I/O.

The protocol is written as generators that yield *effects* (claim this key, run
the tool, record this result, sleep) and receive their outcomes. Effects are plain
data: the sync and async drivers in ``_drivers`` map each to a ledger operation (or
a sleep, or the tool) and send back its outcome; the decisions live here, once. A
ledger failure comes back into the generator as a ``LedgerError``.

The protocol reads nothing ambient: the clocks, whether an owner process still runs,
the owner token of each call and the event sink are handed in (a ``Host``), as
tenacity is handed ``sleep``. So it can be driven by hand, at any instant.

A call goes through two phases. ``begin`` claims the key and ends with a decision:
``Replay`` (return a recorded value) or ``Run`` (run the tool). ``settle_result``
and ``settle_error`` record how a run ended. ``replay`` chains them for a plain
call; streaming tools run their chunks between the two phases.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import json
import typing
from collections.abc import Callable, Generator, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple

from . import _constants, _unrecorded
from ._approvals import STATE_PREFIX, Approval, CallState, Granted, Refusal, check, parse_state
from ._codec import JsonSerializer, Reviver, Serializer, reviver_for
from ._context import CallInfo, CallScope, InDoubt, RecordedSteps, RunningCall
from ._errors import (
    CONTROL_ERRORS,
    ApprovalExpiredError,
    ApprovalMismatchError,
    ApprovalRejectedError,
    ApprovalRequiredError,
    CallInDoubtError,
    CallInProgressError,
    LedgerError,
    RecordedToolError,
    RecordUnreadableError,
    ReplayMismatchError,
    ResultEncodingError,
    TamperedRecordError,
    ToolTimeoutError,
    add_note,
    describe,
    ledger_command,
)
from ._events import EventKind
from ._identity import call_idempotency_key
from ._keys import ARGS_MESSAGE_ID, BUSINESS_THREAD_ID, late_key, step_key, step_ordinal, step_parent
from ._records import CallKey, ClaimResult, Record, Status, new_tuple
from ._sealing import SIGNING_KEY_ENV, Sealer, is_sealed, unsealed

OnLedgerError = Literal["warn", "raise"]


class _Rerun:
    """What a reconciler returns to have an in-doubt call run again."""

    _instance: _Rerun | None = None

    def __new__(cls) -> _Rerun:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "replaysafe.RERUN"

    def __reduce__(self) -> str:
        return "RERUN"


RERUN: Any = _Rerun()

#: A reconciler gets the in-doubt call and returns its result, or ``RERUN``.
Reconciler = Callable[[CallInfo], Any]

_UNRESOLVED: Any = object()


class Earlier(NamedTuple):
    """A call as the earlier key rules (rs0) identified it: the argument digests it may have been
    recorded with, and, for a key derived from the call (``key="args"``, business keys), its keys."""

    digests: frozenset[str]
    keys: tuple[CallKey, ...] = ()


@dataclasses.dataclass(slots=True)
class ToolSpec:
    """How one decorated tool is protected, fixed at decoration time."""

    name: str
    serializer: Serializer
    record_errors: tuple[type[BaseException], ...]
    on_ledger_error: OnLedgerError
    #: Seconds a claim is owned; ``None`` derives it from the call's timeout.
    lease: float | None
    wait_timeout: float
    in_doubt: InDoubt = "rerun"
    max_result_bytes: int = _constants.MAX_RESULT_BYTES
    #: The tool function, whose return annotation says what type a replay rebuilds.
    function: Any = None
    streaming: bool = False
    #: What tells the tool apart in the keys it derives (``key="args"``, business keys): its
    #: ``name=``, else ``module:qualname`` (docs/keys.md).
    identity: str = ""
    #: ``earlier(key, args, kwargs, args_digest)``: the call as the earlier key rules (rs0) identified it, so that
    #: a record written under them is found and replayed, never run again; ``None``: nothing to find.
    earlier: Callable[[CallKey, tuple[Any, ...], Mapping[str, Any], str], Earlier] | None = None
    #: Whether every run of the tool spends an approval (docs/approvals.md).
    needs_approval: bool = False
    #: The digest of a call given ``arguments`` by name: how an approver's edit is checked.
    digest_of: Callable[[Mapping[str, Any]], str] | None = None
    #: Called with a ``LateResult`` when a run ends after its call was settled elsewhere.
    on_late_result: Callable[[LateResult], Any] | None = None
    _reviver: Reviver | None = _UNRESOLVED

    def decode(self, text: str | None) -> Any:
        value = self.serializer.loads(text if text is not None else "null")
        if self._reviver is _UNRESOLVED:
            # Resolved on first replay, when forward references can be evaluated.
            self._reviver = reviver_for(_replayed_type(self))
        return self._reviver(value) if self._reviver is not None else value


@functools.lru_cache(maxsize=256)
def lease_length(lease: float | None, timeout: float | None) -> timedelta:
    """How long a claim is owned: ``lease`` (a tool's ``ToolSpec.lease``) if set, else past the
    call's timeout by the lease margin, so a slow owner is not taken over early.

    Cached on its arguments: on the hot path this is a call into the C cache, with no Python
    frame. Inside a ``node`` whose time left sets the timeout, the key differs on every call and
    misses (a ``timedelta`` built, as without the cache; bounded at 256 entries). Not worth a
    test on every call to spare that rare path. ``_constants.LEASE`` and ``LEASE_MARGIN`` are
    read once per key: they are fixed for the process.
    """
    if lease is not None:
        return timedelta(seconds=lease)
    if timeout:
        return timedelta(seconds=timeout + _constants.LEASE_MARGIN)
    return timedelta(seconds=_constants.LEASE)


@functools.lru_cache(maxsize=256)
def seconds(length: float) -> timedelta:
    """``timedelta(seconds=length)``, cached: the same few lengths are built on every call."""
    return timedelta(seconds=length)


def _replayed_type(spec: ToolSpec) -> Any:
    try:
        annotation = typing.get_type_hints(spec.function).get("return", Any)
    except Exception:  # an unresolvable annotation: replay returns the decoded data as is
        return Any
    if spec.streaming:  # Iterator[X], Generator[X, ...], AsyncIterator[X]: a list of X
        args = typing.get_args(annotation)
        return list[args[0]] if args else Any  # type: ignore[valid-type]
    return annotation


# --- what the protocol is handed --------------------------------------------------


class Host(NamedTuple):
    """What the protocol may know of the world outside it, handed in by its drivers."""

    #: The wall clock, timezone-aware UTC: leases and records are compared across hosts with it.
    now: Callable[[], datetime]
    #: A clock that never steps back, for waits and durations.
    monotonic: Callable[[], float]
    #: Whether the process holding an owner token still runs; ``None`` when this host cannot tell.
    owner_alive: Callable[[str], bool | None]
    #: ``emit(kind, message, *, tool_name, key, **fields)``: where events go.
    emit: Callable[..., None]
    #: Whether anyone listens for an event kind (the hot path builds no message nobody reads).
    wanted: Callable[[EventKind], bool]


# --- effects: plain data, what the drivers are asked to do ---------------------------


class Claim(NamedTuple):
    key: CallKey
    tool_name: str
    args_digest: str
    owner: str
    now: datetime
    lease_expires_at: datetime


class Takeover(NamedTuple):
    record: Record
    owner: str
    now: datetime
    lease_expires_at: datetime
    #: What the record becomes: ``running`` (a run), or ``paused`` (an approver's decision, or a call that
    #: must be approved again).
    status: Status = Status.RUNNING
    #: The new record's result: the call's approval state, sealed on a signing ledger.
    result: str | None = None
    #: The new record's argument digest, when it runs an approver's edit; ``None`` keeps the record's.
    args_digest: str | None = None
    #: What is written in its place when the takeover's outcome is unknown (it may have landed, and the tool
    #: did not run): ``(status, result)``, sealed; ``None``: in doubt, with no result. A spent approval is put
    #: back unspent; a call that ran on one keeps saying so.
    doubt: tuple[Status, str | None] | None = None

    @property
    def key(self) -> CallKey:
        return self.record.key


class Complete(NamedTuple):
    key: CallKey
    owner: str
    status: Status
    result: str | None
    now: datetime


class Release(NamedTuple):
    key: CallKey
    owner: str


class Renew(NamedTuple):
    """Extend the lease of the ``running`` record ``owner`` holds to ``lease_expires_at``.

    Fenced like every write: it changes nothing (and returns ``False``) once the
    call is finished or held by another owner.
    """

    key: CallKey
    owner: str
    lease_expires_at: datetime


class Get(NamedTuple):
    key: CallKey


LedgerOp = Claim | Takeover | Complete | Release | Renew | Get


class Sleep(NamedTuple):
    seconds: float


@dataclasses.dataclass(slots=True)  # not frozen: a frozen dataclass costs ~1 us to build
class Run:
    """``begin``'s decision to run the tool, and the effect that runs it: the tool body runs
    with ``call`` as ``current_call()``; its exception is thrown back in. ``owner`` is
    ``None`` for an unprotected run."""

    call: CallInfo
    owner: str | None
    #: Seconds the tool may run, ``None`` for no limit.
    timeout: float | None
    host: Host
    #: When the run started, on ``host.monotonic``.
    started: float
    #: How long the claim is held: renewed by this much while the tool runs.
    lease: timedelta
    args_digest: str = ""
    sealer: Sealer | None = None
    #: The approval this run spent, kept in the record of how it ends if it does not finish.
    approval: Approval | None = None
    #: Whether the call runs only on an approval (kept in its record if it does not finish).
    gated: bool = False
    #: The ids of the answers decided on the call so far (kept in its record if it does not finish).
    answers: tuple[str, ...] = ()


class Reconcile(NamedTuple):
    """Ask the user's reconciler about an in-doubt call; its answer (or exception) comes back."""

    reconciler: Reconciler
    call: CallInfo
    #: The takeover's run: the reconciler answers in the tool's place, under that run's lease.
    run: Run


class LateResult(NamedTuple):
    """How a run ended after its call was settled elsewhere (taken over, resolved by an operator, or removed
    to run again): ``on_late_result``'s argument. The settlement stands; this is kept beside it."""

    #: The call, as the late run saw it (its ``attempt``, its ``idempotency_key``).
    call: CallInfo
    #: ``completed`` (it returned ``result``) or ``failed`` (it raised, under ``record_errors``).
    status: Status
    #: What the tool returned (``None`` when it failed).
    result: Any
    #: The call's record as settled, as the late run found it (``None``: removed, to run again).
    settled: Record | None


class Notify(NamedTuple):
    """Hand ``late`` to the application's ``on_late_result`` hook; nothing comes back."""

    hook: Callable[[LateResult], Any]
    late: LateResult


class ToolExit(BaseException):
    """A ``GeneratorExit`` the tool (or reconciler) raised, as the drivers throw it into the
    protocol: a bare one would read as the protocol being closed, and skip settling."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(type(original).__name__)
        self.original = original


class Replay(NamedTuple):
    """``begin``'s decision to return ``value`` without running the tool."""

    value: Any


Effect = LedgerOp | Sleep | Run | Reconcile | Notify
Protocol = Generator[Effect, Any, Any]


def undo_for(op: LedgerOp) -> Complete | Release | None:
    """What to write once the ledger answers again, when ``op``'s outcome is unknown (it
    failed in transit, or was interrupted).

    A finishing write is itself written later. A claim or takeover whose answer was
    lost may still have landed under this call's owner token: undo it (fenced, so it
    does nothing if it did not land), or the call would look running forever.
    """
    if isinstance(op, Claim):
        return Release(op.key, op.owner)
    if isinstance(op, Takeover):
        status, result = op.doubt or (Status.IN_DOUBT, None)
        return Complete(op.key, op.owner, status, result, op.now)
    if isinstance(op, (Complete, Release)):
        return op
    return None  # a read, or a renewal the next tick makes again


def held_after(op: LedgerOp, outcome: Any) -> Complete | Release | None:
    """What ``op`` holds once it returned ``outcome``, to undo if the call stops there:
    the claim (or takeover) it made; ``None`` once a finishing write has landed."""
    if isinstance(op, Claim):
        record = outcome.record
        ours = outcome.claimed or (record.status is Status.RUNNING and record.owner == op.owner)
        return Release(op.key, op.owner) if ours else None
    if isinstance(op, Takeover):
        return undo_for(op) if outcome is not None else None
    return None


# --- decisions -----------------------------------------------------------------


class Verdict(enum.Enum):
    """What to do about a record someone else holds."""

    REPLAY = "replay"  # completed: return its result
    RAISE_RECORDED = "raise_recorded"  # failed and recorded: raise RecordedToolError
    WAIT = "wait"  # a live owner runs it: wait for its result
    IN_DOUBT = "in_doubt"  # its owner died or gave up mid-call
    RESUME = "resume"  # paused: run it again, its completed steps replaying


# The enum members the hot path reads, read once: on Python 3.11 each read through an enum
# class runs its metaclass's __getattr__ hook, and a protected call reads several.
_RUNNING, _COMPLETED, _FAILED, _PAUSED = Status.RUNNING, Status.COMPLETED, Status.FAILED, Status.PAUSED
_REPLAY, _RAISE_RECORDED, _WAIT, _IN_DOUBT, _RESUME = (
    Verdict.REPLAY,
    Verdict.RAISE_RECORDED,
    Verdict.WAIT,
    Verdict.IN_DOUBT,
    Verdict.RESUME,
)
_REPLAYED, _EXECUTED, _STARTED = EventKind.REPLAYED, EventKind.EXECUTED, EventKind.STARTED


def owner_is_alive(record: Record, now: datetime, owner_alive: Callable[[str], bool | None]) -> bool:
    """Whether the owner of a ``running`` record may still finish it.

    Where ``owner_alive`` can tell (on the owner's machine, its process is checked), a
    dead owner is known at once and a live one is never declared dead; elsewhere the
    lease decides.
    """
    alive = owner_alive(record.owner)
    return now < record.lease_expires_at if alive is None else alive


def judge(record: Record, now: datetime, owner_alive: Callable[[str], bool | None]) -> Verdict:
    """What to do about ``record``, found by a claim at ``now``."""
    status = record.status
    if status is _COMPLETED:
        return _REPLAY
    if status is _FAILED:
        return _RAISE_RECORDED
    if status is _PAUSED:
        return _RESUME
    if status is _RUNNING and owner_is_alive(record, now, owner_alive):
        return _WAIT
    return _IN_DOUBT


def _report_mismatch(spec: ToolSpec, host: Host, record: Record, args_digest: str) -> None:
    """The record found is of another tool, or of other arguments: nothing runs, nothing replays."""
    what = f"tool {record.tool_name!r}" if record.tool_name != spec.name else "the same tool with other arguments"
    if record.key.thread_id == BUSINESS_THREAD_ID:
        fix = (
            "A business key names one operation: the same key with other arguments is another request under "
            "a used key. Give it a new key, or exclude non-data arguments with @replay_safe(exclude_args=...)."
        )
    elif step_parent(record.key, record.tool_name) is not None:
        fix = (
            "A step is found again by its position in its parent call: the tool made a different call at "
            "the same position, so it is not deterministic. Make the steps before this one depend only on "
            "the parent's arguments and on the results of earlier steps."
        )
    else:
        fix = (
            "One key must identify one tool call: use a distinct tool_call_id (or message_id) per call, or "
            "exclude non-data arguments from the digest with @replay_safe(exclude_args=...)."
        )
    message = f"{describe(spec.name, record.key)}: this call key is already recorded for {what}, so nothing ran. {fix}"
    host.emit(EventKind.MISMATCH, message, tool_name=spec.name, key=record.key, args_digest=args_digest)
    raise ReplayMismatchError(message, tool_name=spec.name, key=record.key)


def encode_error(exc: BaseException) -> str:
    """A recorded failure: the error's type name and message (data, like a result: it may
    quote arguments, so it is stored and handed back as ``error_message``, never put in a
    message)."""
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the record
        message = ""
    return json.dumps({"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": message})


def recorded_error(spec: ToolSpec, host: Host, record: Record, text: str | None) -> RecordedToolError:
    try:
        stored = json.loads(text or "{}")
        error_type, error_message = str(stored["type"]), str(stored["message"])
    except (ValueError, KeyError, TypeError):
        raise _unreadable(spec, host, record, "its recorded error cannot be decoded") from None
    return RecordedToolError(
        f"{describe(spec.name, record.key)} raised {error_type} when it first ran, and that failure is recorded, "
        "so it was not run again (its message is in .error_message). To allow a retry, delete its record: "
        f"{ledger_command('delete', record.key)}",
        error_type=error_type,
        error_message=error_message,
        tool_name=spec.name,
        key=record.key,
    )


def _not_recorded(
    spec: ToolSpec, host: Host, record: Record, unrecorded: _unrecorded.Unrecorded
) -> ResultEncodingError:
    """A replay of a call that ran but whose result could not be stored: it never runs again."""
    key = record.key
    idempotency_key = call_idempotency_key(*key, spec.name)
    message = (
        f"{describe(spec.name, key)} {unrecorded.describe()}, so it is not run again and has nothing to return "
        f"(idempotency key {idempotency_key}). Settle it: {_resolve_command(key)} "
        "--result '<json>' (or --rerun to allow a new run); then return smaller or encodable data, raise "
        "max_result_bytes, or pass a serializer=."
    )
    host.emit(EventKind.LEDGER_ERROR, message, tool_name=spec.name, key=key, attempt=record.attempt)
    return ResultEncodingError(message, tool_name=spec.name, key=key, idempotency_key=idempotency_key)


def _unreadable(spec: ToolSpec, host: Host, record: Record, why: str) -> RecordUnreadableError:
    """A finished call whose record cannot be read back: it never runs again (nor unprotected)."""
    key = record.key
    idempotency_key = call_idempotency_key(*key, spec.name)
    message = (
        f"the {record.status} record of {describe(spec.name, key)} cannot be read: {why}. The call ran, so it is "
        f"not run again (idempotency key {idempotency_key}). Inspect it with replaysafe ledger show, then settle it: "
        f"{_resolve_command(key)} --result '<json>' (or --rerun to allow a new run)."
    )
    host.emit(EventKind.LEDGER_ERROR, message, tool_name=spec.name, key=key, attempt=record.attempt)
    return RecordUnreadableError(message, tool_name=spec.name, key=key, idempotency_key=idempotency_key)


def _resolve_command(key: CallKey) -> str:
    return ledger_command("resolve", key)


def _run(
    spec: ToolSpec,
    scope: CallScope,
    attempt: int,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    owner: str,
    timeout: float | None,
    host: Host,
    lease: timedelta,
    args_digest: str,
    sealer: Sealer | None,
    recorded: RecordedSteps | None = None,
    approval: Approval | None = None,
) -> Run:
    """The decision to run attempt ``attempt`` of the call, claimed by ``owner``; ``recorded``: what the
    record of its last execution says of its steps, when it runs again after a pause or in doubt;
    ``approval``: the approval the run spends."""
    call = RunningCall.of(scope, spec.name, attempt, args, kwargs)
    if recorded is not None:
        call.run_again(recorded)
    return Run(call, owner, timeout, host, host.monotonic(), lease, args_digest, sealer, approval)


# --- steps: their places in a call run again ---------------------------------------------

#: What the result of a paused or in-doubt record holds when its call made steps: the tool name of each
#: step, in the order they were made, as a JSON list after this prefix. Never read as a result: only a
#: completed record's result is one.
STEPS_PREFIX = "rs-steps-1:"


def _steps_made(call: CallInfo) -> list[str]:
    """The tool name at each place of ``call``'s steps: this execution's, then those of the last
    execution past where this one got."""
    if not isinstance(call, RunningCall):
        return []
    names = list(call.steps_made())
    recorded = call.recorded_steps
    if recorded is not None and len(recorded.names) > len(names):
        names += recorded.names[len(names) :]
    return names


def _state_text(run: Run, status: Status) -> str | None:
    """What the record of ``run``'s call keeps when it pauses or stops in doubt (``status``): its steps,
    and, for a run that spent an approval, that approval (so the call is never run again on it);
    ``None`` when there is nothing to keep (the record then has no result, as before steps)."""
    names = _steps_made(run.call)
    if run.approval is not None or run.gated:
        spent = run.approval
        may_have_run = spent is not None and status is Status.IN_DOUBT
        return CallState(tuple(names), True, spent=spent, may_have_run=may_have_run, answers=run.answers).text()
    return STEPS_PREFIX + json.dumps(names) if names else None


def _raised_on_approval(run: Run) -> str:
    """The paused record of a call that raised on the approval it spent: that approval, its answers, and that
    its side effect may have happened. No step names: as after a release, the retry's steps are not checked
    against this run's (they replay by their own records)."""
    return CallState((), True, spent=run.approval, may_have_run=True, answers=run.answers).text()


def _pause_raised_on_approval(spec: ToolSpec, run: Run, exc: BaseException) -> Generator[Effect, Any, None]:
    """Keep the call ``run`` ran on an approval, and that raised, paused for a new decision. A takeover of its
    running record, not a finishing write: a paused record that says an attempt may have run never expires
    (expired, its answers' ids would go with it)."""
    key, host, owner = run.call.key, run.host, run.owner
    assert owner is not None
    text = _raised_on_approval(run)
    try:
        for _ in range(3):  # a renewal of the lease between the read and the takeover changes the record
            record: Record | None = yield Get(key)
            if record is None or record.owner != owner or record.status is not Status.RUNNING:
                return  # taken over, or settled by hand, meanwhile: no longer this run's to write
            sealed = _sealed(run.sealer, key, spec.name, record.args_digest, _PAUSED, text)
            now = host.now()
            takeover = Takeover(record, owner, now, now, _PAUSED, sealed, doubt=(_PAUSED, sealed))
            if (yield from _take_over(takeover)) is not None:
                break
        else:  # still renewed under it: a finishing write (the record then expires with the ledger's ttl)
            yield from _finish(spec, run, Status.PAUSED, text, fail_closed=False)
    except LedgerError as error:
        host.emit(
            EventKind.LEDGER_ERROR,
            f"{describe(spec.name, key)} raised on its approval, and could not be kept paused for a new decision: "
            f"{error} A replay treats the call as running until its owner is known dead or its lease ends.",
            tool_name=spec.name,
            key=key,
        )
        return
    idempotency_key = call_idempotency_key(*key, spec.name)
    host.emit(
        EventKind.APPROVAL_REQUESTED,
        f"{describe(spec.name, key)} raised {type(exc).__name__} on its approval, which it spent, so its side "
        f"effect may have happened: look it up at the provider by the idempotency key {idempotency_key}. It is "
        f"kept paused for a new decision: {_approve_command(key)}, or replaysafe.approvals.approve(...); then "
        "call it again.",
        tool_name=spec.name,
        key=key,
        idempotency_key=idempotency_key,
    )


#: A record that says nothing of steps or approvals.
_NO_STATE = CallState()


def _call_state(spec: ToolSpec, host: Host, record: Record, sealer: Sealer | None) -> CallState:
    """What ``record`` (not finished) says of its call's steps and approvals, its seal checked first on a
    ledger that signs records (a paused record's always, result or not: it lets the call run again)."""
    return call_state(record, _trusted_text(spec, host, record, sealer))


def call_state(record: Record, text: str | None) -> CallState:
    """What ``record``, whose result reads ``text`` (its seal checked), says of its call's steps and approvals:
    the one reading of both forms, for a claim, an approver and ``approvals.state``."""
    if text is None or record.status is _COMPLETED or record.status is _FAILED:
        return _NO_STATE  # a finished record's text is its result
    if text.startswith(STATE_PREFIX):
        # Written by this library and sealed: unreadable only across versions. It then asks for an
        # approval rather than run a call that may have needed one.
        return parse_state(text) or CallState(requested=True)
    if not text.startswith(STEPS_PREFIX) or record.status not in (Status.PAUSED, Status.IN_DOUBT):
        return _NO_STATE
    try:
        names = json.loads(text[len(STEPS_PREFIX) :])
    except ValueError:
        return _NO_STATE
    if not isinstance(names, list) or not all(type(name) is str for name in names):
        return _NO_STATE
    return CallState(tuple(names))


def _recorded_steps(record: Record, state: CallState) -> RecordedSteps | None:
    """What ``record`` (paused, or in doubt) says of the steps its call made; ``None`` when it says
    nothing: no step was made, or it was written before steps were kept there."""
    if not state.steps or record.status not in (Status.PAUSED, Status.IN_DOUBT):
        return None
    return RecordedSteps(record.status, state.steps)


def _check_place(spec: ToolSpec, host: Host, parent: CallInfo, key: CallKey) -> Generator[Effect, Any, None]:
    """A step of a call run again after a pause or in doubt, before it is claimed: refused with
    ``ReplayMismatchError`` (nothing claimed, nothing run) when the last execution made another step at
    its place and that step is recorded. A step renamed or replaced meanwhile would otherwise find no
    record under its own key, and run its side effect again.

    The same step at its place, or one recorded at another place (steps reordered, or made in parallel
    threads), is answered by its own record, as before; a place the last execution did not reach is new
    work; a step made there that left no record (it raised, or its record expired) has nothing to run
    twice. Only a step at a place where another step was made reads the ledger (whether that step is
    recorded), and a ledger that cannot be read then raises: the step is not run unchecked.
    """
    assert isinstance(parent, RunningCall)
    recorded = parent.recorded_steps
    ordinal = step_ordinal(key, parent.key, spec.name)
    if recorded is None or ordinal is None:
        return  # not a step numbered in its parent (key="args", a business key)
    place = parent.place_of(spec.name, ordinal)
    if place is None or place > len(recorded.names):
        return
    was = recorded.names[place - 1]
    if was == spec.name or recorded.names.count(spec.name) >= ordinal:
        return
    was_key = step_key(parent.key, was, recorded.names[:place].count(was))
    found: Record | None = yield Get(was_key)
    if found is None:
        return
    parent.keep_recorded(place)
    message = (
        f"{describe(spec.name, key)} did not run: it is step {place} of {describe(parent.tool_name, parent.key)}, "
        f"whose last execution ({recorded.status}) made the step {was!r} at that place, and {was!r} is recorded "
        f"({ledger_command('show', was_key)}). A step renamed or replaced while its call is paused or in doubt "
        f"would run its side effect again under a new key, so nothing ran and the call stays {recorded.status}. "
        f"Run the step under its recorded name (@replay_safe(name={was!r})) until the call has finished, or "
        f"settle the call by hand: {_resolve_command(parent.key)} --result '<json>'."
    )
    host.emit(EventKind.MISMATCH, message, tool_name=spec.name, key=key)
    raise ReplayMismatchError(message, tool_name=spec.name, key=key)


# --- phase 1: claim -----------------------------------------------------------------


def _protocol(
    whole: bool,
    spec: ToolSpec,
    scope: CallScope,
    args_digest: str,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    timeout: float | None,
    sealer: Sealer | None,
    owner: str,
    host: Host,
) -> Protocol:
    """``begin`` (``whole`` false: returns the decision), or ``replay`` (``whole``: returns the result)."""
    key = scope.key
    lease = lease_length(spec.lease, timeout)
    parent = scope.parent
    if parent is not None and getattr(parent, "recorded_steps", None) is not None:
        yield from _check_place(spec, host, parent, key)  # a step of a call run again: the step recorded at its place
    decision: Replay | Run
    deadline: float | None = None
    backoff = _constants.WAIT_BACKOFF_FIRST
    while True:
        now = host.now()
        try:
            found: ClaimResult = yield new_tuple(Claim, (key, spec.name, args_digest, owner, now, now + lease))
        except LedgerError as exc:
            decision = _unprotected(spec, host, scope, exc, args, kwargs, timeout)
            break
        record = found.record
        if record.key != key:
            _report_moved(spec, host, key, record)
        mismatched = record.tool_name != spec.name or (
            record.args_digest != args_digest and not _recorded_earlier(spec, record, args, kwargs, args_digest)
        )
        # A paused call of this tool asked with other arguments may be an approver's edit: its approval says.
        if mismatched and (record.status is not _PAUSED or record.tool_name != spec.name):
            _report_mismatch(spec, host, record, args_digest)
        if found.claimed and record.attempt == 1 and _derived(key):
            # A key derived from the call (key="args", a business key) was another before rs1: a
            # record written under the earlier rules is this call's, and must replay, not run again.
            adopted = yield from _adopt_earlier(spec, host, key, args, kwargs, owner, args_digest, sealer)
            if adopted:
                continue  # its record is now under this key: read it as any recorded call
        # Our own record: a claim whose first answer was lost and was tried again.
        if found.claimed or (record.status is _RUNNING and record.owner == owner):
            if spec.needs_approval:  # its first run waits for an approval: kept paused, nothing runs
                yield from _ask_approval(spec, host, record, owner, _NO_STATE, sealer, claimed=True)
            decision = _run(spec, scope, record.attempt, args, kwargs, owner, timeout, host, lease, args_digest, sealer)
            break
        verdict = judge(record, now, host.owner_alive)
        if verdict is _REPLAY:
            value = _replayed(spec, host, record, sealer)
            if whole:  # the hot replay: its value, with no decision to build and unpack
                return value
            decision = Replay(value)
            break
        if verdict is _RAISE_RECORDED:
            error = recorded_error(spec, host, record, _trusted_text(spec, host, record, sealer))  # seal first
            host.emit(
                EventKind.REPLAYED,
                f"{describe(spec.name, key)} replayed its recorded error",
                tool_name=spec.name,
                key=key,
                attempt=record.attempt,
            )
            raise error
        if verdict is _IN_DOUBT or verdict is _RESUME:
            # A paused call is taken over as an in-doubt one is, without asking the policy:
            # its owner stopped on purpose, at a point where nothing was left half done. So its
            # seal is checked first: a record flipped to paused would run a finished call again.
            policy: InDoubt = "rerun"
            state = _call_state(spec, host, record, sealer)  # what its last execution left (seal checked)
            steps = _recorded_steps(record, state)
            # A call that runs only on an approval: each run spends one, and none runs twice on one.
            gated = spec.needs_approval or not state.plain
            if verdict is _RESUME and gated:
                granted = _granted(spec, host, record, state, args_digest, mismatched, now)  # raises if refused
                # One compare-and-set takes the call over and spends the approval: two workers, or a
                # retry, cannot both run on it; the running record says it ran on it, crash or not.
                running = CallState(state.steps, True, spent=granted.approval, answers=state.answers)
                digest = granted.args_digest
                spend = Takeover(
                    record,
                    owner,
                    now,
                    now + lease,
                    _RUNNING,
                    _sealed(sealer, key, spec.name, digest, _RUNNING, running.text()),
                    digest if digest != record.args_digest else None,
                    # Its outcome unknown, the tool has not run: the approval is put back, unspent, bound to
                    # the record as the takeover left it (its attempt).
                    (_PAUSED, _sealed(sealer, key, spec.name, digest, _PAUSED, _put_back(state, record).text())),
                )
                # A LedgerError is raised: an approved call never runs unprotected.
                spending: Record | None = yield from _take_over(spend)
                if spending is None:
                    continue  # decided again, or taken by another worker: look again
                ran_args, ran_kwargs = ((), granted.args) if granted.args is not None else (args, kwargs)
                decision = _run(
                    spec,
                    scope,
                    spending.attempt,
                    ran_args,
                    ran_kwargs,
                    owner,
                    timeout,
                    host,
                    lease,
                    digest,
                    sealer,
                    steps,
                )
                decision.approval, decision.answers = granted.approval, state.answers
                break
            if mismatched:
                _report_mismatch(spec, host, record, args_digest)
            if verdict is _IN_DOUBT:
                policy = scope.in_doubt if scope.in_doubt is not None else spec.in_doubt
                _report_in_doubt(spec, host, record, policy, gated)
            if gated and policy == "rerun":
                # Not run again on the approval it may have spent: kept paused for a new decision.
                yield from _ask_approval(spec, host, record, owner, state, sealer, claimed=False)
                continue  # decided or taken meanwhile: look again
            if policy == "raise":
                idempotency_key = call_idempotency_key(*key, spec.name)
                raise CallInDoubtError(
                    f"{describe(spec.name, key)} is in doubt: its owner died or gave up during attempt "
                    f"{record.attempt}, so its side effect may or may not have happened. Nothing ran. Look the "
                    f"effect up at the provider by the idempotency key {idempotency_key}, then settle it: "
                    f"{_resolve_command(key)} --result '<json>' if it happened, or --rerun if it did not.",
                    idempotency_key=idempotency_key,
                    owner=record.owner,  # an operator's detail, out of a message the model may be shown
                    tool_name=spec.name,
                    key=key,
                )
            carried = _carried(spec, record, state, sealer) if gated else ()
            try:
                taken: Record | None = yield from _take_over(Takeover(record, owner, now, now + lease, *carried))
            except LedgerError as exc:
                if gated:
                    raise  # a call that runs only on an approval never runs unprotected
                decision = _unprotected(spec, host, scope, exc, args, kwargs, timeout)
                break
            if taken is None:
                continue  # another worker moved first: look again
            if record.attempt == 1 and _derived(key):
                # Its first claim may have died before it looked for the call's record under the earlier
                # rules (rs0): look now, before the tool can run, for a call recorded there must replay.
                adopted = yield from _adopt_earlier(spec, host, key, args, kwargs, owner, args_digest, sealer)
                if adopted:
                    continue
            if callable(policy):
                owned = _run(
                    spec, scope, taken.attempt, args, kwargs, owner, timeout, host, lease, args_digest, sealer, steps
                )
                owned.approval, owned.gated, owned.answers = state.spent, gated, state.answers
                answer = yield from _reconcile(spec, policy, owned, record.attempt)
                if answer is not RERUN:
                    decision = Replay(answer)
                    break
                if gated:  # a rerun of a call that runs only on an approval waits for a new one
                    yield from _pause_for_approval(spec, owned, taken, state)
                # The tool runs now: under a lease made fresh for it (the takeover's was written
                # before the reconciler asked), and only if the call is still this owner's.
                now = host.now()
                try:
                    held = yield new_tuple(Renew, (key, owner, now + lease))
                except LedgerError as exc:
                    held = True  # cannot tell: run, as the takeover allowed (its record's write is fenced)
                    host.emit(
                        EventKind.LEDGER_ERROR,
                        f"{describe(spec.name, key)}: its reconciler asked for a rerun, and whether the call is "
                        f"still this worker's could not be read: {exc} It runs, as the takeover allowed; its record "
                        "is written only if no other worker took the call over meanwhile.",
                        tool_name=spec.name,
                        key=key,
                    )
                except GeneratorExit:
                    raise
                except BaseException:
                    # Interrupted here: the takeover is still this owner's. Left in doubt, as when
                    # the reconciler itself is interrupted, for the next replay to settle.
                    yield from _finish(
                        spec,
                        owned,
                        Status.IN_DOUBT,
                        _state_text(owned, Status.IN_DOUBT),
                        fail_closed=False,
                        reconciling=True,
                    )
                    raise
                if not held:
                    host.emit(
                        EventKind.DUPLICATE_DETECTED,
                        f"{describe(spec.name, key)} was taken over by another worker, or settled, while this one "
                        f"({owner}) asked its reconciler, which asked for a rerun: the tool does not run here, and "
                        f"the call is looked up again. See how it ends with {ledger_command('show', key)}.",
                        tool_name=spec.name,
                        key=key,
                        owner=owner,
                    )
                    continue
            decision = _run(
                spec, scope, taken.attempt, args, kwargs, owner, timeout, host, lease, args_digest, sealer, steps
            )
            break
        # A live owner runs this very call: wait for its result, with a bounded backoff.
        # The deadline is on the monotonic clock: a wall clock stepped back must not stretch it.
        if deadline is None:
            deadline = host.monotonic() + spec.wait_timeout
        left = deadline - host.monotonic()
        if left <= 0:
            raise CallInProgressError(
                f"{describe(spec.name, key)} is still running in another worker (attempt {record.attempt}, "
                f"lease until {record.lease_expires_at.isoformat()}); gave up waiting after {spec.wait_timeout:g}s. "
                "Retry later, or raise @replay_safe(wait_timeout=...).",
                owner=record.owner,  # an operator's detail, out of a message the model may be shown
                tool_name=spec.name,
                key=key,
            )
        yield Sleep(min(backoff, left))
        backoff = min(backoff * 2, _constants.WAIT_BACKOFF_MAX)
    if type(decision) is Run and decision.owner is not None and host.wanted(_STARTED):
        _report_started(spec, decision)
    if not whole:
        return decision
    # A plain call: the tool runs and its outcome is recorded, in this same generator (one
    # frame for the drivers to resume at each step, not ``begin`` nested in ``replay``).
    if isinstance(decision, Replay):
        return decision.value
    try:
        result = yield decision
    except GeneratorExit:
        raise
    except BaseException as exc:
        yield from settle_error(spec, scope, decision, exc)
        raise
    yield from settle_result(spec, decision, result)
    return result


#: ``begin(spec, scope, args_digest, args, kwargs, timeout, sealer, owner, host)``: claim the
#: call as ``owner``, then decide: a ``Replay`` of a recorded result, or a ``Run`` of the tool.
begin = functools.partial(_protocol, False)
#: ``replay(...)``, begin's arguments: the whole protocol of a plain (not streaming) call, in one
#: generator (``begin``'s, going on to run and settle); returns the tool's result.
replay = functools.partial(_protocol, True)
#: ``begin`` or ``replay``: the protocol a protected call is driven through.
Phase = Callable[..., Protocol]


def _recorded_earlier(
    spec: ToolSpec, record: Record, args: tuple[Any, ...], kwargs: Mapping[str, Any], args_digest: str
) -> bool:
    """Whether ``record``'s digest is this call's under the earlier rules (rs0): a record written
    before rs1 (an argument at its default, a float with an integral value) is the same call."""
    return (
        spec.earlier is not None and record.args_digest in spec.earlier(record.key, args, kwargs, args_digest).digests
    )


def _derived(key: CallKey) -> bool:
    """Whether ``key`` is derived from the call (``key="args"``, a business key): another key before rs1."""
    return key.message_id == ARGS_MESSAGE_ID or key.thread_id == BUSINESS_THREAD_ID


def _adopt_earlier(
    spec: ToolSpec,
    host: Host,
    key: CallKey,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    owner: str,
    args_digest: str,
    sealer: Sealer | None,
) -> Generator[Effect, Any, bool]:
    """After a first claim of a derived key: a record of this call under its earlier (rs0) key, if
    any, copied to ``key`` (which this owner holds); ``True`` when copied. A finished one is copied
    (its seal checked first); one still running, paused or in doubt there cannot be: the claim is
    released and a named error says how to settle it, for running the tool would run it twice."""
    if spec.earlier is None:
        return False
    for earlier_key in spec.earlier(key, args, kwargs, args_digest).keys:
        if earlier_key == key:
            continue
        try:
            found: Record | None = yield Get(earlier_key)
            if found is None or found.tool_name != spec.name:
                continue
            if found.status is Status.COMPLETED or found.status is Status.FAILED:
                text = _trusted_text(spec, host, found, sealer)
                sealed = text if sealer is None else sealer.seal(key, spec.name, args_digest, found.status, text)
                yield Complete(key, owner, found.status, sealed, host.now())
                return True
        except GeneratorExit:
            raise
        except BaseException:
            yield from _released(key, owner)
            raise
        yield from _released(key, owner)
        command = ledger_command("show", earlier_key)
        if found.status is _RUNNING:
            raise CallInProgressError(
                f"{describe(spec.name, key)} is running under the key the earlier key rules (rs0) gave it, in a "
                f"worker of an earlier version (attempt {found.attempt}); nothing ran here. Retry when it has ended: "
                f"its result is then replayed. See it with {command}.",
                owner=found.owner,
                tool_name=spec.name,
                key=key,
            )
        idempotency_key = call_idempotency_key(*earlier_key, spec.name)
        raise CallInDoubtError(
            f"{describe(spec.name, key)} is {found.status} under the key the earlier key rules (rs0) gave it "
            f"({earlier_key}); nothing ran here. Settle that record first: {_resolve_command(earlier_key)} "
            "--result '<json>' if its side effect happened, or --rerun if it did not; then call again.",
            idempotency_key=idempotency_key,
            owner=found.owner,
            tool_name=spec.name,
            key=key,
        )
    return False


def _released(key: CallKey, owner: str) -> Generator[Effect, Any, None]:
    """Give back a claim this owner holds, a failure to do so left to its lease."""
    with contextlib.suppress(LedgerError):
        yield Release(key, owner)


def _replayed(spec: ToolSpec, host: Host, record: Record, sealer: Sealer | None) -> Any:
    """The recorded result of a completed call, as the tool returned it."""
    text = record.result
    # Stored text with none of the reserved prefixes, on a ledger that does not seal, is the
    # serializer's output as it wrote it: nothing to check or strip.
    if sealer is not None or (text is not None and text.startswith(_unrecorded.RESERVED_PREFIXES)):
        text = _trusted_text(spec, host, record, sealer)
        unrecorded = _unrecorded.parse(text)
        if unrecorded is not None:
            raise _not_recorded(spec, host, record, unrecorded)
    try:
        value = spec.decode(text)
    except Exception as exc:
        # The call ran: never run it again, and never quote the stored value
        # (a decode error's text often does), so the cause is not chained.
        raise _unreadable(spec, host, record, f"its result cannot be decoded ({type(exc).__name__})") from None
    if host.wanted(_REPLAYED):  # the hot path: build no message nobody reads
        host.emit(
            _REPLAYED,
            f"{describe(spec.name, record.key)} replayed its recorded result",
            tool_name=spec.name,
            key=record.key,
            attempt=record.attempt,
        )
    return value


def _report_moved(spec: ToolSpec, host: Host, key: CallKey, record: Record) -> None:
    """The store answered for ``key`` with another call's record: a row moved to this call's
    key (its seal, made for the other call, would check). Never replayed, never run."""
    message = (
        f"the ledger answered {describe(spec.name, key)} with the record of another call "
        f"({describe(record.tool_name, record.key)}): it was moved or copied in the store. It is not "
        "returned as a result and nothing ran. Inspect the store (who can write to it?), then delete the "
        "record under this call's key."
    )
    host.emit(EventKind.TAMPERED, message, tool_name=spec.name, key=key)
    raise TamperedRecordError(message, tool_name=spec.name, key=key)


def _report_in_doubt(spec: ToolSpec, host: Host, record: Record, policy: InDoubt, gated: bool = False) -> None:
    rerun = (
        "It runs only on an approval, so it is not run again: it waits for a new decision."
        if gated
        else f"Running it again as attempt {record.attempt + 1}; hand current_call().idempotency_key to the "
        "provider so it can dedupe."
    )
    then = {
        "rerun": rerun,
        "raise": "Raising CallInDoubtError (in_doubt='raise'); settle it with "
        f"{_resolve_command(record.key)} --result '<json>' or --rerun.",
    }.get(policy if isinstance(policy, str) else "", f"Asking the reconciler {_callable_name(policy)}.")
    idempotency_key = call_idempotency_key(*record.key, spec.name)
    host.emit(
        EventKind.IN_DOUBT,
        f"{describe(spec.name, record.key)} is in doubt: its owner {record.owner} died or gave up while the tool "
        f"ran (attempt {record.attempt}), so its side effect may or may not have happened (idempotency key "
        f"{idempotency_key}). {then}",
        tool_name=spec.name,
        key=record.key,
        owner=record.owner,
        attempt=record.attempt,
        idempotency_key=idempotency_key,
    )


def _callable_name(function: object) -> str:
    # Never repr(): a functools.partial's repr quotes its bound arguments.
    return str(getattr(function, "__qualname__", None) or type(function).__qualname__)


def _trusted_text(spec: ToolSpec, host: Host, record: Record, sealer: Sealer | None) -> str | None:
    """The record's encoded result, its seal checked when the ledger signs records."""
    if sealer is None:
        return unsealed(record.result)
    try:
        return sealer.open(record)
    except TamperedRecordError as exc:
        host.emit(EventKind.TAMPERED, str(exc), tool_name=spec.name, key=record.key, owner=record.owner)
        raise


def _reconcile(spec: ToolSpec, reconciler: Reconciler, owned: Run, in_doubt: int) -> Generator[Effect, Any, Any]:
    """Ask the reconciler about attempt ``in_doubt`` of the call ``owned`` (taken over, with
    a new attempt number); record the result it found, or return RERUN."""
    call = owned.call._replace(attempt=in_doubt)
    try:
        answer = yield Reconcile(reconciler, call, owned)
        if answer is RERUN:
            return RERUN
        encoded = spec.serializer.dumps(answer)
    except BaseException as exc:
        if isinstance(exc, GeneratorExit):
            raise
        # Nothing was settled: leave the call in doubt for the next replay (or an operator).
        add_note(
            exc,
            f"raised by the reconciler {_callable_name(reconciler)} of {describe(spec.name, call.key)} (attempt "
            f"{owned.call.attempt}); the call stays in doubt: the next replay asks again, or settle it with "
            f"{_resolve_command(call.key)} --result '<json>' or --rerun",
        )
        yield from _finish(
            spec, owned, Status.IN_DOUBT, _state_text(owned, Status.IN_DOUBT), fail_closed=False, reconciling=True
        )
        raise
    recorded = yield from _finish(
        spec, owned, Status.COMPLETED, encoded, fail_closed=True, result=answer, reconciling=True
    )
    outcome = "which is now recorded" if recorded else "which could not be recorded (see its earlier event)"
    owned.host.emit(
        EventKind.RECONCILED,
        f"{describe(spec.name, call.key)} was in doubt; the reconciler found its result, {outcome}",
        tool_name=spec.name,
        key=call.key,
        attempt=call.attempt,
    )
    return answer


def _unprotected(
    spec: ToolSpec,
    host: Host,
    scope: CallScope,
    exc: LedgerError,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    timeout: float | None,
) -> Run:
    """The ledger cannot be read: fail closed, or run the tool without protection.

    Only a transient fault may run the tool unprotected: a permanent one (a bad URL, a
    missing table, a denied permission) would do so on every call, so it always raises.
    """
    key = scope.key
    if spec.on_ledger_error == "raise" or exc.permanent or spec.needs_approval:
        # A tool that runs only on an approval never runs unprotected: nothing would check one.
        host.emit(EventKind.LEDGER_ERROR, str(exc), tool_name=spec.name, key=key)
        raise exc
    host.emit(
        EventKind.LEDGER_ERROR,
        f"{describe(spec.name, key)} runs WITHOUT replay protection: {exc} Skipping a tool that never ran is "
        "worse than running it twice; pass @replay_safe(on_ledger_error='raise') to fail closed instead.",
        tool_name=spec.name,
        key=key,
        level=30,  # WARNING: the call goes on
    )
    call = RunningCall.of(scope, spec.name, 1, args, kwargs)
    return Run(call, None, timeout, host, host.monotonic(), lease_length(spec.lease, timeout))


# --- approvals: the call that runs only on one ---------------------------------------------


def _sealed(sealer: Sealer | None, key: CallKey, tool_name: str, digest: str, status: Status, text: str) -> str:
    return text if sealer is None else sealer.seal(key, tool_name, digest, status, text)


def _approve_command(key: CallKey) -> str:
    return f"{ledger_command('approve', key)} --by <name> (or reject)"


def _ask_approval(
    spec: ToolSpec, host: Host, record: Record, owner: str, state: CallState, sealer: Sealer | None, *, claimed: bool
) -> Generator[Effect, Any, None]:
    """Keep the call paused for a decision, then raise ``ApprovalRequiredError``; nothing runs. ``claimed``:
    this owner holds the call's first claim (its record is finished as paused); else ``record`` (in doubt)
    is taken over into a paused one, and a ``None`` return means it changed meanwhile (look again)."""
    key = record.key
    may_have_run = state.may_have_run or state.spent is not None
    paused = CallState(state.steps, True, may_have_run=may_have_run, answers=state.answers)
    text = _sealed(sealer, key, spec.name, record.args_digest, _PAUSED, paused.text())
    attempt = record.attempt
    if claimed:
        yield new_tuple(Complete, (key, owner, _PAUSED, text, host.now()))
    else:
        now = host.now()
        taken: Record | None = yield from _take_over(Takeover(record, owner, now, now, _PAUSED, text))
        if taken is None:
            return
        attempt = taken.attempt
    _approval_required(spec, host, key, may_have_run, announce=True, attempt=attempt)


def _put_back(state: CallState, record: Record) -> CallState:
    """``state``, its approval bound to the record a takeover of ``record`` leaves (the next attempt)."""
    decision = state.decision
    if decision is None:
        return state
    return dataclasses.replace(state, decision=dataclasses.replace(decision, attempt=record.attempt + 1))


def _take_over(takeover: Takeover) -> Generator[Effect, Any, Record | None]:
    """``takeover``'s new record, or ``None`` when the record changed first. A takeover whose answer was
    lost, tried again, finds the record it wrote and answers ``None``: the record is read again, and one
    this owner holds as the very next attempt is this takeover's (an owner token is one call's)."""
    taken: Record | None = yield takeover
    if taken is not None:
        return taken
    found: Record | None = yield Get(takeover.key)
    before = takeover.record
    if (
        found is not None
        and found.owner == takeover.owner
        and found.attempt == before.attempt + 1
        and found.status is takeover.status
    ):
        return found
    return None


def _pause_for_approval(spec: ToolSpec, owned: Run, taken: Record, state: CallState) -> Generator[Effect, Any, None]:
    """A reconciler asked to rerun a call that runs only on an approval: its record (``taken``, which this
    owner holds) is taken over into a paused one for a new decision; ``ApprovalRequiredError``. A takeover,
    not a finishing write: a paused record that says an attempt may have run never expires."""
    key, host = owned.call.key, owned.host
    may_have_run = state.may_have_run or state.spent is not None
    paused = CallState(state.steps, True, may_have_run=may_have_run, answers=state.answers)
    text = _sealed(owned.sealer, key, spec.name, taken.args_digest, _PAUSED, paused.text())
    now = host.now()
    paused_record = yield from _take_over(Takeover(taken, owned.owner or "", now, now, _PAUSED, text))
    attempt = None if paused_record is None else paused_record.attempt
    _approval_required(spec, host, key, may_have_run, announce=True, attempt=attempt)


def _approval_required(
    spec: ToolSpec, host: Host, key: CallKey, may_have_run: bool, *, announce: bool, attempt: int | None
) -> None:
    idempotency_key = call_idempotency_key(*key, spec.name)
    warning = (
        f" Its last attempt ran on an approval and did not finish, so its side effect may have happened: look it "
        f"up at the provider by the idempotency key {idempotency_key} before deciding again."
        if may_have_run
        else ""
    )
    message = (
        f"{describe(spec.name, key)} runs only on an approval, and has none to spend: nothing ran, and the call "
        f"is kept paused for a decision.{warning} Decide it with {_approve_command(key)}, or "
        "replaysafe.approvals.approve(...); then call it again."
    )
    if announce:
        host.emit(EventKind.APPROVAL_REQUESTED, message, tool_name=spec.name, key=key, idempotency_key=idempotency_key)
    raise ApprovalRequiredError(
        message,
        may_have_run=may_have_run,
        idempotency_key=idempotency_key,
        tool_name=spec.name,
        key=key,
        attempt=attempt,
    )


def _granted(
    spec: ToolSpec, host: Host, record: Record, state: CallState, args_digest: str, mismatched: bool, now: datetime
) -> Granted:
    """The approval that lets this call of a paused record run; else the refusal, raised (nothing runs, the
    call stays paused)."""
    key = record.key
    verdict = check(
        state.decision,
        key=key,
        tool_name=spec.name,
        args_digest=args_digest,
        now=now,
        digest_of=spec.digest_of,
        attempt=record.attempt,
    )
    if isinstance(verdict, Granted):
        return verdict
    if verdict.reason == "missing" and mismatched:
        verdict = Refusal("mismatch", "it was paused for a decision with other arguments")
    if verdict.reason == "spent" and state.decision is not None:
        # Written into an earlier record of the call, since spent (restored in the store): it runs nothing.
        host.emit(
            EventKind.APPROVAL_REFUSED,
            f"{describe(spec.name, key)}: its approval by {state.decision.by} was spent by an earlier attempt of "
            "the call, which it does not run again",
            tool_name=spec.name,
            key=key,
            approver=state.decision.by,
            reason="spent",
        )
    if verdict.reason == "spent" or verdict.reason == "missing":
        _approval_required(spec, host, key, state.may_have_run, announce=False, attempt=record.attempt)
    decision = state.decision
    if verdict.reason == "rejected":
        assert decision is not None
        raise ApprovalRejectedError(
            f"{describe(spec.name, key)} was rejected by {decision.by} (its reason is in .reason): it does not run. "
            f"A new decision replaces this one: {_approve_command(key)}.",
            by=decision.by,
            reason=decision.reason,
            tool_name=spec.name,
            key=key,
        )
    if verdict.reason == "expired":
        assert decision is not None
        assert decision.expires_at is not None
        message = (
            f"{describe(spec.name, key)} did not run: its approval by {decision.by} expired at "
            f"{decision.expires_at.isoformat()}. The call stays paused: approve it again with {_approve_command(key)}."
        )
        host.emit(
            EventKind.APPROVAL_REFUSED, message, tool_name=spec.name, key=key, approver=decision.by, reason="expired"
        )
        raise ApprovalExpiredError(message, tool_name=spec.name, key=key)
    by = None if decision is None else decision.by
    message = (
        f"{describe(spec.name, key)} did not run: its approval{'' if by is None else f' (by {by})'} is not for "
        f"this call: {verdict.what}, and the call was asked with arguments of digest {args_digest[:12]}. An "
        f"approval runs only what it approved. The call stays paused for a new decision: {_approve_command(key)}."
    )
    host.emit(
        EventKind.APPROVAL_REFUSED,
        message,
        tool_name=spec.name,
        key=key,
        approver=by,
        reason="mismatch",
        args_digest=args_digest,
    )
    raise ApprovalMismatchError(message, tool_name=spec.name, key=key)


def _carried(
    spec: ToolSpec, record: Record, state: CallState, sealer: Sealer | None
) -> tuple[Status, str, None, tuple[Status, str]]:
    """A takeover's last fields for a call that runs only on an approval, taken over to ask its
    reconciler: its record keeps its approval state, crash or not."""
    spent = state.spent
    may_have_run = state.may_have_run or spent is not None
    kept = CallState(state.steps, True, spent=spent, may_have_run=may_have_run, answers=state.answers)
    key, digest = record.key, record.args_digest
    return (
        _RUNNING,
        _sealed(sealer, key, spec.name, digest, _RUNNING, kept.text()),
        None,
        (Status.IN_DOUBT, _sealed(sealer, key, spec.name, digest, Status.IN_DOUBT, kept.text())),
    )


# --- phase 2: record ------------------------------------------------------------------


def _unstorable(encoded: object) -> str | None:
    """Why a serializer's output is text no store can hold, if it is: such a write would fail
    every time, and must not be mistaken for a ledger that is briefly down."""
    if type(encoded) is not str:
        return f"the serializer returned a {type(encoded).__name__}, not a str"
    if "\x00" in encoded:  # PostgreSQL text cannot hold NUL
        return "its encoding holds a NUL character"
    if not encoded.isascii():
        try:
            encoded.encode("utf-8")
        except UnicodeEncodeError:
            return "its encoding holds a lone surrogate, which is not UTF-8"
    return None


def settle_result(spec: ToolSpec, run: Run, result: Any) -> Generator[Effect, Any, bool | None]:
    """Record the value the tool returned: the protocol that does it.

    A plain function returning the generator to drive (not a generator itself): the common
    case hands back ``_finish``'s own, one generator fewer per call for the drivers to resume.
    """
    if run.owner is None:
        return _nothing()
    marker: str | None = None
    try:
        encoded = spec.serializer.dumps(result)
    except Exception as exc:
        # A custom serializer's error text may quote the value; the built-in codec's refusal
        # names types only, and says which part of the result it cannot rebuild.
        builtin = isinstance(exc, ResultEncodingError) and isinstance(spec.serializer, JsonSerializer)
        why = str(exc) if builtin else f"the serializer raised {type(exc).__name__}"
        marker = _unrecorded.mark("not_encodable", result)
    else:
        unstorable = _unstorable(encoded)
        if unstorable is not None:
            marker, why = _unrecorded.mark("not_encodable", result), unstorable
        elif _unrecorded.is_reserved(encoded):
            marker, why = _unrecorded.mark("not_encodable", result), "its encoding starts with a reserved prefix"
        elif len(encoded) > spec.max_result_bytes:
            marker = _unrecorded.mark("too_large", result, len(encoded))
            why = f"its encoded size, {len(encoded)} bytes, is over max_result_bytes={spec.max_result_bytes}"
    if marker is not None:
        return _record_unrecordable(spec, run, result, marker, why)
    return _finish(spec, run, _COMPLETED, encoded, fail_closed=True, result=result, executed=True)


def _nothing() -> Generator[Effect, Any, None]:
    return
    yield  # a generator: it yields nothing


def _record_unrecordable(spec: ToolSpec, run: Run, result: Any, marker: str, why: str) -> Generator[Effect, Any, None]:
    """The tool ran, but its result cannot be recorded: record it as finished, without its result,
    so that it never runs again."""
    key = run.call.key
    idempotency_key = call_idempotency_key(*key, spec.name)
    message = (
        f"{describe(spec.name, key)} ran, but its result (a {_unrecorded.type_name(result)}) cannot be "
        f"recorded: {why}. The call is recorded as finished without its result, so a replay raises "
        f"ResultEncodingError and never runs it again (idempotency key {idempotency_key}); settle it with "
        f"{_resolve_command(key)} --result '<json>'. Return JSON-able data of "
        "a bounded size, raise max_result_bytes, or pass a serializer=."
    )
    # Said before the write, as every reason for an unrecorded result is said before ``executed``
    # (a write that fails then adds its own ledger_error).
    run.host.emit(EventKind.LEDGER_ERROR, message, tool_name=spec.name, key=key, attempt=run.call.attempt)
    yield from _finish(
        spec, run, Status.COMPLETED, marker, fail_closed=True, result=result, executed=True, result_in_record=False
    )
    if spec.on_ledger_error == "raise":
        raise ResultEncodingError(message, tool_name=spec.name, key=key, idempotency_key=idempotency_key, result=result)


#: Set on an exception that paused a protected call, so that the calls it passes through pause too.
_PAUSED_BELOW = "__replaysafe_paused__"


def settle_error(spec: ToolSpec, scope: CallScope, run: Run, exc: BaseException) -> Generator[Effect, Any, None]:
    """Record how a run that raised ended. Never raises: the tool's exception wins."""
    if run.owner is None:
        return
    key = run.call.key
    if isinstance(exc, ToolTimeoutError):
        run.host.emit(EventKind.TIMEOUT, str(exc), tool_name=spec.name, key=key, attempt=run.call.attempt)
        if exc.still_running:
            return  # the claim stays: the tool may still finish and record its result
        yield from _finish(spec, run, Status.IN_DOUBT, _state_text(run, Status.IN_DOUBT), fail_closed=False)
    elif isinstance(exc, scope.pauses) or getattr(exc, _PAUSED_BELOW, False):
        # A pause (human in the loop) is not an outcome: the call is kept as paused, with its
        # completed steps, for the resume. Checked before the BaseException rule below: some
        # frameworks' pauses are BaseExceptions (10xGraph's GraphInterrupt). A pause that a step
        # recorded pauses every call it passes through on its way up, whatever their pause_on:
        # recorded as a parent's failure, it would make the approved resume raise it forever.
        with contextlib.suppress(AttributeError, TypeError):  # an exception that takes no attribute
            setattr(exc, _PAUSED_BELOW, True)
        yield from _finish(spec, run, Status.PAUSED, _state_text(run, Status.PAUSED), fail_closed=False)
        run.host.emit(
            EventKind.PAUSED,
            f"{describe(spec.name, key)} paused ({type(exc).__name__}); the next call of the same key runs it "
            "again, and its completed steps replay",
            tool_name=spec.name,
            key=key,
            attempt=run.call.attempt,
        )
    elif isinstance(exc, CONTROL_ERRORS) and (recorded := _run_again(run.call)) is not None:
        # Run again and stopped by replaysafe itself (a step refused, as not the one recorded at its place or
        # with other arguments; a step in progress elsewhere, or in doubt; a ledger that cannot be read): the
        # call is kept as its last execution left it, paused or in doubt, with its steps, so that the next run
        # is checked again. Released, it would run with nothing to check its steps against.
        yield from _finish(spec, run, recorded.status, _state_text(run, recorded.status), fail_closed=False)
    elif not isinstance(exc, Exception):
        # Cancelled, interrupted, or a stream closed early: whether the side effect happened is unknown.
        yield from _finish(spec, run, Status.IN_DOUBT, _state_text(run, Status.IN_DOUBT), fail_closed=False)
    elif run.approval is not None and (not isinstance(exc, spec.record_errors) or isinstance(exc, CONTROL_ERRORS)):
        # Ran on an approval, now spent: its retry runs on a new one. Kept paused rather than released, so that
        # the record keeps the ids of the answers it was decided on: released, it would forget them, and the
        # framework's copy of the same answer would approve the retry (one approval, two runs).
        yield from _pause_raised_on_approval(spec, run, exc)
    elif not isinstance(exc, spec.record_errors) or isinstance(exc, CONTROL_ERRORS):
        # Other errors free the call for a retry; so does replaysafe's own (a step in progress, in
        # doubt or mismatched), which says nothing of how the tool would end: never its recorded failure.
        try:
            yield Release(key, run.owner)
        except LedgerError as error:
            run.host.emit(
                EventKind.LEDGER_ERROR,
                f"{describe(spec.name, key)} raised, and its claim could not be released: {error} A replay treats "
                "the call as running until its owner is known dead or its lease ends.",
                tool_name=spec.name,
                key=key,
            )
    else:
        yield from _finish(spec, run, Status.FAILED, encode_error(exc), fail_closed=False)


def _run_again(call: CallInfo) -> RecordedSteps | None:
    """What the record of the call's last execution said of its steps, if ``call`` runs it again."""
    return call.recorded_steps if isinstance(call, RunningCall) else None


def report_late(spec: ToolSpec, run: Run) -> None:
    """A tool under the built-in timeout has ended: that timeout never interrupts a tool (a sync one
    runs in the caller's thread, an async one is not cancelled), so a run past it is reported now
    (its outcome is recorded as usual)."""
    ran = run.host.monotonic() - run.started
    if run.timeout is None or ran <= run.timeout:
        return
    run.host.emit(
        EventKind.TIMEOUT,
        f"{describe(spec.name, run.call.key)} ran {ran:.1f}s, past its default {run.timeout:g}s timeout "
        f"(attempt {run.call.attempt}). The default timeout never interrupts a tool (a sync one runs in "
        "the caller's thread, an async one is not cancelled); its lease was not kept past the deadline, so "
        "another host may have taken the call over as in doubt (a duplicate_detected event follows if so). Its "
        "outcome is recorded now. Give the tool timeout= for a hard deadline, or timeout=None for none.",
        tool_name=spec.name,
        key=run.call.key,
        attempt=run.call.attempt,
        duration=ran,
    )


def _finish(
    spec: ToolSpec,
    run: Run,
    status: Status,
    encoded: str | None,
    *,
    fail_closed: bool,
    result: Any = None,
    executed: bool = False,
    result_in_record: bool = True,
    reconciling: bool = False,
) -> Generator[Effect, Any, bool]:
    """Write how the call ended; a write that fails is logged (or raised, fail-closed). Returns
    whether the record was written. ``executed``: the tool returned, which the ``executed`` event
    reports once the write is done (when anyone listens then), with whether its result is now
    recorded (never when ``result_in_record`` is false: the record holds a marker instead).
    ``reconciling``: the write is a reconciler's, made without running the tool."""
    key, owner, host = run.call.key, run.owner, run.host
    assert owner is not None
    text = encoded
    # A finished or paused record is sealed even without a result: on read, an unsealed one is a forgery.
    if run.sealer is not None and (encoded is not None or status is not Status.IN_DOUBT):
        encoded = run.sealer.seal(key, spec.name, run.args_digest, status, encoded)
    try:
        recorded = yield new_tuple(Complete, (key, owner, status, encoded, host.now()))
    except LedgerError as exc:
        if not reconciling:
            done = "ran"
            then = "A replay may run it again; hand current_call().idempotency_key to the provider so it can dedupe."
        else:  # the tool did not run here: a reconciler answered (COMPLETED) or raised (IN_DOUBT)
            done = "was reconciled" if status is Status.COMPLETED else "had its reconciler raise"
            then = f"The next replay asks the reconciler again; or settle it with {_resolve_command(key)}."
        host.emit(
            EventKind.LEDGER_ERROR,
            f"{describe(spec.name, key)} {done} but its {status} record could not be written: {exc} {then}",
            tool_name=spec.name,
            key=key,
        )
        if executed and host.wanted(_EXECUTED):
            _report_executed(spec, run, recorded=False)
        if fail_closed and spec.on_ledger_error == "raise":
            exc.result = result
            raise
        return False
    if not recorded:
        if reconciling:  # the tool did not run here: only the reconciler's answer (or failure) is lost
            asked = "whose answer is not recorded" if status is Status.COMPLETED else "which raised"
            message = (
                f"{describe(spec.name, key)} was taken over by another worker while this one ({owner}) asked its "
                f"reconciler, {asked}; the tool did not run here, so nothing here is to undo. The other worker's "
                f"record is kept: see how it ends with {ledger_command('show', key)}."
            )
        else:
            message = (
                f"duplicate execution of {describe(spec.name, key)}: its claim was taken over by another worker "
                f"while this one ({owner}) ran the tool, so the tool ran twice. The other worker's record is kept."
            )
        host.emit(EventKind.DUPLICATE_DETECTED, message, tool_name=spec.name, key=key, owner=owner)
        if not reconciling and (status is _COMPLETED or status is _FAILED):
            yield from _keep_late(spec, run, status, text, result)
    if executed and host.wanted(_EXECUTED):  # asked after the write: a listener may subscribe meanwhile
        _report_executed(spec, run, recorded=bool(recorded) and result_in_record)
    return bool(recorded)


def _keep_late(spec: ToolSpec, run: Run, status: Status, text: str | None, result: Any) -> Generator[Effect, Any, None]:
    """A run ended (``status``: completed or failed) after its call was settled elsewhere: its outcome is
    kept beside the call's record, as a record of its own (``late_key``), never in its place; a
    ``late_result`` event says both outcomes; the tool's ``on_late_result`` hook is handed it."""
    key, owner, host = run.call.key, run.owner, run.host
    assert owner is not None
    late = late_key(key, run.call.attempt)
    settled: Record | None = None
    kept = False
    try:
        settled = yield Get(key)
        now = host.now()
        found: ClaimResult = yield new_tuple(Claim, (late, spec.name, run.args_digest, owner, now, now + run.lease))
        if found.claimed or (found.record.status is _RUNNING and found.record.owner == owner):
            sealed = text if run.sealer is None else run.sealer.seal(late, spec.name, run.args_digest, status, text)
            kept = bool((yield new_tuple(Complete, (late, owner, status, sealed, now))))
    except LedgerError as exc:
        host.emit(
            EventKind.LEDGER_ERROR,
            f"{describe(spec.name, key)} ended after its call was settled elsewhere, and its late outcome could not "
            f"be kept beside its record: {exc}",
            tool_name=spec.name,
            key=key,
        )
    was = "removed, to run again" if settled is None else f"{settled.status} in attempt {settled.attempt}"
    where = f"kept beside it ({ledger_command('show', key)})" if kept else "not kept (see the ledger_error before)"
    hook = spec.on_late_result
    host.emit(
        EventKind.LATE_RESULT,
        f"{describe(spec.name, key)}: attempt {run.call.attempt} {status} after its call was settled elsewhere "
        f"({was}). The settlement stands; this late outcome is {where}"
        + (f", and handed to {_callable_name(hook)}" if hook is not None else "")
        + ". If both took effect, settle the duplicate at the provider (idempotency key "
        f"{call_idempotency_key(*key, spec.name)}).",
        tool_name=spec.name,
        key=key,
        attempt=run.call.attempt,
        owner=owner,
    )
    if hook is not None:
        yield Notify(hook, LateResult(run.call, status, result if status is _COMPLETED else None, settled))


def _report_started(spec: ToolSpec, run: Run) -> None:
    """The ``started`` event: the tool's body is about to run, as this attempt. A body that then raises,
    pauses or is killed has no ``executed`` event: counting starts is how a test sees it ran at all."""
    key = run.call.key
    run.host.emit(
        _STARTED,
        f"{describe(spec.name, key)} starts (attempt {run.call.attempt})",
        tool_name=spec.name,
        key=key,
        attempt=run.call.attempt,
    )


def _report_executed(spec: ToolSpec, run: Run, *, recorded: bool) -> None:
    """The ``executed`` event: the tool returned, and whether its result is recorded (not when
    the write failed, another worker took the call over meanwhile, or the result could not be
    stored)."""
    key, host = run.call.key, run.host
    if recorded:
        outcome = "its result is recorded"
    else:
        # That event says why, and whether a failed write is tried again in the background.
        outcome = "its result is not recorded (the ledger_error or duplicate_detected event before this says why)"
    host.emit(
        _EXECUTED,
        f"{describe(spec.name, key)} ran; {outcome}",
        tool_name=spec.name,
        key=key,
        attempt=run.call.attempt,
        duration=host.monotonic() - run.started,
        recorded=recorded,
    )


# --- settling a call by hand -----------------------------------------------------------


def resolve(
    key: CallKey,
    encode: Callable[[], str] | None,
    *,
    force: bool,
    sealer: Sealer | None,
    owner: str,
    host: Host,
) -> Generator[Effect, Any, Record | None]:
    """Settle a call by hand: record the result ``encode()`` gives, or (``encode`` is
    ``None``) remove the record so the call runs again (a call decided on answers: keep it
    paused for a new decision, with their ids). Returns the new record.

    Only a call in doubt, or finished without a readable result, is settled unless
    ``force``; nor one whose owner still runs (it would find its claim gone when it
    finishes, and report a duplicate execution).
    """
    record: Record | None = yield Get(key)
    if record is None:
        raise LookupError(f"no record for {key}: nothing to resolve")
    # A finished call whose result was not recorded (or cannot be read) is settled here too.
    unrecorded = record.status is Status.COMPLETED and _unrecorded.parse(unsealed(record.result)) is not None
    if record.status not in (Status.RUNNING, Status.IN_DOUBT, Status.PAUSED) and not (unrecorded or force):
        raise ValueError(
            f"the call {key} is already {record.status}; to allow a rerun, delete its record "
            f"({ledger_command('delete', key)}), or settle it anyway ({ledger_command('resolve', key)} "
            "--force) if its recorded result cannot be read"
        )
    now = host.now()
    if not force and record.status is Status.RUNNING and judge(record, now, host.owner_alive) is Verdict.WAIT:
        raise ValueError(
            f"the call {key} is still running in {record.owner}, which is alive: wait for it, or settle it "
            f"anyway ({ledger_command('resolve', key)} --force) if you know it is stuck"
        )
    encoded = None if encode is None else encode()
    if encoded is not None and sealer is not None:
        encoded = sealer.seal(key, record.tool_name, record.args_digest, Status.COMPLETED, encoded)
    answers = answers_a_rerun_keeps(record, sealer) if encoded is None else ()
    takeover = Takeover(record, owner, now, now)
    if answers:
        # Decided on a human's answers: removed, the record would forget their ids, and a framework's copy of an
        # answer the call ran on would approve the rerun. Kept paused for a new decision instead, in the takeover
        # itself (a finishing write would expire with the ledger's ttl).
        text = CallState(requested=True, answers=answers).text()
        sealed = _sealed(sealer, key, record.tool_name, record.args_digest, _PAUSED, text)
        takeover = Takeover(record, owner, now, now, _PAUSED, sealed, doubt=(_PAUSED, sealed))
    taken: Record | None = yield takeover
    if taken is None:
        raise RuntimeError(f"the record of {key} changed while resolving it; look at it again and retry")
    settled: Record | None = taken if answers else None
    if not answers and encoded is None:
        yield Release(key, owner)
    elif not answers:
        yield Complete(key, owner, Status.COMPLETED, encoded, now)
        settled = yield Get(key)
    done = "result recorded" if encoded is not None else "rerun, on a new decision" if answers else "rerun"
    host.emit(
        EventKind.RECONCILED,
        f"{record.tool_name} ({key}) was settled by hand: {done}",
        tool_name=record.tool_name,
        key=key,
        attempt=record.attempt,
    )
    return settled


def answers_a_rerun_keeps(record: Record, sealer: Sealer | None) -> tuple[str, ...]:
    """The ids of the answers a rerun by hand of ``record`` keeps; ``ValueError`` (nothing changed) when the
    record says it keeps some and its seal cannot be checked: the paused record that keeps them must be sealed,
    and a record whose seal does not check says nothing that can be trusted, nor may it be removed on that word."""
    unchecked = call_state(record, unsealed(record.result)).answers
    if not unchecked or (sealer is None and not is_sealed(record.result)):
        return unchecked
    call = describe(record.tool_name, record.key)
    if sealer is None:
        raise ValueError(
            f"{call} was decided on a human's answers, in a ledger that seals its records: a rerun keeps their ids "
            f"in a paused record, which only the signing key can seal. Give the ledger its key (--signing-key-file "
            f"PATH or ${SIGNING_KEY_ENV}) and rerun it again; nothing was changed"
        )
    try:
        return call_state(record, sealer.open(record)).answers
    except TamperedRecordError:
        raise ValueError(
            f"{call} was decided on a human's answers, and its seal does not check with this ledger's key: a "
            "rerun would trust what it says. Give the key it was sealed with, or inspect it (replaysafe ledger "
            "show); nothing was changed"
        ) from None


def request_decision(
    key: CallKey, tool_name: str, args_digest: str, *, sealer: Sealer | None, owner: str, host: Host
) -> Generator[Effect, Any, Record]:
    """Keep the call ``key`` (of ``tool_name``, with arguments of digest ``args_digest``) paused for a decision
    before it ever runs: what a framework that holds a call back for a human does (its approval flow), so
    that the human's answer is recorded as a bound approval. A claim, then a paused record; a call already
    paused for the same tool and arguments is left as it is (asked twice: one request). Returns its record."""
    now = host.now()
    found: ClaimResult = yield new_tuple(Claim, (key, tool_name, args_digest, owner, now, now))
    record = found.record
    if record.tool_name != tool_name or record.args_digest != args_digest:
        raise ReplayMismatchError(
            f"{describe(tool_name, key)}: this call key is already recorded for "
            + (f"tool {record.tool_name!r}" if record.tool_name != tool_name else "other arguments")
            + ", so no decision is asked for it. One key must identify one tool call.",
            tool_name=tool_name,
            key=key,
        )
    if found.claimed or (record.status is _RUNNING and record.owner == owner):
        text = _sealed(sealer, key, tool_name, args_digest, _PAUSED, CallState(requested=True).text())
        yield new_tuple(Complete, (key, owner, _PAUSED, text, now))
        host.emit(
            EventKind.APPROVAL_REQUESTED,
            f"{describe(tool_name, key)} waits for a decision before it runs: {_approve_command(key)}",
            tool_name=tool_name,
            key=key,
        )
        requested: Record | None = yield Get(key)
        assert requested is not None
        return requested
    if record.status is _PAUSED:
        return record
    raise ValueError(
        f"{describe(tool_name, key)} is {record.status}: a decision is asked for a call before it runs, and this "
        f"one has (see it with {ledger_command('show', key)})"
    )


def decide(
    key: CallKey,
    approval: Callable[[Record, datetime], Approval],
    *,
    sealer: Sealer | None,
    owner: str,
    host: Host,
    answer: str | None = None,
) -> Generator[Effect, Any, Record]:
    """Record an approver's decision on the paused call ``key``: ``approval(record, now)`` builds it from
    what the approver decided on (the record's tool and argument digest). One compare-and-set of the
    record, so a decision made meanwhile by another approver, or a run, is never overwritten. A new
    decision replaces one not yet spent. Returns the new record.

    ``answer``: the id of the human's answer the decision comes from. The record keeps the ids it was
    decided on until the call finishes; an answer whose id it keeps decides nothing (the record is
    returned as it is), so a framework that hands its human's answer back after a crash cannot renew a
    spent or expired approval with it."""
    record: Record | None = yield Get(key)
    if record is None:
        raise LookupError(
            f"no record for {key}: nothing to decide. A call waits for a decision once it asked for one "
            "(@replay_safe(needs_approval=True), or a pause); see the paused calls with replaysafe ledger list "
            "--status paused"
        )
    if answer is not None and record.status is not _COMPLETED and record.status is not _FAILED:
        known = call_state(record, unsealed(record.result) if sealer is None else sealer.open(record))
        if answer in known.answers:
            return record  # decided on this answer already: it is not a new decision
    if record.status is not _PAUSED:
        raise ValueError(
            f"{describe(record.tool_name, key)} is {record.status}, not paused: only a paused call waits for a "
            f"decision. See it with {ledger_command('show', key)}"
        )
    text = unsealed(record.result) if sealer is None else sealer.open(record)  # a forged record: TamperedRecordError
    state = call_state(record, text)
    now = host.now()
    # Bound to the record it is written into (the takeover's attempt): a copy of it restored in the store
    # once it is spent (the record has moved on) is refused.
    decided = dataclasses.replace(approval(record, now), attempt=record.attempt + 1)
    answers = state.answers if answer is None else (*state.answers, answer)
    new = dataclasses.replace(state, requested=True, decision=decided, answers=answers)
    sealed = _sealed(sealer, key, record.tool_name, record.args_digest, _PAUSED, new.text())
    taken: Record | None = yield from _take_over(Takeover(record, owner, now, now, _PAUSED, sealed))
    if taken is None:
        raise RuntimeError(
            f"the record of {describe(record.tool_name, key)} changed while it was being decided (another decision, "
            f"or a run): nothing was recorded. Look at it again ({ledger_command('show', key)}) and decide again"
        )
    what = "approved" if decided.decision == "approved" else "rejected"
    edit = " with edited arguments" if decided.args is not None else ""
    until = f", until {decided.expires_at.isoformat()}" if decided.expires_at is not None else ""
    host.emit(
        EventKind.APPROVED if decided.decision == "approved" else EventKind.REJECTED,
        f"{describe(record.tool_name, key)} was {what}{edit} by {decided.by}{until}",
        tool_name=record.tool_name,
        key=key,
        approver=decided.by,
        attempt=taken.attempt,
    )
    return taken


def effective_timeout(
    tool_timeout: float | None, node_deadline: float | None, monotonic: Callable[[], float]
) -> float | None:
    """``min(tool_timeout, time left in the node)``; ``None`` when neither limits the call.
    The clock is read only when the node has a deadline."""
    left = None if node_deadline is None else node_deadline - monotonic()
    if tool_timeout is None:
        return left
    return tool_timeout if left is None else min(tool_timeout, left)
