"""Offline scripted models for agent loops on the OpenAI and Anthropic SDKs: for crash tests and the conformance kit.

A ``replaysafe.testing.Script`` says what the model answers, turn by turn. This module turns it into what
the SDK gives a loop, with the ids the provider would give (``chatcmpl-…``/``call_…``; ``resp_…``/``fc_…``/
``call_…``; ``msg_01…``/``toolu_01…``), each built from the JSON the API sends and validated by the SDK's own
pydantic model:

- ``chat_completion(script, turn)``, ``response(script, turn)``, ``message(script, turn)``: one turn's
  ``ChatCompletion``, ``Response`` or Anthropic ``Message``;
- ``scripted_openai(script)`` and ``scripted_anthropic(script)`` (and their async twins): the SDK's real
  client (``OpenAI``, ``Anthropic``), its HTTP transport answering offline, so a loop you wrote runs
  unchanged. ``client.chat.completions.create``, ``client.responses.create`` and ``client.messages.create``
  answer turn ``n``, the number of the model's answers in the conversation the request carries (assistant
  messages; for Responses, runs of output items in ``input``, after the turn of ``previous_response_id``).
  The client keeps no state: a process that resumes a saved conversation gets the answers, and the ids, that
  the crashed one got.

Each function imports only the SDK it answers for. ``boot`` counts the restarts of the process asking (0 for
its first run): it changes the ids only for a script made with ``new_ids_after_restart``, as a real model
asked again after a crash answers with new ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from replaysafe.testing import Script, provider_id

if TYPE_CHECKING:
    import httpx2
    from anthropic import Anthropic, AsyncAnthropic
    from anthropic.types import Message
    from openai import AsyncOpenAI, OpenAI
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response

__all__ = [
    "chat_completion",
    "message",
    "response",
    "scripted_anthropic",
    "scripted_async_anthropic",
    "scripted_async_openai",
    "scripted_openai",
    "turn_of",
]

#: The model name the scripted answers carry when the request names none.
MODEL = "scripted"
#: Where the scripted clients send their requests: nothing listens there, the transport answers.
_BASE_URL = "http://scripted.invalid"


def chat_completion(script: Script, turn: int, *, boot: int = 0, model: str = MODEL) -> ChatCompletion:
    """Turn ``turn``'s ``ChatCompletion``: its ``tool_calls`` (``finish_reason="tool_calls"``), or the final text."""
    from openai.types.chat import ChatCompletion

    answer = script.turn(turn)
    completion_id, call_ids = script.ids("openai-chat", turn, boot)
    content: dict[str, Any]
    if isinstance(answer, str):
        content, finish = {"content": answer}, "stop"
    else:
        calls = [
            {"id": call_id, "type": "function", "function": {"name": call.tool, "arguments": json.dumps(call.args)}}
            for call, call_id in zip(answer, call_ids, strict=True)
        ]
        content, finish = {"content": None, "tool_calls": calls}, "tool_calls"
    choice = {"index": 0, "finish_reason": finish, "message": {"role": "assistant", **content}}
    body = {"id": completion_id, "object": "chat.completion", "created": 1, "model": model, "choices": [choice]}
    return ChatCompletion.model_validate(body)


