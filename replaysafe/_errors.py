"""Exceptions and warnings. Every message names the call and says what to do."""

from __future__ import annotations

import json
from typing import Any

from ._records import CallKey


def describe(tool_name: str | None, key: CallKey | None) -> str:
    """The call as error messages name it: ``tool (thread_id=… message_id=… tool_call_id=…)``."""
    tool = tool_name or "<unknown tool>"
    return f"{tool} ({key})" if key is not None else tool


def ledger_command(action: str, key: CallKey) -> str:
    """The ``replaysafe ledger`` command line that acts on one call, as messages tell operators to run it.

    Ids are JSON-quoted: safe enough to copy into a shell, with control characters escaped.
    """
    return f"replaysafe ledger {action} --ledger <url> {' '.join(json.dumps(part) for part in key)}"


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10 (where tracebacks do not print it)."""
    adder = getattr(exc, "add_note", None)
    if adder is not None:
        adder(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]


class ReplaySafeError(Exception):
    """Base class of every error replaysafe raises."""

    def __init__(self, message: str, *, tool_name: str | None = None, key: CallKey | None = None) -> None:
        super().__init__(message)
        self.tool_name = tool_name
        self.key = key


class ReplayMismatchError(ReplaySafeError):
    """The call key is recorded for a different tool or different arguments."""


class NoCurrentCallError(ReplaySafeError, LookupError):
    """``current_call()`` was called outside a protected call."""


class CallInProgressError(ReplaySafeError):
    """Another live worker still runs this call and did not finish within the wait.

    ``owner`` is that worker's owner token (``host:pid:start#n``), for operators: it is kept
    out of the message, which a framework may show the model.
    """

    def __init__(
        self, message: str, *, owner: str | None = None, tool_name: str | None = None, key: CallKey | None = None
    ) -> None:
        super().__init__(message, tool_name=tool_name, key=key)
        self.owner = owner


class CallInDoubtError(ReplaySafeError):
    """The call's owner died (or gave up) while the tool ran: its side effect may have happened.

    ``idempotency_key`` is the key the call handed its provider, to look the effect up.
    ``owner`` is the token (``host:pid:start#n``) of the owner that died, for operators: it is
    kept out of the message, which a framework may show the model (the ``in_doubt`` event and
    ``replaysafe ledger show`` name it too).
    """

    def __init__(
        self,
        message: str,
        *,
        idempotency_key: str,
        owner: str | None = None,
        tool_name: str | None = None,
        key: CallKey | None = None,
    ) -> None:
        super().__init__(message, tool_name=tool_name, key=key)
        self.idempotency_key = idempotency_key
        self.owner = owner


class ToolTimeoutError(ReplaySafeError, TimeoutError):
    """The tool passed its deadline (``tool_timeout``, or what was left of ``node_timeout``).

    The call is in doubt, not undone: a replay applies the in-doubt policy. When
    ``still_running`` is true the tool (a sync tool in a worker thread) goes on in
    the background and records its result if it finishes (a late completion).
    """

    def __init__(
        self,
        message: str,
        *,
        timeout: float,
        still_running: bool = False,
        tool_name: str | None = None,
        key: CallKey | None = None,
    ) -> None:
        super().__init__(message, tool_name=tool_name, key=key)
        self.timeout = timeout
        self.still_running = still_running


class LedgerError(ReplaySafeError):
    """The ledger could not be read or written.

    ``result`` holds the tool's return value when the tool ran but its record could
    not be written, so that nothing is lost. ``permanent`` marks a misconfiguration
    (bad URL, credentials, privileges, a missing table): it raises whatever
    ``on_ledger_error`` says.
    """

    def __init__(
        self,
        message: str,
        *,
        tool_name: str | None = None,
        key: CallKey | None = None,
        transient: bool = False,
        result: Any = None,
        permanent: bool = False,
    ) -> None:
        super().__init__(message, tool_name=tool_name, key=key)
        self.transient = transient
        self.result = result
        self.permanent = permanent


class ApprovalRequiredError(ReplaySafeError):
    """The call runs only on an approval, and has none it may spend: nothing ran, and the call is kept
    paused for a decision (``replaysafe.approvals.approve`` / ``reject``).

    ``may_have_run`` is true when an earlier attempt ran on an approval and did not finish: its side
    effect may have happened, so the approver is asked again instead of the call running again.
    ``attempt``: the attempt of the paused record that waits for the decision; a later attempt ran since, or
    was decided, when it differs (a framework's answer to this question can name it).
    """

    def __init__(
        self,
        message: str,
        *,
        may_have_run: bool = False,
        idempotency_key: str | None = None,
        tool_name: str | None = None,
        key: CallKey | None = None,
        attempt: int | None = None,
    ) -> None:
        super().__init__(message, tool_name=tool_name, key=key)
        self.may_have_run = may_have_run
        self.idempotency_key = idempotency_key
        self.attempt = attempt


class ApprovalMismatchError(ReplayMismatchError):
    """The call's approval is for another call: other arguments, another tool or another key. Nothing ran;
    the call stays paused for a new decision."""


class ApprovalExpiredError(ReplaySafeError):
    """The call's approval expired before a run could spend it. Nothing ran; the call stays paused."""


class ApprovalRejectedError(ReplaySafeError):
    """The call was rejected by its approver: it never runs on this decision. ``reason`` holds the
    approver's words (kept out of the message, as data); ``by`` who rejected it."""

    def __init__(
        self,
        message: str,
        *,
        by: str = "",
        reason: str | None = None,
        tool_name: str | None = None,
        key: CallKey | None = None,
    ) -> None:
        super().__init__(message, tool_name=tool_name, key=key)
        self.by = by
        self.reason = reason


class TamperedRecordError(ReplaySafeError):
    """A record's seal does not check: it was altered (or forged) in the store."""


class MissingCallIdError(ReplaySafeError):
    """A protected tool was called without a thread, message or tool call id."""


class InvalidCallIdError(ReplaySafeError, ValueError):
    """An id no ledger can store faithfully (a NUL byte, a lone surrogate, over 64 KB), or one in a key
    space replaysafe keeps for itself (a step's, a chosen key's)."""


class ArgumentDigestError(ReplaySafeError, TypeError):
    """An argument is not data, so no stable digest of the call exists."""


class ResultEncodingError(ReplaySafeError, TypeError):
    """A tool's result cannot be encoded by the ledger's serializer (or is over ``max_result_bytes``).

    Raised to the first caller under ``on_ledger_error="raise"`` (with the value in
    ``result``), and by every replay of such a call: it ran, its result was not
    recorded, so it is never run again until settled with ``replaysafe ledger resolve``.
    """

    def __init__(
        self,
        message: str,
        *,
        tool_name: str | None = None,
        key: CallKey | None = None,
        idempotency_key: str | None = None,
        result: Any = None,
    ) -> None:
        super().__init__(message, tool_name=tool_name, key=key)
        self.idempotency_key = idempotency_key
        self.result = result


class RecordUnreadableError(ReplaySafeError):
    """A finished call's recorded result cannot be read back (a changed model, a corrupt record).

    The call ran, so it is not run again: settle the record with ``replaysafe ledger
    resolve``. ``idempotency_key`` is the key the call handed its provider.
    """

    def __init__(
        self, message: str, *, idempotency_key: str, tool_name: str | None = None, key: CallKey | None = None
    ) -> None:
        super().__init__(message, tool_name=tool_name, key=key)
        self.idempotency_key = idempotency_key


class RecordedToolError(ReplaySafeError):
    """Replay of a call whose tool raised, recorded with ``record_errors``.

    Carries the original exception's type name and, in ``error_message`` only, its
    message (which may quote the tool's arguments: it is data, like a result, so the
    exception's own text names the type alone). It is never unpickled.
    """

    def __init__(
        self,
        message: str,
        *,
        error_type: str,
        error_message: str,
        tool_name: str | None = None,
        key: CallKey | None = None,
    ) -> None:
        super().__init__(message, tool_name=tool_name, key=key)
        self.error_type = error_type
        self.error_message = error_message


class ReplaySafeWarning(UserWarning):
    """Base class of replaysafe's warnings about unprotected calls."""


class UnprotectedCallWarning(ReplaySafeWarning):
    """A protected tool ran without protection (missing ids or no ledger)."""


#: replaysafe's refusals and failures of its own: the call did not run as asked, and a model shown one
#: would only ask again under new ids. An adapter never turns them into a tool message; the run stops.
#: A ``RecordedToolError`` (the tool's own recorded failure) and a ``ToolTimeoutError`` (the tool ran
#: past its deadline) are the tool's outcome, and are not among them.
CONTROL_ERRORS: tuple[type[ReplaySafeError], ...] = (
    CallInDoubtError,
    CallInProgressError,
    ReplayMismatchError,
    TamperedRecordError,
    LedgerError,
    RecordUnreadableError,
    ResultEncodingError,
    MissingCallIdError,
    InvalidCallIdError,
    ArgumentDigestError,
    ApprovalRequiredError,
    ApprovalExpiredError,
    ApprovalRejectedError,
)
