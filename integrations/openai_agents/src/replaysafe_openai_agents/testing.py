"""An offline Agents SDK model that plays a ``replaysafe.testing.Script``: for crash tests and the conformance kit.

``scripted_model(script)`` is the SDK's own test model (``agents.testing.ScriptedModel``) whose every step is
a responder (``ModelStep.respond``): it answers turn ``n`` (the number of the model's earlier answers in the
input it is handed) with that turn's function calls, or with the final text, carrying the ids the Responses
API gives: the response id (``resp_…``), each output item's id (``fc_…``, the message id the adapter keys a
call by) and each call id (``call_…``). It keeps no state of its own, so a process that resumes a run (a
``RunState``, a session) gets the answers, and the ids, the crashed process got.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents.items import TResponseOutputItem
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from replaysafe.testing import Script, provider_id

__all__ = ["model_turn", "scripted_model", "scripted_step"]

#: The input items a model's answer is made of (a run of them, with nothing of the user's or of a tool's
#: between, is one earlier answer).
_OUTPUT_TYPES = frozenset({"function_call", "reasoning", "web_search_call", "file_search_call", "computer_call"})


def _item(item: Any) -> Mapping[str, Any]:
    if isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)
    return dump(exclude_none=True) if callable(dump) else {}


def _is_output(item: Mapping[str, Any]) -> bool:
    kind = item.get("type")
    return kind in _OUTPUT_TYPES or (kind in ("message", None) and item.get("role") == "assistant")


def model_turn(items: str | Sequence[Any]) -> int:
    """How many times the model has answered in ``items`` (a model call's input): its runs of output items."""
    if isinstance(items, str):
        return 0
    turns, inside = 0, False
    for item in items:
        output = _is_output(_item(item))
        turns += output and not inside
        inside = output
    return turns


def scripted_step(script: Script, turn: int, *, boot: int = 0) -> ModelStep:
    """The model's answer at turn ``turn`` (from 0): its function calls, or its final text, with Responses ids.

    ``boot`` counts the restarts of the process asking (0 for its first run); it changes the ids only for a
    script made with ``new_ids_after_restart``.
    """
    answer = script.turn(turn)
    response_id, call_ids = script.ids("openai-responses", turn, boot)
    output: list[TResponseOutputItem]
    if isinstance(answer, str):
        message_id = "msg_" + provider_id("openai-responses", "item", response_id).removeprefix("fc_")
        output = [assistant_message(answer, item_id=message_id)]
    else:
        output = [
            function_call(
                call.tool, dict(call.args), call_id=call_id, item_id=provider_id("openai-responses", "item", call_id)
            )
            for call, call_id in zip(answer, call_ids, strict=True)
        ]
    return ModelStep(output=output, response_id=response_id)


def scripted_model(script: Script, *, boot: int = 0) -> ScriptedModel:
    """An ``agents.testing.ScriptedModel`` that plays ``script``, turn by turn, for as many calls as it gets.

    Use it as an agent's model (``Agent(name=..., model=scripted_model(script), tools=[...])``); a resumed
    run (``RunState``, a session) asks it again and it answers as it did.
    """
    model: ScriptedModel

    def respond(call: ModelCall) -> ModelStep:
        model.enqueue(ModelStep.respond(respond))  # never runs out: the script says when the answer is final
        return scripted_step(script, model_turn(call.input), boot=boot)

    model = ScriptedModel([ModelStep.respond(respond)])
    return model
