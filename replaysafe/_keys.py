"""The keys of calls that do not take theirs from ``tool_call(...)``: steps, ``key="args"``, business keys.

Each is a plain ``CallKey``, so every ledger stores it as it stores any call. Their
values must never change: a stored record and the idempotency key handed to a
provider are found again through them.
"""

from __future__ import annotations

import re
from typing import Any

from ._errors import ArgumentDigestError, InvalidCallIdError
from ._identity import args_digest
from ._records import CallKey

#: What the reserved thread and message ids start with (``tool_call`` skips ``reserved_id`` for ids without it
#: and without a ``>``).
RESERVED_PREFIX = "replaysafe:"
#: The message id of calls keyed by ``key="args"`` (thread id, tool name, argument digest).
ARGS_MESSAGE_ID = RESERVED_PREFIX + "args"
#: The thread id of calls keyed by a business key: scoped to the tool, across threads.
BUSINESS_THREAD_ID = RESERVED_PREFIX + "key"
# A step's call id: its parent's, then ">" the step's tool name "#" its ordinal.
_STEP_SUFFIX = re.compile(r"#([1-9][0-9]*)\Z")
# Any id of that form, whatever the tool's name: a call of its own under it could share a step's record.
_STEP_FORM = re.compile(r">.*#[1-9][0-9]*\Z", re.DOTALL)
#: What ends the tool call id of a call's undo: its call's, then this (``undo_key``).
UNDO_SUFFIX = ">#undo"
#: What ends the tool call id of a late result: its call's, then this and the attempt that returned it.
_LATE_FORM = re.compile(r">#late-([1-9][0-9]*)\Z")


def reserved_id(key: CallKey) -> tuple[str, str] | None:
    """``(field, what is wrong and what to do)`` when ``tool_call(...)`` ids fall in a key space
    replaysafe makes keys in, else ``None``.

    Only what can collide is reserved, so that every id a framework gives is accepted: the
    thread id of business keys, the message id of ``key="args"`` calls, and a tool call id
    of a step's form (a ``>``, then at its end ``#`` and an ordinal). A ``>`` or a ``#``
    alone is an ordinary character.
    """
    if key.thread_id == BUSINESS_THREAD_ID:
        return "thread_id", (
            "is reserved: replaysafe keeps the calls of tools with a business key (@replay_safe(key=function)) "
            "under it, so a call of its own there could be handed one of theirs. Use the conversation's thread id."
        )
    if key.message_id == ARGS_MESSAGE_ID:
        return "message_id", (
            'is reserved: replaysafe keeps the calls of tools with @replay_safe(key="args") under it, so a call of '
            "its own there could be handed one of theirs. Use the id of the message that asked for the call."
        )
    if ">" in key.tool_call_id and _STEP_FORM.search(key.tool_call_id) is not None:
        return "tool_call_id", (
            "has the reserved form of a step's id (<parent tool_call_id>><tool>#<n>, e.g. call_1>charge#1), under "
            "which replaysafe keeps the calls a tool makes inside another, so a call of its own could be handed a "
            "step's result. Use the id the framework gave the call, or leave the '>' out of ids you make yourself."
        )
    if key.tool_call_id.endswith(UNDO_SUFFIX):
        return "tool_call_id", (
            f"has the reserved form of an undo's id (<tool_call_id>{UNDO_SUFFIX}, e.g. call_1{UNDO_SUFFIX}), under "
            "which replaysafe records that a call's compensation ran (ledger.undo), so a call of its own could be "
            "handed an undo's result. Use the id the framework gave the call, or leave the '>' out of ids you make "
            "yourself."
        )
    if _LATE_FORM.search(key.tool_call_id) is not None:
        return "tool_call_id", (
            "has the reserved form of a late result's id (<tool_call_id>>#late-<attempt>, e.g. call_1>#late-2), "
            "under which replaysafe keeps what a call returned after it was settled elsewhere, so a call of its own "
            "could be handed one. Use the id the framework gave the call, or leave the '>' out of ids you make "
            "yourself."
        )
    return None


def step_key(parent: CallKey, tool_name: str, ordinal: int) -> CallKey:
    """The key of the ``ordinal``-th step named ``tool_name`` made inside the call ``parent``.

    A name with a ``>`` before its last character is refused: the key is read back from its
    right end (``#n``, then the name), so the ``b>charge`` step of call ``a`` and the ``charge``
    step of call ``a>b`` would both be ``a>b>charge#1``, and the second to run would be blocked
    by the first's record. A ``>`` at the very end (``<lambda>``) or a ``#`` cannot do that:
    the ordinal is the digits after the last ``#``, and the part of a name after a ``>`` would
    have to be a name of its own, never empty.
    """
    if ">" in tool_name[:-1]:
        raise InvalidCallIdError(
            f"{tool_name} cannot run as a step inside the call ({parent}): a step's tool call id is "
            "<parent tool_call_id>><tool>#<n>, and a '>' inside the tool's name could give two different "
            "steps one id (the second to run would be blocked by the first's record). Nothing ran. Name the "
            'tool without it: @replay_safe(name="...").',
            tool_name=tool_name,
            key=parent,
        )
    return CallKey(parent.thread_id, parent.message_id, f"{parent.tool_call_id}>{tool_name}#{ordinal}")


