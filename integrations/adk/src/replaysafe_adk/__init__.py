"""replaysafe for Google ADK: a tool call that finished is not run again when an invocation is resumed.

``ReplaySafePlugin(ledger)`` is an ADK plugin (``Runner(..., plugins=[...])`` or ``App(..., plugins=[...])``). A
call is keyed by ``(session id, id of the session event holding the model's function call, function call id)``.
ADK's tool confirmations are recorded as approvals bound to the call (``replaysafe.approvals``): see the README,
"Approvals".
"""

from __future__ import annotations

from ._plugin import APPROVER, ReplaySafePlugin, call_key, confirmation_answer, message_id, replaysafe_error

__all__ = ["APPROVER", "ReplaySafePlugin", "call_key", "confirmation_answer", "message_id", "replaysafe_error"]
