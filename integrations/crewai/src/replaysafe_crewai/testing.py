"""An offline CrewAI LLM that plays a ``replaysafe.testing.Script``: for crash tests and the conformance kit.

``ScriptedLLM(script=...)`` is a ``crewai.BaseLLM`` (CrewAI's own base for custom LLMs) that supports native
function calling. It answers turn ``n`` (the number of assistant messages in the conversation it is handed)
with that turn's tool calls, or with the final text. Its tool calls are what CrewAI's OpenAI provider hands
the executor: ``openai`` ``ChatCompletionMessageFunctionToolCall`` objects with Chat Completions call ids
(``call_…``). With ``ids=False`` they are dicts without an id, as some providers and gateways give them
(CrewAI then numbers them ``call_<id(obj)>``, new in every process). It keeps no state of its own, so a
process that resumes a crew gets the answers, and the ids, that the killed one got.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from crewai import BaseLLM
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_message_function_tool_call import Function

from replaysafe.testing import Script

__all__ = ["ScriptedLLM", "model_turn", "scripted_answer"]


def model_turn(messages: str | Sequence[Any]) -> int:
    """How many times the model has answered in ``messages`` (a call's input): its assistant messages."""
    if isinstance(messages, str):
        return 0
    return sum(1 for message in messages if isinstance(message, dict) and message.get("role") == "assistant")


def scripted_answer(script: Script, turn: int, *, boot: int = 0, ids: bool = True) -> str | list[Any]:
    """The model's answer at turn ``turn`` (from 0): its tool calls, or its final text.

    ``boot`` counts the restarts of the process asking (0 for its first run); it changes the ids only for a
    script made with ``new_ids_after_restart``.
    """
    answer = script.turn(turn)
    if isinstance(answer, str):
        return answer
    _, call_ids = script.ids("openai-chat", turn, boot)
    if not ids:
        return [{"function": {"name": call.tool, "arguments": json.dumps(dict(call.args))}} for call in answer]
    return [
        ChatCompletionMessageFunctionToolCall(
            id=call_id, type="function", function=Function(name=call.tool, arguments=json.dumps(dict(call.args)))
        )
        for call, call_id in zip(answer, call_ids, strict=True)
    ]


class ScriptedLLM(BaseLLM):
    """A CrewAI LLM playing ``script``: give it as ``Agent(llm=ScriptedLLM(script=...))``."""

    model: str = "scripted"
    script: Script
    #: The restarts of the process asking (0 for its first run): see ``scripted_answer``.
    boot: int = 0
    #: Whether the tool calls carry the provider's ids (``False``: dicts without one).
    ids: bool = True

    def __init__(self, **data: Any) -> None:
        data.setdefault("model", "scripted")  # CrewAI refuses an LLM without a model name
        super().__init__(**data)

    def call(
        self,
        messages: str | list[Any],
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> str | Any:
        answer = scripted_answer(self.script, model_turn(messages), boot=self.boot, ids=self.ids)
        if not isinstance(answer, str) and not tools:  # asked without tools (a summary, a guardrail): text
            return self.script.turn(len(self.script.turns))
        return answer

    async def acall(
        self,
        messages: str | list[Any],
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> str | Any:
        return self.call(messages, tools, callbacks, available_functions, from_task, from_agent, response_model)

    def supports_function_calling(self) -> bool:
        return True

    def get_input_tokens_count(
        self, messages: str | list[Any], tools: list[dict[str, Any]] | None = None, response_model: Any = None
    ) -> int:
        """One token per four characters, as CrewAI's fallback counts, without its warning for every call."""
        text = messages if isinstance(messages, str) else json.dumps(messages, default=str)
        return (len(text) + 3) // 4