def step_ordinal(key: CallKey, parent: CallKey, tool_name: str) -> int | None:
    """``n`` if ``key`` is ``step_key(parent, tool_name, n)``, else ``None``."""
    prefix = f"{parent.tool_call_id}>{tool_name}#"
    if key.thread_id != parent.thread_id or key.message_id != parent.message_id:
        return None
    if not key.tool_call_id.startswith(prefix):
        return None
    digits = key.tool_call_id[len(prefix) :]
    return int(digits) if digits.isascii() and digits.isdigit() and not digits.startswith("0") else None


def step_parent(key: CallKey, tool_name: str) -> CallKey | None:
    """The parent's key if ``key`` is the key of a step named ``tool_name``, else ``None``."""
    match = _STEP_SUFFIX.search(key.tool_call_id)
    if match is None:
        return None
    head = key.tool_call_id[: match.start()]
    suffix = f">{tool_name}"
    if not head.endswith(suffix) or len(head) == len(suffix):
        return None
    return CallKey(key.thread_id, key.message_id, head[: -len(suffix)])


def undo_key(key: CallKey) -> CallKey:
    """The key under which the compensation of the call ``key`` runs and is recorded (``ledger.undo``).

    The call's ids, with ``>#undo`` after its tool call id: never a step's (a step's id ends in ``#``
    and an ordinal), never a framework's (``tool_call`` refuses an id of that form, ``reserved_id``),
    and never a ``key="args"`` or business key (their tool call ids end in a hex digest).
    """
    return CallKey(key.thread_id, key.message_id, key.tool_call_id + UNDO_SUFFIX)


def undone_call(key: CallKey) -> CallKey | None:
    """The key of the call whose undo ``key`` is (``undo_key``), else ``None``."""
    if not key.tool_call_id.endswith(UNDO_SUFFIX) or len(key.tool_call_id) == len(UNDO_SUFFIX):
        return None
    return CallKey(key.thread_id, key.message_id, key.tool_call_id[: -len(UNDO_SUFFIX)])


def late_key(key: CallKey, attempt: int) -> CallKey:
    """The key under which attempt ``attempt`` of the call ``key`` keeps its late result: what it returned
    after the call was settled elsewhere (taken over, resolved by an operator, or removed to run again).
    Never a step's, an undo's, a framework's (``reserved_id``), a ``key="args"`` or a business key's."""
    return CallKey(key.thread_id, key.message_id, f"{key.tool_call_id}>#late-{attempt}")


def late_result_of(key: CallKey) -> tuple[CallKey, int] | None:
    """``(the call's key, the attempt)`` when ``key`` is a late result's (``late_key``), else ``None``."""
    match = _LATE_FORM.search(key.tool_call_id)
    if match is None or match.start() == 0:
        return None
    return CallKey(key.thread_id, key.message_id, key.tool_call_id[: match.start()]), int(match[1])


def args_key(thread_id: str, tool: str, digest: str) -> CallKey:
    """``key="args"``: one call per thread, tool and arguments, whatever its message and call ids.
    ``tool`` is the tool's identity (its ``name=``, else ``module:qualname``; its name under rs0)."""
    return CallKey(thread_id, ARGS_MESSAGE_ID, f"{tool}:{digest}")


def business_key(tool: str, value: Any, *, tool_name: str | None = None, rs0: bool = False) -> CallKey:
    """``key=callable``: the tool's calls whose key function gave ``value``, in every thread.
    ``tool`` is the tool's identity (as for ``args_key``), ``tool_name`` the name messages give it.

    Only a digest of ``value`` is stored: the key is made of arguments, and a call's key is
    quoted in messages and logs, which never carry argument values.
    """
    tool_name = tool_name or tool
    try:
        digest = args_digest({"key": value}, tool_name=tool_name, rs0=rs0)
    except ArgumentDigestError:
        raise ArgumentDigestError(
            f"the key function of {tool_name} returned a {type(value).__name__}, which has no stable digest. "
            "Return data: a str, an int, or a tuple of them (an order id, a customer and an invoice number).",
            tool_name=tool_name,
        ) from None
    return CallKey(BUSINESS_THREAD_ID, tool, digest)
