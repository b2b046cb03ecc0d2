"""Tamper-evident records: an HMAC over what a replay would trust.

Anyone who can write to the ledger's store could otherwise make a protected tool
"return" a forged result without running. With a signing key, every finished
record's result is stored as ``rs-seal-1:<hmac>:<encoded result>``, the HMAC-SHA256
covering the call key, tool name, argument digest, status and encoded result. A
record whose seal does not check is never returned as a result.
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


class Sealer:
    """Seals with the first key; accepts a seal made by any of them (for key rotation)."""

    __slots__ = ("_secrets",)

    def __init__(self, keys: Sequence[str | bytes]) -> None:
        secrets = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
        if not secrets or any(len(s) < 16 for s in secrets):
            raise ValueError("signing keys must be given, each at least 16 bytes long")
        self._secrets = secrets

    @classmethod
    def from_setting(cls, signing_key: str | bytes | Sequence[str | bytes] | None) -> Sealer | None:
        """From ``signing_key=`` (one key or a list, the first signs) or ``REPLAYSAFE_SIGNING_KEY``
        (comma-separated); ``None`` when neither is set."""
        if signing_key is None:
            from_env = os.environ.get(SIGNING_KEY_ENV, "")
            keys: list[str | bytes] = [k for k in from_env.split(",") if k]
            return cls(keys) if keys else None
        if isinstance(signing_key, (str, bytes)):
            return cls([signing_key])
        return cls(list(signing_key))

    @staticmethod
    def _mac(secret: bytes, key: CallKey, tool_name: str, args_digest: str, status: Status, encoded: str) -> str:
        message = json.dumps([*key, tool_name, args_digest, status.value, encoded], ensure_ascii=True)
        return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()

    def seal(self, key: CallKey, tool_name: str, args_digest: str, status: Status, encoded: str) -> str:
        return f"{_PREFIX}{self._mac(self._secrets[0], key, tool_name, args_digest, status, encoded)}:{encoded}"

    def open(self, record: Record) -> str | None:
        """The record's encoded result, if its seal checks; else ``TamperedRecordError``."""
        if record.result is None:
            return None
        mac, encoded = _split(record.result)
        if mac is not None:
            for secret in self._secrets:
                expected = self._mac(secret, record.key, record.tool_name, record.args_digest, record.status, encoded)
                if hmac.compare_digest(mac, expected):
                    return encoded
        how = "written without a seal" if mac is None else "altered, or sealed with a key this ledger does not accept"
        raise TamperedRecordError(
            f"the {record.status} record of {describe(record.tool_name, record.key)} fails its seal check: it was "
            f"{how}. It is not returned as a result and nothing ran. Inspect the store (who can write to it?), "
            "then delete or resolve the record.",
            tool_name=record.tool_name,
            key=record.key,
        )


def _split(text: str) -> tuple[str | None, str]:
    if not text.startswith(_PREFIX):
        return None, text
    mac, _, encoded = text[len(_PREFIX) :].partition(":")
    return mac, encoded


def unsealed(text: str | None) -> str | None:
    """The encoded result without its seal, unchecked (for a ledger with no signing key)."""
    return None if text is None else _split(text)[1]
