"""An offline LlamaIndex LLM that plays a ``replaysafe.testing.Script``: for crash tests and the conformance kit.

``scripted_llm(script)`` is LlamaIndex's own test model (``MockFunctionCallingLLM``) answering turn ``n`` (the
number of assistant messages in the chat history it is handed) with that turn's tool calls, as
``ToolCallBlock``s, or with the final text, carrying the ids OpenAI's Chat Completions API gives: the
completion id (``chatcmpl-…``) in the response's ``raw`` (where LlamaIndex's OpenAI integration leaves it) and
each tool call id (``call_…``). It keeps no state of its own, so a process that resumes a run from a saved
``Context`` gets the answers, and the ids, the crashed process got.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.llms.mock import MockFunctionCallingLLM
from pydantic import PrivateAttr

from replaysafe.testing import IdStyle, Script

__all__ = ["ScriptedLLM", "model_turn", "scripted_llm", "scripted_message"]

#: The id shapes of the provider the scripted model stands for (LlamaIndex's ``OpenAI`` LLM).
ID_STYLE: IdStyle = "openai-chat"


def model_turn(messages: Sequence[ChatMessage]) -> int:
    """How many times the model has answered in ``messages``: its assistant messages."""
    return sum(1 for message in messages if message.role == MessageRole.ASSISTANT)


def scripted_message(script: Script, turn: int, *, boot: int = 0) -> tuple[ChatMessage, dict[str, Any]]:
    """The model's answer at turn ``turn`` (from 0) and its ``raw`` response, with Chat Completions ids.

    ``boot`` counts the restarts of the process asking (0 for its first run); it changes the ids only for a
    script made with ``new_ids_after_restart``.
    """
    answer = script.turn(turn)
    response_id, call_ids = script.ids(ID_STYLE, turn, boot)
    raw = {"id": response_id, "object": "chat.completion", "model": "scripted"}
    if isinstance(answer, str):
        return ChatMessage(role=MessageRole.ASSISTANT, content=answer), raw
    blocks = [
        ToolCallBlock(tool_call_id=call_id, tool_name=call.tool, tool_kwargs=dict(call.args))
        for call, call_id in zip(answer, call_ids, strict=True)
    ]
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=list(blocks)), raw


class ScriptedLLM(MockFunctionCallingLLM):
    """``MockFunctionCallingLLM`` playing a script, its answers carrying a ``raw`` response with its id."""

    _script: Script = PrivateAttr()
    _boot: int = PrivateAttr(default=0)

    def __init__(self, script: Script, *, boot: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._script = script
        self._boot = boot

    @classmethod
    def class_name(cls) -> str:
        return "ScriptedLLM"

    def _answer(self, messages: Sequence[ChatMessage]) -> ChatResponse:
        message, raw = scripted_message(self._script, model_turn(messages), boot=self._boot)
        return ChatResponse(message=message, delta=message.content or "", raw=raw)

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._answer(messages)

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._answer(messages)

    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        response = self._answer(messages)

        async def stream() -> AsyncGenerator[ChatResponse, None]:
            yield response

        return stream()


def scripted_llm(script: Script, *, boot: int = 0) -> ScriptedLLM:
    """A LlamaIndex function-calling LLM that plays ``script``, turn by turn, for as many calls as it gets.

    Use it as an agent's ``llm`` (``FunctionAgent(tools=[...], llm=scripted_llm(script))``); a run resumed from
    a saved ``Context`` asks it again and it answers as it did.
    """
    return ScriptedLLM(script, boot=boot)
