"""The replay protocol: every claim, replay and record decision, with no I/O.

``replay()`` is a generator that yields *effects* (claim this key, run the tool,
record this result, sleep) and receives their outcomes. The sync and async
drivers in ``_decorator`` perform the effects; the decisions live here, once.
A ledger failure comes back into the generator as a ``LedgerError``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import typing
from collections.abc import Generator, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from . import _constants
from ._clock import utcnow
from ._codec import Reviver, Serializer, reviver_for
from ._context import CallInfo, CallScope
from ._errors import (
    CallInProgressError,
    LedgerError,
    RecordedToolError,
    ReplayMismatchError,
    describe,
)
from ._identity import call_idempotency_key, owner_token
from ._log import log
from ._records import CallKey, ClaimResult, Record, Status

OnLedgerError = Literal["warn", "raise"]


_UNRESOLVED: Any = object()


@dataclasses.dataclass(slots=True)
class ToolSpec:
    """How one decorated tool is protected, fixed at decoration time."""

    name: str
    serializer: Serializer
    record_errors: tuple[type[BaseException], ...]
    on_ledger_error: OnLedgerError
    lease: timedelta
    wait_timeout: float
    #: The tool function, whose return annotation says what type a replay rebuilds.
    function: Any = None
    _reviver: Reviver | None = _UNRESOLVED

    def decode(self, text: str | None) -> Any:
        value = self.serializer.loads(text if text is not None else "null")
        if self._reviver is _UNRESOLVED:
            # Resolved on first replay, when forward references can be evaluated.
            self._reviver = reviver_for(return_annotation(self.function))
        return self._reviver(value) if self._reviver is not None else value


def return_annotation(function: Any) -> Any:
    try:
        return typing.get_type_hints(function).get("return", Any)
    except Exception:  # an unresolvable annotation: replay returns the decoded data as is
        return Any


# --- effects: what the drivers are asked to do -------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    key: CallKey
    tool_name: str
    args_digest: str
    owner: str
    now: datetime
    lease_expires_at: datetime

    def on(self, ledger: Any) -> Any:
        return ledger.claim(
            self.key,
            tool_name=self.tool_name,
            args_digest=self.args_digest,
            owner=self.owner,
            now=self.now,
            lease_expires_at=self.lease_expires_at,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Takeover:
    record: Record
    owner: str
    now: datetime
    lease_expires_at: datetime

    @property
    def key(self) -> CallKey:
        return self.record.key

    def on(self, ledger: Any) -> Any:
        return ledger.takeover(self.record, owner=self.owner, now=self.now, lease_expires_at=self.lease_expires_at)


@dataclasses.dataclass(frozen=True, slots=True)
class Complete:
    key: CallKey
    owner: str
    status: Status
    result: str | None
    now: datetime

    def on(self, ledger: Any) -> Any:
        return ledger.complete(self.key, owner=self.owner, status=self.status, result=self.result, now=self.now)


@dataclasses.dataclass(frozen=True, slots=True)
class Release:
    key: CallKey
    owner: str

    def on(self, ledger: Any) -> Any:
        return ledger.release(self.key, owner=self.owner)


LedgerOp = Claim | Takeover | Complete | Release


@dataclasses.dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class RunTool:
    """Run the tool body with ``call`` as ``current_call()``; its exception is thrown back in."""

    call: CallInfo


Effect = LedgerOp | Sleep | RunTool
Protocol = Generator[Effect, Any, Any]


# --- decisions -----------------------------------------------------------------


class Verdict(enum.Enum):
    """What to do about a record someone else holds."""

    REPLAY = "replay"  # completed: return its result
    RAISE_RECORDED = "raise_recorded"  # failed and recorded: raise RecordedToolError
    WAIT = "wait"  # a live owner runs it: wait for its result
    IN_DOUBT = "in_doubt"  # its owner died or gave up mid-call


def owner_is_alive(record: Record, now: datetime) -> bool:
    """Whether the owner of a ``running`` record may still finish it."""
    return now < record.lease_expires_at


def judge(record: Record, now: datetime) -> Verdict:
    if record.status is Status.COMPLETED:
        return Verdict.REPLAY
    if record.status is Status.FAILED:
        return Verdict.RAISE_RECORDED
    if record.status is Status.RUNNING and owner_is_alive(record, now):
        return Verdict.WAIT
    return Verdict.IN_DOUBT


def in_doubt_policy(spec: ToolSpec, record: Record) -> Literal["rerun"]:
    """The one place that decides what happens to an in-doubt call."""
    log(
        logging.WARNING,
        f"{describe(spec.name, record.key)} is in doubt: its owner {record.owner} died or gave up while the tool "
        f"ran (attempt {record.attempt}), so its side effect may or may not have happened. Running it again as "
        f"attempt {record.attempt + 1}; hand current_call().idempotency_key to the provider so it can dedupe.",
        tool_name=spec.name,
        key=record.key,
        owner=record.owner,
        attempt=record.attempt,
    )
    return "rerun"


def _check_same_call(spec: ToolSpec, record: Record, args_digest: str) -> None:
    if record.tool_name != spec.name or record.args_digest != args_digest:
        what = f"tool {record.tool_name!r}" if record.tool_name != spec.name else "the same tool with other arguments"
        raise ReplayMismatchError(
            f"{describe(spec.name, record.key)}: this call key is already recorded for {what}, so nothing ran. "
            "One key must identify one tool call: use a distinct tool_call_id (or message_id) per call, or "
            "exclude non-data arguments from the digest with @replay_safe(exclude_args=...).",
            tool_name=spec.name,
            key=record.key,
        )


def encode_error(exc: BaseException) -> str:
    return json.dumps({"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": str(exc)})


def recorded_error(spec: ToolSpec, record: Record) -> RecordedToolError:
    try:
        stored = json.loads(record.result or "{}")
        error_type, error_message = str(stored["type"]), str(stored["message"])
    except (ValueError, KeyError, TypeError):
        error_type, error_message = "<unreadable>", record.result or ""
    return RecordedToolError(
        f"{describe(spec.name, record.key)} raised {error_type}: {error_message} when it first ran, and that "
        "failure is recorded, so it was not run again. Delete the record (ledger.delete(key)) to allow a retry.",
        error_type=error_type,
        error_message=error_message,
        tool_name=spec.name,
        key=record.key,
    )


def replay(
    spec: ToolSpec, scope: CallScope, args_digest: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Protocol:
    """Claim the call; replay, wait for, or run and record it. Returns the tool's result."""
    key = scope.key
    owner = owner_token()
    deadline: datetime | None = None
    backoff = _constants.WAIT_BACKOFF_FIRST
    while True:
        now = utcnow()
        try:
            found: ClaimResult = yield Claim(key, spec.name, args_digest, owner, now, now + spec.lease)
        except LedgerError as exc:
            return (yield from _run_unrecorded(spec, key, exc, args, kwargs))
        record = found.record
        _check_same_call(spec, record, args_digest)
        # Our own record: a claim whose first answer was lost and was tried again.
        if found.claimed or (record.status is Status.RUNNING and record.owner == owner):
            break
        verdict = judge(record, now)
        if verdict is Verdict.REPLAY:
            try:
                return spec.decode(record.result)
            except Exception as exc:
                unreadable = LedgerError(
                    f"the recorded result of {describe(spec.name, key)} cannot be decoded ({exc!r}); inspect the "
                    "record, and delete it or settle it by hand",
                    tool_name=spec.name,
                    key=key,
                )
                return (yield from _run_unrecorded(spec, key, unreadable, args, kwargs))
        if verdict is Verdict.RAISE_RECORDED:
            raise recorded_error(spec, record)
        if verdict is Verdict.IN_DOUBT:
            in_doubt_policy(spec, record)
            try:
                taken: Record | None = yield Takeover(record, owner, now, now + spec.lease)
            except LedgerError as exc:
                return (yield from _run_unrecorded(spec, key, exc, args, kwargs))
            if taken is None:
                continue  # another worker moved first: look again
            record = taken
            break
        # A live owner runs this very call: wait for its result, with a bounded backoff.
        if deadline is None:
            deadline = now + timedelta(seconds=spec.wait_timeout)
        left = (deadline - now).total_seconds()
        if left <= 0:
            raise CallInProgressError(
                f"{describe(spec.name, key)} is still running in {record.owner} (attempt {record.attempt}, lease "
                f"until {record.lease_expires_at.isoformat()}); gave up waiting after {spec.wait_timeout:g}s. "
                "Retry later, or raise @replay_safe(wait_timeout=...).",
                tool_name=spec.name,
                key=key,
            )
        yield Sleep(min(backoff, left))
        backoff = min(backoff * 2, _constants.WAIT_BACKOFF_MAX)
    return (yield from _execute(spec, scope, record, owner, args, kwargs))


