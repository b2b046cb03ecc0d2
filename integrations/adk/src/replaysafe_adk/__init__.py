"""replaysafe for Google ADK: a tool call that finished is not run again when an invocation is resumed.

``ReplaySafePlugin(ledger)`` is an ADK plugin (``Runner(..., plugins=[...])`` or ``App(..., plugins=[...])``). A
call is keyed by ``(session id, id of the session event holding the model's function call, function call id)``.
"""

from __future__ import annotations

from ._plugin import ReplaySafePlugin, call_key, message_id, replaysafe_error

__all__ = ["ReplaySafePlugin", "call_key", "message_id", "replaysafe_error"]
