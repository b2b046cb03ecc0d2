"""The conformance kit's drivers for agent loops written by hand on the OpenAI and Anthropic SDKs.

The agent is the loop the README describes: ask the model with the SDK's real client (offline:
``replaysafe_sdk_loops.testing.scripted_openai``/``scripted_anthropic`` play the kit's script with the
provider's ids), save its response, run the response's tool calls with ``run_tool_calls`` (the adapter; the
control runs them plain), append the response and the results to the conversation and save it, until the
model answers with text. The conversation is one JSON file in the run's folder; a run finds it there and
continues: a response saved with its results pending is processed again, as the README asks.

A tool's error is the loop's to answer (``run_tool_calls`` lets it propagate): the loop protects each tool
itself, ``@replay_safe`` with the run's options (the helpers leave a decorated tool to its own protection),
and wraps it outside that protection so that an exception (the tool's own, or its failure recorded under
``record_errors`` and replayed as ``RecordedToolError``) becomes the call's result, ``{"error": ...}``, for
the model; replaysafe's own refusals (``CONTROL_ERRORS``) still end the run. The wrapper is outside the
protection: a failure answered inside it would be recorded as the call's result (docs/adapters.md, section 7).

Approvals (the loop's own flow, on the README's approvals section): before running a response's calls whose tool
``needs_approval``, the loop asks its human about each call it has no answer for, and keeps the answer (approve,
approve with an edit, or reject) in a file in the run's folder before anything else happens, with the call it was
given for and the arguments it saw, by the call's place in the conversation (turn, position): a resume hands it back
there. The adapter path records a kept answer as an approval bound to that call and those arguments
(``replaysafe.approvals.request``, then ``approve``, with the edit and the run's ``approval_expires_in``, or
``reject``), once: only while the call waits for its first decision (``approvals.state``), and never for a call the
answer was not given for (a re-plan under new ids asks for its own). The response is then run with
``run_tool_calls``: replaysafe runs an approved edit, and a recorded rejection (``ApprovalRejectedError``) becomes
the loop's rejection answer to the model. A call nobody answers, or one the adapter refuses
(``ApprovalRequiredError``: asked again, in doubt after it ran on its approval, or another call's answer;
``ReplayMismatchError``: other arguments than approved, or than run under the key; ``ApprovalExpiredError``)
ends the run waiting for a new decision. The control runs the calls plain on the kept answers, as the loop does
without replaysafe: a rejected call gets the rejection answer and does not run, an edit runs in place of the
model's arguments.

``save_response=False`` is a loop that saves the conversation only once a turn's tools have run: a crash
mid-turn loses the response and its resume asks the model again, which answers with new ids (or other
arguments). That is the re-plan of ``replan_args`` (``key="args"``), ``approval_args_changed`` and
``approval_reused``, which a loop that saves the response first cannot have.

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from replaysafe import (
    CONTROL_ERRORS,
    ApprovalExpiredError,
    ApprovalRejectedError,
    ApprovalRequiredError,
    CallKey,
    RecordedToolError,
    ReplayMismatchError,
    approvals,
    replay_safe,
)
from replaysafe.testing.conformance import AgentRun
from replaysafe_sdk_loops.testing import turn_of

if TYPE_CHECKING:  # each run imports only the SDK of its style: a child process pays for one
    from anthropic.types import Message
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response

Style = Literal["openai-chat", "openai-responses", "anthropic"]
PROMPT = "Handle order A1 for ana@example.com"


def specs(style: Style, tools: Mapping[str, Callable[..., Any]]) -> list[dict[str, Any]]:
    """The tools as the API takes them (every parameter a string, as the kit's tools take)."""
    out = []
    for name, function in tools.items():
        parameters = {
            "type": "object",
            "properties": {p: {"type": "string"} for p in inspect.signature(function).parameters},
            "required": list(inspect.signature(function).parameters),
        }
        description = inspect.getdoc(function) or name
        if style == "openai-chat":
            function_spec = {"name": name, "description": description, "parameters": parameters}
            out.append({"type": "function", "function": function_spec})
        elif style == "openai-responses":
            out.append({"type": "function", "name": name, "description": description, "parameters": parameters})
        else:
            out.append({"name": name, "description": description, "input_schema": parameters})
    return out


def load(style: Style, text: str) -> ChatCompletion | Response | Message:
    """A saved response, validated by its SDK's model."""
    if style == "openai-chat":
        from openai.types.chat import ChatCompletion

        return ChatCompletion.model_validate_json(text)
    if style == "openai-responses":
        from openai.types.responses import Response

        return Response.model_validate_json(text)
    from anthropic.types import Message

    return Message.model_validate_json(text)


def calls(style: Style, answer: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """The answer's tool calls as ``(call id, tool, arguments)``, read from the SDK object (the control's own)."""
    if style == "openai-chat":
        return [
            (call.id, call.function.name, json.loads(call.function.arguments))
            for call in answer.choices[0].message.tool_calls or []
            if call.type == "function"
        ]
    if style == "openai-responses":
        return [(i.call_id, i.name, json.loads(i.arguments)) for i in answer.output if i.type == "function_call"]
    return [(b.id, b.name, dict(b.input)) for b in answer.content if b.type == "tool_use"]


def as_text(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result)


def error_answer(error: Exception) -> dict[str, str]:
    """What the model reads of a tool's error: the same for the failure and for its recorded replay."""
    if isinstance(error, RecordedToolError):
        return {"error": f"{error.error_type}: {error.error_message}"}
    return {"error": f"{type(error).__name__}: {error}"}


def rejection_answer(reason: str | None) -> dict[str, str]:
    """What the model reads of a call its human rejected: the loop's own answer, with the adapter or without."""
    return {"error": f"rejected by its human: {reason or 'no reason given'}"}


#: The reason the kit's human gives for a rejection.
REJECTED_BECAUSE = "the human said no"


def answering_errors(tool: Callable[..., Any]) -> Callable[..., Any]:
    """``tool`` (``@replay_safe``: the helpers see it through ``functools.wraps``) with its errors as its answer,
    and a rejection recorded for its call as the loop's rejection answer; replaysafe's other refusals propagate and
    end the run."""

    @functools.wraps(tool)
    def answering(**arguments: Any) -> Any:
        try:
            return tool(**arguments)
        except ApprovalRejectedError as rejected:
            return rejection_answer(rejected.reason)  # outside the protection: nothing recorded, nothing ran
        except CONTROL_ERRORS:
            raise
        except Exception as error:
            return error_answer(error)

    return answering


def plain_results(
    style: Style, answer: Any, tools: Mapping[str, Callable[..., Any]], kept: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The control: each call run as the loop would without the adapter, its result in the SDK's shape; a call
    its human answered (``kept``, by call id) is rejected or run with the edit, as the loop does on its own."""
    done = []
    for call_id, name, arguments in calls(style, answer):
        decided = kept.get(call_id)
        if decided is not None and not decided["approve"]:
            done.append((call_id, as_text(rejection_answer(REJECTED_BECAUSE))))
            continue
        edited = decided["args"] if decided is not None and decided["args"] is not None else arguments
        done.append((call_id, as_text(answering_errors(tools[name])(**edited))))
    if style == "openai-chat":
        return [{"role": "tool", "tool_call_id": call_id, "content": text} for call_id, text in done]
    if style == "openai-responses":
        return [{"type": "function_call_output", "call_id": call_id, "output": text} for call_id, text in done]
    blocks = [{"type": "tool_result", "tool_use_id": call_id, "content": text} for call_id, text in done]
    return [{"role": "user", "content": blocks}] if blocks else []


def as_input(style: Style, answer: Any) -> list[dict[str, Any]]:
    """The answer as the next request carries it (an assistant message, or the Responses output items)."""
    if style == "openai-chat":
        return [answer.choices[0].message.model_dump(exclude_none=True)]
    if style == "openai-responses":
        return [item.model_dump(exclude_none=True) for item in answer.output]
    return [{"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in answer.content]}]


class _AwaitingHumanError(Exception):
    """The run stops here: a tool call waits for its human's answer."""


class SdkLoopDriver:
    """A hand-written loop on one SDK style; ``asynchronous`` runs the calls with ``arun_tool_calls``."""

    #: The loop answers a tool's error to the model (``answering_errors``) and asks its human before a tool that
    #: ``needs_approval`` (``answers``, then ``record``): both are the app's, on top of the helpers.
    offers = frozenset({"approvals", "tool_errors"})

    def __init__(self, style: Style, *, save_response: bool = True, asynchronous: bool = False) -> None:
        self.style: Style = style
        self.save_response = save_response
        self.asynchronous = asynchronous
        no_replan = (
            "the loop saves the model's response before running its tool calls, as the README asks, so a resume "
            "processes that response again under its ids and the model is never asked to re-plan; the re-plan is "
            "proven on the loop that saves only finished turns (save_response=False)"
        )
        self.not_applicable: dict[str, str] = (
            {"replan_args": no_replan, "approval_args_changed": no_replan, "approval_reused": no_replan}
            if save_response
            else {}
        )

    def ask(self, run: AgentRun, conversation: list[dict[str, Any]]) -> Any:
        """The model's next response: the SDK's real client, answering offline from the script."""
        tools = specs(self.style, run.tools)
        if self.style == "anthropic":
            from replaysafe_sdk_loops.testing import scripted_anthropic

            client = scripted_anthropic(run.script, boot=run.boot)
            return client.messages.create(
                model="claude-sonnet-4-5",
                max_tokens=1024,
                messages=conversation,  # type: ignore[arg-type]
                tools=tools,  # type: ignore[arg-type]
            )
        from replaysafe_sdk_loops.testing import scripted_openai

        openai_client = scripted_openai(run.script, boot=run.boot)
        if self.style == "openai-chat":
            return openai_client.chat.completions.create(
                model="gpt-5",
                messages=conversation,  # type: ignore[arg-type]
                tools=tools,  # type: ignore[arg-type]
            )
        return openai_client.responses.create(model="gpt-5", input=conversation, tools=tools)  # type: ignore[arg-type]

    def results(self, run: AgentRun, turn: int, answer: Any) -> list[Any]:
        """The answer's tool calls run: through the adapter, or plain (the control)."""
        kept = self.answers(run, turn, answer)
        if not run.protect:
            return plain_results(self.style, answer, run.tools, kept)
        helpers: Any
        if self.style == "anthropic":
            from replaysafe_sdk_loops import anthropic as helpers
        else:
            from replaysafe_sdk_loops import openai as helpers
        protected = {name: replay_safe(name=name, **run.options)(tool) for name, tool in run.tools.items()}
        for call in helpers.tool_calls(answer, thread_id=run.thread_id):
            if call.key.tool_call_id in kept:
                record(run, call.key, protected[call.name], kept[call.key.tool_call_id])
        tools = {name: answering_errors(tool) for name, tool in protected.items()}
        try:
            if self.asynchronous:
                return list(
                    asyncio.run(helpers.arun_tool_calls(answer, tools, thread_id=run.thread_id, ledger=run.ledger))
                )
            return list(helpers.run_tool_calls(answer, tools, thread_id=run.thread_id, ledger=run.ledger))
        except (ApprovalRequiredError, ReplayMismatchError, ApprovalExpiredError):
            raise _AwaitingHumanError from None  # the adapter refused the answer it has: a new decision

    def answers(self, run: AgentRun, turn: int, answer: Any) -> dict[str, dict[str, Any]]:
        """The loop's approval flow, before any of the response's calls runs: for each call (by its id) the answer
        the loop kept for its place in the conversation, else its human's, kept (with the call it was given for)
        before anything else happens. Nobody to ask (``approver`` is ``None``): the run ends waiting."""
        if not run.options.get("needs_approval"):
            return {}
        path = run.folder / "approvals.json"
        kept: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.exists() else {}
        out = {}
        for place, (call_id, _name, arguments) in enumerate(calls(self.style, answer)):
            where = f"{turn}.{place}"
            if where not in kept:
                if run.approver is None:
                    raise _AwaitingHumanError  # nobody answers in this run: it waits
                given = run.approval
                edit = None if given.args is None else dict(given.args)
                call = [run.thread_id, answer.id, call_id]  # the call it was given for, as its human saw it
                kept[where] = {
                    "call": call,
                    "arguments": arguments,
                    "approve": given.approve,
                    "args": edit,
                    "by": run.approver,
                }
                save(path, kept)
            out[call_id] = kept[where]
        return out

    def run(self, run: AgentRun) -> None:
        path = run.folder / "conversation.json"
        state: dict[str, Any] = (
            json.loads(path.read_text())
            if path.exists()
            else {"conversation": [{"role": "user", "content": PROMPT}], "pending": None, "done": False}
        )
        while not state["done"]:
            if state["pending"] is None:
                answer = self.ask(run, state["conversation"])
                state["pending"] = answer.model_dump_json()
                if self.save_response:
                    save(path, state)  # before any tool runs: a resume processes this response again
            answer = load(self.style, state["pending"])
            try:
                results = self.results(run, turn_of(state["conversation"]), answer)
            except _AwaitingHumanError:
                if not self.save_response:
                    save(path, state)  # the response its human is asked about, kept for when they answer
                return
            state["conversation"] += [*as_input(self.style, answer), *results]
            state["pending"], state["done"] = None, not calls(self.style, answer)
            save(path, state)


def record(run: AgentRun, key: CallKey, tool: Callable[..., Any], kept: Mapping[str, Any]) -> None:
    """The adapter path: the kept answer, recorded as an approval bound to the call it was given for (its key and the
    arguments its human saw), once (while the call waits for its first decision). Another call's answer is not
    recorded: that call asks for its own; a re-plan of the call with other arguments is refused when it runs."""
    if tuple(kept["call"]) != key:
        return
    found = approvals.state(key, ledger=run.ledger)
    if found is not None and not found.waiting:
        return  # recorded before a crash (decided, or run on it): never a second approval
    approvals.request(key, tool=tool, args=kept["arguments"], ledger=run.ledger)
    if not kept["approve"]:
        approvals.reject(key, by=kept["by"], reason=REJECTED_BECAUSE, ledger=run.ledger)
        return
    expires = approvals.DEFAULT_EXPIRY if run.approval_expires_in is None else run.approval_expires_in
    approvals.approve(key, by=kept["by"], args=kept["args"], ledger=run.ledger, expires_in=expires)


def save(path: Path, state: Any) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(state))
    temporary.replace(path)  # a kill mid-write leaves the previous conversation whole


#: Chat Completions, sync; the README's loop (the response saved before its tools run).
CHAT = SdkLoopDriver("openai-chat")
#: Anthropic Messages, async (``arun_tool_calls``).
ANTHROPIC = SdkLoopDriver("anthropic", asynchronous=True)
#: Responses, sync.
RESPONSES = SdkLoopDriver("openai-responses")
#: The loops that save a turn only once its tools ran: the model re-plans after a crash mid-turn.
CHAT_REPLAN = SdkLoopDriver("openai-chat", save_response=False)
ANTHROPIC_REPLAN = SdkLoopDriver("anthropic", save_response=False, asynchronous=True)
RESPONSES_REPLAN = SdkLoopDriver("openai-responses", save_response=False)