def _call_info(
    spec: ToolSpec, key: CallKey, attempt: int, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> CallInfo:
    return CallInfo(
        thread_id=key.thread_id,
        message_id=key.message_id,
        tool_call_id=key.tool_call_id,
        tool_name=spec.name,
        attempt=attempt,
        idempotency_key=call_idempotency_key(*key, spec.name),
        args=args,
        kwargs=kwargs,
    )


def _execute(
    spec: ToolSpec, scope: CallScope, record: Record, owner: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Protocol:
    """Run the claimed call and record how it ended."""
    key = record.key
    try:
        result = yield RunTool(_call_info(spec, key, record.attempt, args, kwargs))
    except Exception as exc:
        # The user's exception always wins: a failed cleanup is logged, never raised.
        # A pause (human in the loop) is not an outcome: the call will run when resumed.
        if spec.record_errors and isinstance(exc, spec.record_errors) and not isinstance(exc, scope.pauses):
            yield from _finish(spec, key, owner, Status.FAILED, encode_error(exc), fail_closed=False)
        else:
            yield from _release(spec, key, owner)
        raise
    except BaseException as exc:
        if isinstance(exc, GeneratorExit):
            raise
        # Cancelled or interrupted mid-call: whether the side effect happened is unknown.
        yield from _finish(spec, key, owner, Status.IN_DOUBT, None, fail_closed=False)
        raise
    try:
        encoded = spec.serializer.dumps(result)
    except Exception as exc:
        log(
            logging.ERROR,
            f"{describe(spec.name, key)} ran, but its result cannot be recorded: {exc}. The call is marked in "
            "doubt, so a replay applies the in-doubt policy. Return JSON-able data, or pass a serializer=.",
            tool_name=spec.name,
            key=key,
        )
        yield from _finish(spec, key, owner, Status.IN_DOUBT, None, fail_closed=False)
        if spec.on_ledger_error == "raise":
            raise LedgerError(
                f"{describe(spec.name, key)} ran but its result could not be recorded ({exc}); the result is on "
                "this error's .result.",
                tool_name=spec.name,
                key=key,
                result=result,
            ) from exc
        return result
    yield from _finish(spec, key, owner, Status.COMPLETED, encoded, fail_closed=True, result=result)
    return result


def _finish(
    spec: ToolSpec,
    key: CallKey,
    owner: str,
    status: Status,
    encoded: str | None,
    *,
    fail_closed: bool,
    result: Any = None,
) -> Generator[Effect, Any, None]:
    """Record how the call ended; a write that fails is logged (or raised, fail-closed)."""
    try:
        recorded = yield Complete(key, owner, status, encoded, utcnow())
    except LedgerError as exc:
        log(
            logging.ERROR,
            f"{describe(spec.name, key)} ran but its {status} record could not be written: {exc}. A replay may "
            "run it again; hand current_call().idempotency_key to the provider so it can dedupe.",
            tool_name=spec.name,
            key=key,
        )
        if fail_closed and spec.on_ledger_error == "raise":
            exc.result = result
            raise
        return
    if not recorded:
        log(
            logging.ERROR,
            f"duplicate execution of {describe(spec.name, key)}: its claim was taken over by another worker while "
            f"this one ({owner}) ran the tool, so the tool ran twice. The other worker's record is kept.",
            tool_name=spec.name,
            key=key,
            owner=owner,
        )


def _release(spec: ToolSpec, key: CallKey, owner: str) -> Generator[Effect, Any, None]:
    try:
        yield Release(key, owner)
    except LedgerError as exc:
        log(
            logging.ERROR,
            f"{describe(spec.name, key)} raised, and its claim could not be released: {exc}. A replay treats the "
            "call as running until its lease ends.",
            tool_name=spec.name,
            key=key,
        )


def _run_unrecorded(
    spec: ToolSpec, key: CallKey, exc: LedgerError, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Protocol:
    """The ledger cannot be read: fail closed, or run the tool without protection."""
    if spec.on_ledger_error == "raise":
        raise exc
    log(
        logging.WARNING,
        f"{describe(spec.name, key)} runs WITHOUT replay protection: {exc}. Skipping a tool that never ran is "
        "worse than running it twice; pass @replay_safe(on_ledger_error='raise') to fail closed instead.",
        tool_name=spec.name,
        key=key,
    )
    return (yield RunTool(_call_info(spec, key, 1, args, kwargs)))
