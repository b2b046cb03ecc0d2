"""Tamper-evident records: an HMAC over what a replay would trust.

Anyone who can write to the ledger's store could otherwise make a protected tool
"return" a forged result without running, or run a finished call again. With a signing
key, every finished (completed or failed) or paused record's result is stored as
``rs-seal-1:<hmac>:<encoded result>`` (``rs-seal-1:<hmac>`` when it has none), the
HMAC-SHA256 covering the call key, tool name, argument digest, status and encoded result
(or its absence). A finished record whose seal does not check, or that has no seal at all,
is never returned as a result; a paused one is never resumed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Sequence

from ._errors import TamperedRecordError, describe
from ._records import CallKey, Record, Status

SIGNING_KEY_ENV = "REPLAYSAFE_SIGNING_KEY"
_PREFIX = "rs-seal-1:"
#: The finished statuses: a replay returns or raises what their record holds.
FINISHED = frozenset({Status.COMPLETED, Status.FAILED})
#: The statuses whose record a replay trusts, each sealed, result or not: the finished ones, and ``PAUSED``,
#: which lets the next call run the tool again without asking the in-doubt policy (a record flipped to paused
#: would otherwise run a completed call a second time).
SEALED = FINISHED | {Status.PAUSED}


class Sealer:
    """Seals with the first key; accepts a seal made by any of them (for key rotation)."""

    __slots__ = ("_secrets",)

    def __init__(self, keys: Sequence[str | bytes], source: str = "signing_key=") -> None:
        secrets = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
        if not secrets:
            raise ValueError(f"{source} holds no signing key: give at least one, each at least 16 bytes long")
        for position, secret in enumerate(secrets, 1):
            if len(secret) < 16:  # the key itself is a secret: named by its position only
                raise ValueError(
                    f"signing key {position} of {len(secrets)} in {source} is shorter than 16 bytes: use a random "
                    'secret of 16 bytes or more (python -c "import secrets; print(secrets.token_urlsafe(32))")'
                )
        self._secrets = secrets

    @classmethod
    def from_setting(cls, signing_key: str | bytes | Sequence[str | bytes] | None) -> Sealer | None:
        """From ``signing_key=`` (one key or a list, the first signs) or ``REPLAYSAFE_SIGNING_KEY``
        (comma-separated); ``None`` when neither is set."""
        if signing_key is None:
            from_env = os.environ.get(SIGNING_KEY_ENV, "")
            keys: list[str | bytes] = [k for k in from_env.split(",") if k]
            return cls(keys, f"${SIGNING_KEY_ENV}") if keys else None
        if isinstance(signing_key, (str, bytes)):
            return cls([signing_key])
        return cls(list(signing_key))

    @staticmethod
    def _mac(secret: bytes, key: CallKey, tool_name: str, args_digest: str, status: Status, encoded: str | None) -> str:
        # An absent result is JSON null, which no encoded text (a JSON string here) can equal.
        message = json.dumps([*key, tool_name, args_digest, status.value, encoded], ensure_ascii=True)
        return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()

    def seal(self, key: CallKey, tool_name: str, args_digest: str, status: Status, encoded: str | None) -> str:
        mac = self._mac(self._secrets[0], key, tool_name, args_digest, status, encoded)
        return f"{_PREFIX}{mac}" if encoded is None else f"{_PREFIX}{mac}:{encoded}"

    def open(self, record: Record) -> str | None:
        """The record's encoded result, if its seal checks; else ``TamperedRecordError``.

        A finished or paused record must carry a seal even when it has no result: otherwise whoever
        can write the store could stop a tool from running and hand its caller ``None``, or run a
        completed call again by marking it paused.
        """
        if record.result is None and record.status not in SEALED:
            return None  # running or in doubt: nothing a replay would trust
        mac, encoded = (None, None) if record.result is None else _split(record.result)
        if mac is not None and self._position(record, mac, encoded) is not None:
            return encoded
        if record.result is None:
            how = "written without a seal or a result"
        elif mac is None:
            how = "written without a seal"
        else:
            how = "altered, or sealed with a key this ledger does not accept"
        raise TamperedRecordError(
            f"the {record.status} record of {describe(record.tool_name, record.key)} fails its seal check: it was "
            f"{how}. It is not returned as a result and nothing ran. Inspect the store (who can write to it?), "
            "then delete or resolve the record.",
            tool_name=record.tool_name,
            key=record.key,
        )

    def key_of(self, record: Record) -> int | None:
        """The position of the key whose seal ``record`` carries: 0 for the first (the one that seals), 1 for
        the next...; ``None`` when it carries no seal or none of the keys checks it."""
        if record.result is None:
            return None
        mac, encoded = _split(record.result)
        return None if mac is None else self._position(record, mac, encoded)

    def _position(self, record: Record, mac: str, encoded: str | None) -> int | None:
        for position, secret in enumerate(self._secrets):
            expected = self._mac(secret, record.key, record.tool_name, record.args_digest, record.status, encoded)
            if hmac.compare_digest(mac, expected):
                return position
        return None


def _split(text: str) -> tuple[str | None, str | None]:
    """``(mac, encoded)`` of a stored result; ``mac`` is ``None`` when it carries no seal."""
    if not text.startswith(_PREFIX):
        return None, text
    mac, colon, encoded = text[len(_PREFIX) :].partition(":")
    return mac, encoded if colon else None


def is_sealed(text: str | None) -> bool:
    """Whether a stored result carries a seal (unchecked: only the key can tell a valid one)."""
    return text is not None and text.startswith(_PREFIX)


def unsealed(text: str | None) -> str | None:
    """The encoded result without its seal, unchecked (for a ledger with no signing key)."""
    return None if text is None else _split(text)[1]
