"""replaysafe for agent loops written on the OpenAI Python SDK (Chat Completions and Responses).

Persist the model's response before running its tool calls; on resume, process the stored
response again. ``run_tool_calls`` keys each call by ``(thread_id, response id, call id)``, so a
call that finished before a crash returns its recorded result instead of running again.

    completion = client.chat.completions.create(model=..., messages=messages, tools=specs)
    store.save(completion.model_dump_json())           # before any tool runs
    messages.append(completion.choices[0].message.model_dump(exclude_none=True))
    messages.extend(run_tool_calls(completion, tools, thread_id=thread_id, ledger=ledger))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, overload

from openai.types.chat import ChatCompletion, ChatCompletionToolMessageParam
from openai.types.responses import Response, ResponseFunctionToolCall
from openai.types.responses.response_input_param import FunctionCallOutput

from replaysafe import CallKey, Ledger

from ._loops import Call, as_text, parse_arguments, runner

__all__ = ["Call", "arun_tool_calls", "run_tool_calls", "tool_calls"]


def tool_calls(response: ChatCompletion | Response, *, thread_id: str) -> list[Call]:
    """The function calls of a ``ChatCompletion`` (its first choice) or a ``Response``, keyed.

    The message id is ``ChatCompletion.id`` (``chatcmpl-…``) or ``Response.id`` (``resp_…``); the
    tool call id is the call's ``id`` (Chat Completions) or ``call_id`` (Responses).
    """
    calls: list[Call] = []
    if isinstance(response, ChatCompletion):
        message = response.choices[0].message if response.choices else None
        for chat_call in (message.tool_calls if message is not None else None) or []:
            key = CallKey(thread_id, response.id, chat_call.id)
            if chat_call.type != "function":
                raise ValueError(f"call {key}: {chat_call.type} tool calls are not supported; run it yourself")
            name = chat_call.function.name
            describe = f"tool call {name!r} ({key})"
            calls.append(Call(key, name, parse_arguments(chat_call.function.arguments, describe=describe)))
        return calls
    for item in response.output:
        if item.type == "custom_tool_call":
            raise ValueError(f"call {item.call_id} of response {response.id}: custom tool calls are not supported")
        if isinstance(item, ResponseFunctionToolCall):
            key = CallKey(thread_id, response.id, item.call_id)
            describe = f"tool call {item.name!r} ({key})"
            calls.append(Call(key, item.name, parse_arguments(item.arguments, describe=describe)))
    return calls


def _result(response: ChatCompletion | Response, call: Call, result: Any) -> Any:
    if isinstance(response, ChatCompletion):
        return ChatCompletionToolMessageParam(role="tool", tool_call_id=call.key.tool_call_id, content=as_text(result))
    return FunctionCallOutput(type="function_call_output", call_id=call.key.tool_call_id, output=as_text(result))


@overload
def run_tool_calls(
    response: ChatCompletion,
    tools: Mapping[str, Callable[..., Any]],
    *,
    thread_id: str,
    ledger: Ledger | None = None,
    pauses: Sequence[type[BaseException]] = (),
    **options: Any,
) -> list[ChatCompletionToolMessageParam]: ...


@overload
def run_tool_calls(
    response: Response,
    tools: Mapping[str, Callable[..., Any]],
    *,
    thread_id: str,
    ledger: Ledger | None = None,
    pauses: Sequence[type[BaseException]] = (),
    **options: Any,
) -> list[FunctionCallOutput]: ...


def run_tool_calls(
    response: ChatCompletion | Response,
    tools: Mapping[str, Callable[..., Any]],
    *,
    thread_id: str,
    ledger: Ledger | None = None,
    pauses: Sequence[type[BaseException]] = (),
    **options: Any,
) -> list[ChatCompletionToolMessageParam] | list[FunctionCallOutput]:
    """Run the response's tool calls one by one, each at most once; their results, ready to append.

    Chat Completions: ``{"role": "tool", "tool_call_id", "content"}`` messages. Responses:
    ``{"type": "function_call_output", "call_id", "output"}`` items. ``tools`` maps tool names to
    functions taking the call's JSON arguments as keyword arguments. A function decorated with
    ``@replay_safe`` protects itself; any other is protected here, with ``options`` as
    ``@replay_safe`` options. A result that is not a string is sent as JSON. A tool that raises
    stops the run; its error propagates and is not recorded, so processing the same response again
    replays the finished calls and runs the failed one again.
    """
    run = runner(tools, ledger, pauses, options)
    return [_result(response, call, run.run(call)) for call in tool_calls(response, thread_id=thread_id)]


@overload
async def arun_tool_calls(
    response: ChatCompletion,
    tools: Mapping[str, Callable[..., Any]],
    *,
    thread_id: str,
    ledger: Ledger | None = None,
    pauses: Sequence[type[BaseException]] = (),
    **options: Any,
) -> list[ChatCompletionToolMessageParam]: ...


@overload
async def arun_tool_calls(
    response: Response,
    tools: Mapping[str, Callable[..., Any]],
    *,
    thread_id: str,
    ledger: Ledger | None = None,
    pauses: Sequence[type[BaseException]] = (),
    **options: Any,
) -> list[FunctionCallOutput]: ...


async def arun_tool_calls(
    response: ChatCompletion | Response,
    tools: Mapping[str, Callable[..., Any]],
    *,
    thread_id: str,
    ledger: Ledger | None = None,
    pauses: Sequence[type[BaseException]] = (),
    **options: Any,
) -> list[ChatCompletionToolMessageParam] | list[FunctionCallOutput]:
    """``run_tool_calls`` for async loops: async tools are awaited, sync ones run in a worker thread."""
    run = runner(tools, ledger, pauses, options)
    return [_result(response, call, await run.arun(call)) for call in tool_calls(response, thread_id=thread_id)]
