"""What a ledger stores: the call key, the record and its status."""

from __future__ import annotations

import enum
from datetime import datetime, timedelta
from typing import Any, NamedTuple


class Status(str, enum.Enum):
    """The stored state of one tool call."""

    #: Claimed by an owner whose tool is running (or whose process died: see ``in_doubt``).
    RUNNING = "running"
    #: The tool returned; ``result`` holds its encoded return value.
    COMPLETED = "completed"
    #: The tool raised and the decorator records errors; ``result`` holds the error.
    FAILED = "failed"
    #: The owner gave up without knowing whether the side effect happened.
    IN_DOUBT = "in_doubt"
    #: The tool raised a pause (a human in the loop): the next call of the same key runs it
    #: again, as a new attempt, and its completed steps replay.
    PAUSED = "paused"

    def __str__(self) -> str:
        return self.value


_RUNNING = Status.RUNNING  # read once: through its enum class, each read runs a metaclass hook (Python 3.11)

#: ``new_tuple(Cls, (all fields in order))`` builds a named tuple without its Python-level
#: ``__new__`` (one call fewer), for the few built on every protected call.
new_tuple: Any = tuple.__new__


class CallKey(NamedTuple):
    """The stable identity of one tool call: ``(thread_id, message_id, tool_call_id)``."""

    thread_id: str
    message_id: str
    tool_call_id: str

    def __str__(self) -> str:
        return f"thread_id={self.thread_id!r} message_id={self.message_id!r} tool_call_id={self.tool_call_id!r}"


class Record(NamedTuple):
    """One row of a ledger (a named tuple: cheap to build on the hot path)."""

    key: CallKey
    tool_name: str
    args_digest: str
    status: Status
    #: The encoded result (``COMPLETED``) or error (``FAILED``); ``None`` otherwise.
    result: str | None
    #: Who claimed it: ``host:pid:process-start#n`` (see ``replaysafe._owners.owner_token``).
    owner: str
    attempt: int
    created_at: datetime
    updated_at: datetime
    #: Until when the owner of a ``RUNNING`` record is presumed alive.
    lease_expires_at: datetime
    #: When a finished record stops counting (``ttl``); ``None`` keeps it forever.
    expires_at: datetime | None = None

    @classmethod
    def claimed(
        cls, key: CallKey, tool_name: str, args_digest: str, owner: str, now: datetime, lease_expires_at: datetime
    ) -> Record:
        """The record a first claim of ``key`` stores: running, attempt 1."""
        fields = (key, tool_name, args_digest, _RUNNING, None, owner, 1, now, now, lease_expires_at, None)
        return new_tuple(cls, fields)  # type: ignore[no-any-return]

    def taken_over_by(
        self,
        owner: str,
        now: datetime,
        lease_expires_at: datetime,
        status: Status = Status.RUNNING,
        result: str | None = None,
        args_digest: str | None = None,
    ) -> Record:
        """The record a successful ``takeover`` of this one stores: running again (or ``status``), attempt + 1,
        with ``result`` and ``args_digest`` (``None``: its own)."""
        return self._replace(
            args_digest=self.args_digest if args_digest is None else args_digest,
            status=status,
            result=result,
            owner=owner,
            attempt=self.attempt + 1,
            updated_at=now,
            lease_expires_at=lease_expires_at,
            expires_at=None,
        )


class ClaimResult(NamedTuple):
    """What ``Ledger.claim`` found: a record, and whether this caller now owns it."""

    record: Record
    claimed: bool


def expires_at(status: Status, now: datetime, ttl: timedelta | None) -> datetime | None:
    """When a record written with ``status`` at ``now`` stops counting, under a ledger's ``ttl``.

    The one statement of the rule every ledger stores: a finished (or paused) call expires
    after ``ttl``; a call in doubt never does, so it waits for an operator or a reconciler
    instead of silently becoming runnable again.
    """
    return now + ttl if ttl is not None and status is not Status.IN_DOUBT else None


class Undone(NamedTuple):
    """What ``ledger.undo(key)`` did for one call: the call itself, or one of its steps."""

    #: The call whose compensation this is (not the key its undo is recorded under).
    key: CallKey
    tool_name: str
    #: ``"undone"``: its compensation ran now; ``"already_undone"``: it had run, its recorded
    #: result was replayed; ``"skipped"``: nothing ran (``note`` says why).
    outcome: str
    #: What the compensation returned (``None`` when skipped).
    result: Any = None
    note: str = ""
