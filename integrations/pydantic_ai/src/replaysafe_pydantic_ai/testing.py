"""An offline Pydantic AI model that plays a ``replaysafe.testing.Script``: for crash tests and the conformance kit.

``scripted_model(script)`` is a ``FunctionModel`` (Pydantic AI's own test model) that answers turn ``n`` (the
number of ``ModelResponse`` messages in the history it is handed) with that turn's tool calls, or with the
final text, carrying the ids a provider would give: ``provider_response_id`` (the message id the adapter keys
a call by) and ``tool_call_id``. It keeps no state of its own, so a process that resumes a persisted message
history gets the answers, and the ids, the crashed process got.
"""

from __future__ import annotations

from pydantic_ai.messages import ModelMessage, ModelResponse, ModelResponsePart, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from replaysafe.testing import IdStyle, Script, provider_id

__all__ = ["scripted_model", "scripted_response"]

#: The ``provider_name`` a response of each id style carries (what Pydantic AI's own model for it sets).
_PROVIDERS: dict[str, str] = {
    "openai-chat": "openai",
    "openai-responses": "openai",
    "anthropic": "anthropic",
    "gemini": "google-gla",
    "bedrock": "bedrock",
}


def scripted_response(script: Script, turn: int, *, boot: int = 0, style: IdStyle = "openai-chat") -> ModelResponse:
    """The model's answer at turn ``turn`` (from 0): its tool calls, or its final text, with ``style``'s ids.

    On the Responses style each call also gets an output item id (``fc_…``, in ``ToolCallPart.id``), as
    Pydantic AI's ``OpenAIResponsesModel`` stores it. ``boot`` counts the restarts of the process asking (0
    for its first run); it changes the ids only for a script made with ``new_ids_after_restart``.
    """
    answer = script.turn(turn)
    response_id, call_ids = script.ids(style, turn, boot)
    provider = _PROVIDERS[style]
    parts: list[ModelResponsePart]
    if isinstance(answer, str):
        parts = [TextPart(answer)]
    else:
        parts = []
        for call, call_id in zip(answer, call_ids, strict=True):
            if style == "openai-responses":
                item_id = provider_id(style, "item", call_id)
                parts.append(ToolCallPart(call.tool, dict(call.args), call_id, id=item_id, provider_name=provider))
            else:
                parts.append(ToolCallPart(call.tool, dict(call.args), call_id))
    return ModelResponse(parts=parts, provider_response_id=response_id, provider_name=provider)


def scripted_model(script: Script, *, boot: int = 0, style: IdStyle = "openai-chat") -> FunctionModel:
    """A ``FunctionModel`` that plays ``script``: turn ``n`` is the number of model responses in the history.

    Use it as an agent's model (``Agent(scripted_model(script), tools=[...])``); run it again on the
    persisted history after a crash and it answers as it did. ``style`` chooses the ids' shape
    (``chatcmpl-…``/``call_…`` by default; ``"openai-responses"``: ``resp_…``, ``fc_…``, ``call_…``).
    """

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(message, ModelResponse) for message in messages)
        return scripted_response(script, turn, boot=boot, style=style)

    return FunctionModel(respond, model_name=f"scripted:{script.name}")
