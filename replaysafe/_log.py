"""Logging: the ``replaysafe`` logger, with the call's ids as ``extra`` fields.

Arguments and results are never logged (they carry personal data), only digests.
"""

from __future__ import annotations

import logging

from ._records import CallKey

logger = logging.getLogger("replaysafe")


def log(level: int, message: str, *, tool_name: str, key: CallKey, **fields: object) -> None:
    if logger.isEnabledFor(level):
        extra = {
            "replaysafe_tool_name": tool_name,
            "replaysafe_thread_id": key.thread_id,
            "replaysafe_message_id": key.message_id,
            "replaysafe_tool_call_id": key.tool_call_id,
            **{f"replaysafe_{name}": value for name, value in fields.items()},
        }
        logger.log(level, message, extra=extra, stacklevel=2)
