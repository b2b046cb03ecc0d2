"""replaysafe for Strands Agents: a finished tool call is not run again when a session is resumed.

``Agent(hooks=[ReplaySafeHooks(ledger)])`` swaps each tool a ``BeforeToolCallEvent`` selects for one that
runs it once per ``(thread id, the assistant message's tracking_id, toolUseId)``, and ends the run on
replaysafe's own refusals in ``AfterToolCallEvent``. The thread id is the agent's session
(``"<session id>/<agent id>"``), ``invocation_state["thread_id"]``, or ``thread_id=``.
"""

from __future__ import annotations

from ._hooks import ReplaySafeHooks, ThreadId, call_key, message_id, session_thread_id

__all__ = ["ReplaySafeHooks", "ThreadId", "call_key", "message_id", "session_thread_id"]
