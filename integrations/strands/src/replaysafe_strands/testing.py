"""An offline Strands model that plays a ``replaysafe.testing.Script``: for crash tests and the conformance kit.

``ScriptedModel(script)`` is a ``strands.models.Model`` that streams what Bedrock's Converse API streams
(``messageStart``, a ``contentBlockStart``/``contentBlockDelta``/``contentBlockStop`` per tool use or text,
``messageStop``, ``metadata``): at turn ``n`` (the number of assistant messages in the history it is handed)
it asks for that turn's tool calls, with the toolUseIds Bedrock gives (``tooluse_…``), or answers the final
text. The model keeps no state of its own, so a process that resumes a session gets the answers, and the
ids, the killed one got.

Strands gives every message an id of its own, its ``tracking_id`` (a UUID it saves with the message in the
session), which the adapter keys a call's message by. A UUID minted anew in every process would make every
run of a crash test a new conversation, so the model is also a ``HookProvider``: given among the agent's hooks
(``Agent(model=model, hooks=[model, ReplaySafeHooks(ledger)])``), it gives each of its messages a fixed UUID
derived from the script, as a provider fixes the ids of its own messages.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel
from strands.hooks import AfterModelCallEvent, HookRegistry
from strands.models import Model
from strands.types.content import Messages
from strands.types.streaming import StreamEvent
from strands.types.tools import ToolSpec

from replaysafe.testing import Script

__all__ = ["ScriptedModel", "model_turn", "tracking_id"]

T = TypeVar("T", bound=BaseModel)


def model_turn(messages: Sequence[Any]) -> int:
    """How many times the model has answered in ``messages``: its assistant messages."""
    return sum(1 for message in messages if isinstance(message, dict) and message.get("role") == "assistant")


def tracking_id(script: Script, turn: int, *, boot: int = 0) -> str:
    """The fixed ``tracking_id`` of the model's message at ``turn``: a UUID (version 4, as Strands mints) derived
    from the script's ids for that turn."""
    message_id, _ = script.ids("bedrock", turn, boot)
    return str(uuid.UUID(hashlib.sha256(message_id.encode()).hexdigest()[:32], version=4))


class ScriptedModel(Model):
    """A Strands model playing ``script`` turn by turn, for as many calls as it gets; among the agent's hooks
    too, it gives its messages fixed ``tracking_id``s.

    ``boot`` counts the restarts of the process asking (0 for its first run); it changes the ids only for a
    script made with ``new_ids_after_restart``.
    """

    def __init__(self, script: Script, *, boot: int = 0) -> None:
        self.script = script
        self.boot = boot
        self.config: dict[str, Any] = {"model_id": f"scripted-{script.name}"}

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Strands' ``HookProvider`` protocol: fix the ``tracking_id`` of each message this model answers."""
        registry.add_callback(AfterModelCallEvent, self._fix_tracking_id)

    def _fix_tracking_id(self, event: AfterModelCallEvent) -> None:
        # Before Strands appends the message (and gives it a UUID of its own when it has none).
        if event.stop_response is None or event.agent.model is not self:
            return
        turn = model_turn(event.agent.messages)
        event.stop_response.message["tracking_id"] = tracking_id(self.script, turn, boot=self.boot)

    def update_config(self, **model_config: Any) -> None:
        self.config.update(model_config)

    def get_config(self) -> dict[str, Any]:
        return self.config

    async def structured_output(
        self, output_model: type[T], prompt: Messages, system_prompt: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[dict[str, T | Any], None]:
        raise NotImplementedError("the scripted model answers tool calls and text only")
        yield {}  # an async generator, as the interface declares

    async def stream(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None = None,
        system_prompt: str | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[StreamEvent, None]:
        turn = model_turn(messages)
        answer = self.script.turn(turn)
        _, call_ids = self.script.ids("bedrock", turn, self.boot)
        yield {"messageStart": {"role": "assistant"}}
        if isinstance(answer, str):
            yield {"contentBlockStart": {"start": {}}}
            yield {"contentBlockDelta": {"delta": {"text": answer}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
        else:
            for call, call_id in zip(answer, call_ids, strict=True):
                yield {"contentBlockStart": {"start": {"toolUse": {"toolUseId": call_id, "name": call.tool}}}}
                yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(dict(call.args))}}}}
                yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
        yield {
            "metadata": {
                "usage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
                "metrics": {"latencyMs": 0},
            }
        }
