"""A scripted conversation for offline models: what the model asks for, turn by turn, with the ids a real
provider would give it.

Each adapter's ``testing`` module turns a ``Script`` into its framework's own model (a LangChain chat
model, a Pydantic AI ``FunctionModel``, an Agents SDK model, an OpenAI or Anthropic response): the model
answers turn ``n`` (the number of its earlier answers in the conversation it is handed) with that turn's
tool calls, or with its final text. Ids are derived from the script's name, the turn and the call's place,
so a process that resumes a conversation sees the ids the crashed one saw; ``new_ids_after_restart``
makes a model that is asked again after a restart answer with new ids, as a real one does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import string
from collections.abc import Mapping
from typing import Any, Literal

#: The shapes of ids the providers give: a message (or response) id, and a tool call id.
IdStyle = Literal["openai-chat", "openai-responses", "anthropic", "gemini", "bedrock"]

_BASE62 = string.digits + string.ascii_letters


@dataclasses.dataclass(frozen=True)
class ScriptedCall:
    """One tool call the model asks for: the tool's name and its arguments (JSON values)."""

    tool: str
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)


#: One turn of the model: the tool calls it asks for (several: parallel calls), or its final answer.
Turn = tuple[ScriptedCall, ...] | str


@dataclasses.dataclass(frozen=True)
class Script:
    """What the model answers, turn by turn; after the last turn it answers ``"done"``."""

    turns: tuple[Turn, ...]
    #: Seeds the ids: two scripts with other names give other ids.
    name: str = "script"
    #: Whether a model asked again after a restart answers with new ids (``boot`` in ``ids``).
    new_ids_after_restart: bool = False
    #: What a model asked again after a restart answers instead, turn by turn (``for_boot``): a model that
    #: re-plans with other arguments. ``None``: the same turns.
    after_restart: tuple[Turn, ...] | None = None

    def for_boot(self, boot: int) -> Script:
        """The script a run answers from: this one in the first run (``boot`` 0), its ``after_restart`` turns
        (under the same ids, unless ``new_ids_after_restart``) in the runs after a restart."""
        if boot == 0 or self.after_restart is None:
            return self
        return dataclasses.replace(self, turns=self.after_restart, after_restart=None)

    def turn(self, index: int) -> Turn:
        """The model's answer at its ``index``-th turn (from 0)."""
        return self.turns[index] if index < len(self.turns) else "done"

    def ids(self, style: IdStyle, turn: int, boot: int = 0) -> tuple[str, list[str]]:
        """Turn ``turn``'s message id and its calls' ids, in ``style``'s shape. ``boot`` counts the restarts
        of the process asking (0 for the first run): it changes the ids only when ``new_ids_after_restart``."""
        answer = self.turn(turn)
        seed = f"{self.name}|{turn}|{boot if self.new_ids_after_restart else 0}"
        calls = 0 if isinstance(answer, str) else len(answer)
        return provider_id(style, "message", seed), [provider_id(style, "call", f"{seed}|{i}") for i in range(calls)]


def _digits(seed: str, alphabet: str, count: int) -> str:
    number = int.from_bytes(hashlib.sha256(seed.encode()).digest(), "big")
    out = []
    for _ in range(count):
        number, digit = divmod(number, len(alphabet))
        out.append(alphabet[digit])
    return "".join(out)


def provider_id(style: IdStyle, kind: Literal["message", "call", "item"], seed: str) -> str:
    """A stable id of the shape ``style``'s provider gives a ``kind`` (``chatcmpl-…``, ``call_…``, ``msg_01…``,
    ``toolu_01…``, ``resp_…``, ``fc_…``), derived from ``seed``."""
    hexdigits = hashlib.sha256(f"{style}|{kind}|{seed}".encode()).hexdigest()
    salted = f"{style}|{kind}|{seed}"
    if style == "openai-chat":
        return (
            f"chatcmpl-{_digits(salted, _BASE62, 29)}" if kind == "message" else f"call_{_digits(salted, _BASE62, 24)}"
        )
    if style == "openai-responses":
        if kind == "message":
            return f"resp_{hexdigits[:48]}"
        return f"fc_{hexdigits[:48]}" if kind == "item" else f"call_{_digits(salted, _BASE62, 24)}"
    if style == "anthropic":
        return (
            f"msg_01{_digits(salted, _BASE62, 22)}" if kind == "message" else f"toolu_01{_digits(salted, _BASE62, 22)}"
        )
    if style == "bedrock":
        return (
            f"msg_bdrk_01{_digits(salted, _BASE62, 22)}"
            if kind == "message"
            else f"tooluse_{_digits(salted, _BASE62, 22)}"
        )
    # Gemini gives no call ids of its own: frameworks mint ``adk-<uuid>``-like ones; a UUID shape here.
    return f"{hexdigits[:8]}-{hexdigits[8:12]}-4{hexdigits[13:16]}-a{hexdigits[17:20]}-{hexdigits[20:32]}"
