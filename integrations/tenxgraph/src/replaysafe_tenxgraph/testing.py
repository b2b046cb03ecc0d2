"""An offline model node that plays a ``replaysafe.testing.Script``: crash-test a 10xGraph agent without a network
or keys.

``scripted_model(script)`` is a 10xGraph ``TestAgent`` (its own test double for ``Agent``, the ``MAIN`` node of a
``ReactAgent``-shaped graph): it answers turn ``n``, where ``n`` is the number of assistant messages in the
thread's ``state.context`` (its own earlier answers), with that turn's tool calls or its final text. It keeps no
state, so a process that resumes a thread after a crash gets the answer the crashed one got, under ``ainvoke``
and ``astream`` alike. Each answer carries the ids a real provider would give it (``Script.ids``): the
assistant message's ``message_id`` (``chatcmpl-…`` in the default ``openai-chat`` style, ``msg_01…`` in the
``anthropic`` one) and each tool call's id (``call_…``, ``toolu_01…``), in the shape 10xGraph stores a provider's
tool calls (``tools_calls`` of ``{"id", "type": "function", "function": {"name", "arguments"}}``, and a
``ToolCallBlock`` each): the ids ``replaysafe_tenxgraph`` keys a call by.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import ContentBlock, TextBlock, ToolCallBlock
from tenxgraph.qa.testing import TestAgent
from tenxgraph.runtime.adapters.llm.base_converter import BaseConverter
from tenxgraph.runtime.adapters.llm.model_response_converter import ModelResponseConverter

from replaysafe.testing import IdStyle, Script

__all__ = ["ScriptedModel", "scripted_model"]

#: The ``provider`` 10xGraph's converters write in a message's metadata, by id style.
_PROVIDERS: dict[str, str] = {
    "openai-chat": "openai",
    "openai-responses": "openai",
    "anthropic": "anthropic",
    "gemini": "google",
    "bedrock": "bedrock",
}


class _AsIs(BaseConverter):
    """Hands 10xGraph the scripted ``Message`` as a provider converter would hand it the converted one."""

    async def convert_response(self, response: Any) -> Message:
        if not isinstance(response, Message):
            raise TypeError(f"the scripted model answers with a Message, not {type(response).__name__}")
        return response

    # 10xGraph declares it a coroutine that returns a generator, and iterates it as an async generator, as
    # its own converters are: so is this one.
    async def convert_streaming_response(  # type: ignore[override]
        self, config: dict[str, Any], node_name: str, response: Any, meta: dict[str, Any] | None = None
    ) -> AsyncGenerator[Message]:
        yield await self.convert_response(response)


class ScriptedModel(TestAgent):
    """A 10xGraph model node that answers from a ``Script``, turn by turn, with a provider's ids.

    Build it with :func:`scripted_model` and add it as the graph's model node
    (``graph.add_node("MAIN", scripted_model(script))``, or ``graph.override_node("MAIN", ...)``).
    ``call_count`` and ``call_history`` count this process's answers, as ``TestAgent``'s do.
    """

    def __init__(self, script: Script, *, boot: int = 0, style: IdStyle = "openai-chat") -> None:
        super().__init__(model=f"scripted/{script.name}", responses=["done"])
        self.script = script
        #: How many runs of the agent came before this one (0: the first; 1: the restart after a crash). It
        #: changes the ids only when the script says ``new_ids_after_restart`` (a model that re-plans).
        self.boot = boot
        #: The provider whose ids the answers carry.
        self.style: IdStyle = style

    def answer(self, state: AgentState) -> Message:
        """The answer to a thread: the script's turn ``n``, ``n`` its assistant messages so far."""
        context = state.context or []
        turn = sum(message.role == "assistant" and not message.delta for message in context)
        planned = self.script.turn(turn)
        message_id, call_ids = self.script.ids(self.style, turn, self.boot)
        metadata = {"provider": _PROVIDERS[self.style], "model": self.model}
        if isinstance(planned, str):
            return Message(
                message_id=message_id,
                role="assistant",
                content=[TextBlock(text=planned)],
                metadata={**metadata, "finish_reason": "stop"},
            )
        blocks: list[ContentBlock] = []
        calls: list[dict[str, Any]] = []
        for call_id, call in zip(call_ids, planned, strict=True):
            arguments = dict(call.args)
            blocks.append(ToolCallBlock(id=call_id, name=call.tool, args=arguments))
            function = {"name": call.tool, "arguments": json.dumps(arguments)}
            calls.append({"id": call_id, "type": "function", "function": function})
        return Message(
            message_id=message_id,
            role="assistant",
            content=blocks,
            tools_calls=calls,
            metadata={**metadata, "finish_reason": "tool_calls"},
        )

    async def execute(self, state: AgentState, config: dict[str, Any]) -> ModelResponseConverter:
        """The model node's step: this turn's answer, through 10xGraph's response conversion."""
        message = self.answer(state)
        self.call_count += 1
        self.call_history.append({"messages": list(state.context or []), "tools": None, "kwargs": {}})
        return ModelResponseConverter(message, converter=_AsIs())


def scripted_model(script: Script, *, boot: int = 0, style: IdStyle = "openai-chat") -> ScriptedModel:
    """A 10xGraph model node that plays ``script`` offline, in place of ``Agent(model=...)``.

    ``boot`` counts the runs of the agent before this one on the same thread (0 for the first, 1 for the
    run that resumes after a crash): with ``Script(..., new_ids_after_restart=True)`` a model asked again
    after a restart answers under new ids, as a real one does. ``style`` picks the provider whose ids the
    answers carry (``"openai-chat"``, ``"anthropic"``, ...).
    """
    return ScriptedModel(script, boot=boot, style=style)
