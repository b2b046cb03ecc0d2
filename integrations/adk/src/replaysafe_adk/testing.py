"""An offline ADK model that plays a ``replaysafe.testing.Script``: for crash tests and the conformance kit.

``ScriptedLlm(script)`` is an ADK ``BaseLlm``: it answers turn ``n`` (the number of the model's earlier answers
in the request's contents) with that turn's function calls, or with the final text. Like Gemini, it gives its
function calls no ids: ADK mints them (``adk-<uuid>``), as it mints every event's id (a uuid) and every
invocation's (``e-<uuid>``), from ``google.adk.platform.uuid``. ``stable_ids(seed)`` makes those a fixed sequence
for the current context, so that a run started again from the beginning sees the ids the first one saw (what
``replaysafe crashtest`` needs); a process that resumes a session reads the ids it saved and mints new ones only
for what it adds, so give it another seed (``boot``, the number of runs before it) to keep them apart.
"""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import AsyncGenerator

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.platform import uuid as platform_uuid
from google.genai import types

from replaysafe.testing import Script

__all__ = ["ScriptedLlm", "model_turn", "stable_ids"]

#: ADK's own function calls (a confirmation or credential request): not the model's answers.
_ADK_CALLS = frozenset({"adk_request_confirmation", "adk_request_credential"})


def model_turn(request: LlmRequest) -> int:
    """How many times the model has answered in the request's contents (ADK's own requests not counted)."""
    turns = 0
    for content in request.contents:
        if content.role != "model":
            continue
        calls = [part.function_call.name for part in content.parts or () if part.function_call is not None]
        if calls and all(name in _ADK_CALLS for name in calls):
            continue
        turns += 1
    return turns


class ScriptedLlm(BaseLlm):
    """An ADK model playing ``script``, turn by turn, for as many requests as it gets (no state of its own)."""

    model: str = "replaysafe-scripted"
    script: Script

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        answer = self.script.turn(model_turn(llm_request))
        if isinstance(answer, str):
            parts = [types.Part(text=answer)]
        else:  # no ids, as Gemini gives none: ADK mints them
            parts = [types.Part(function_call=types.FunctionCall(name=c.tool, args=dict(c.args))) for c in answer]
        yield LlmResponse(content=types.Content(role="model", parts=parts), turn_complete=True)


def stable_ids(seed: str) -> None:
    """Make the ids ADK mints in the current context (events, invocations, function calls) a sequence fixed by
    ``seed``: uuid-shaped, as ADK's own, and the same in every process given the same seed."""
    counter = itertools.count()

    def next_id() -> str:
        digest = hashlib.sha256(f"{seed}|{next(counter)}".encode()).digest()
        return str(uuid.UUID(bytes=digest[:16], version=4))

    platform_uuid.set_id_provider(next_id)