def response(script: Script, turn: int, *, boot: int = 0, model: str = MODEL) -> Response:
    """Turn ``turn``'s Responses ``Response``: ``function_call`` items (``fc_…`` item ids, ``call_…`` call ids),
    or an output message with the final text."""
    from openai.types.responses import Response

    answer = script.turn(turn)
    response_id, call_ids = script.ids("openai-responses", turn, boot)
    output: list[dict[str, Any]]
    if isinstance(answer, str):
        text = {"type": "output_text", "text": answer, "annotations": []}
        item_id = provider_id("openai-responses", "item", f"{response_id}|message")
        output = [{"type": "message", "id": item_id, "role": "assistant", "status": "completed", "content": [text]}]
    else:
        output = [
            {
                "type": "function_call",
                "id": provider_id("openai-responses", "item", call_id),
                "call_id": call_id,
                "name": call.tool,
                "arguments": json.dumps(call.args),
                "status": "completed",
            }
            for call, call_id in zip(answer, call_ids, strict=True)
        ]
    body = {
        "id": response_id,
        "object": "response",
        "created_at": 1,
        "model": model,
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    return Response.model_validate(body)


def message(script: Script, turn: int, *, boot: int = 0, model: str = MODEL) -> Message:
    """Turn ``turn``'s Anthropic ``Message``: ``tool_use`` blocks (``stop_reason="tool_use"``), or the final text."""
    from anthropic.types import Message

    answer = script.turn(turn)
    message_id, call_ids = script.ids("anthropic", turn, boot)
    content: list[dict[str, Any]]
    if isinstance(answer, str):
        content, stop = [{"type": "text", "text": answer}], "end_turn"
    else:
        content = [
            {"type": "tool_use", "id": call_id, "name": call.tool, "input": dict(call.args)}
            for call, call_id in zip(answer, call_ids, strict=True)
        ]
        stop = "tool_use"
    body = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    return Message.model_validate(body)


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _from_model(item: Any) -> bool:
    """Whether an input item is one the model produced: an assistant message, a function call, its reasoning."""
    return _field(item, "role") == "assistant" or _field(item, "type") in {"function_call", "reasoning"}


def turn_of(conversation: str | Iterable[Any]) -> int:
    """The number of the model's answers in a conversation: Chat Completions or Anthropic ``messages``, or
    Responses ``input`` items. Each run of what the model produced (assistant messages, function calls, reasoning
    items) is one answer: the tool results or the user's message that follow it end it."""
    if isinstance(conversation, str):
        return 0
    answers, inside = 0, False
    for item in conversation:
        produced = _from_model(item)
        answers += produced and not inside
        inside = produced
    return answers


def _responses_turn(script: Script, body: Mapping[str, Any], boot: int) -> int:
    """The turn a Responses request asks for: after its ``previous_response_id``'s, plus the answers in ``input``."""
    turn = turn_of(body.get("input") or [])
    previous = body.get("previous_response_id")
    if previous:
        for before in range(len(script.turns) + 1):
            if any(script.ids("openai-responses", before, b)[0] == previous for b in range(boot + 1)):
                return before + 1 + turn
        raise ValueError(f"previous_response_id {previous!r} is not a response of script {script.name!r}")
    return turn


def _transport(script: Script, boot: int) -> httpx2.MockTransport:
    import httpx2

    def answer(request: httpx2.Request) -> httpx2.Response:
        body: dict[str, Any] = json.loads(request.content or b"{}")
        model = str(body.get("model") or MODEL)
        path = request.url.path
        if path.endswith("/chat/completions"):
            data = chat_completion(script, turn_of(body.get("messages") or []), boot=boot, model=model).model_dump(
                mode="json", exclude_unset=True
            )
        elif path.endswith("/responses"):
            data = response(script, _responses_turn(script, body, boot), boot=boot, model=model).model_dump(
                mode="json", exclude_unset=True
            )
        elif path.endswith("/messages"):
            data = message(script, turn_of(body.get("messages") or []), boot=boot, model=model).model_dump(
                mode="json", exclude_unset=True
            )
        else:
            return httpx2.Response(404, json={"error": {"message": f"the scripted model does not answer {path}"}})
        return httpx2.Response(200, json=data)

    return httpx2.MockTransport(answer)


def scripted_openai(script: Script, *, boot: int = 0) -> OpenAI:
    """An ``openai.OpenAI`` client whose ``chat.completions.create`` and ``responses.create`` play ``script``
    offline (no network, no key): ``chat_completion``/``response`` of the turn the request's conversation is at."""
    import httpx2
    from openai import OpenAI

    http = httpx2.Client(transport=_transport(script, boot))
    return OpenAI(api_key="offline", base_url=f"{_BASE_URL}/v1", http_client=http, max_retries=0)


def scripted_async_openai(script: Script, *, boot: int = 0) -> AsyncOpenAI:
    """``scripted_openai`` as an ``openai.AsyncOpenAI`` client."""
    import httpx2
    from openai import AsyncOpenAI

    http = httpx2.AsyncClient(transport=_transport(script, boot))
    return AsyncOpenAI(api_key="offline", base_url=f"{_BASE_URL}/v1", http_client=http, max_retries=0)


def scripted_anthropic(script: Script, *, boot: int = 0) -> Anthropic:
    """An ``anthropic.Anthropic`` client whose ``messages.create`` plays ``script`` offline (no network, no key):
    ``message`` of the turn the request's ``messages`` are at."""
    import httpx2
    from anthropic import Anthropic

    http = httpx2.Client(transport=_transport(script, boot))
    return Anthropic(api_key="offline", base_url=_BASE_URL, http_client=http, max_retries=0)


def scripted_async_anthropic(script: Script, *, boot: int = 0) -> AsyncAnthropic:
    """``scripted_anthropic`` as an ``anthropic.AsyncAnthropic`` client."""
    import httpx2
    from anthropic import AsyncAnthropic

    http = httpx2.AsyncClient(transport=_transport(script, boot))
    return AsyncAnthropic(api_key="offline", base_url=_BASE_URL, http_client=http, max_retries=0)
