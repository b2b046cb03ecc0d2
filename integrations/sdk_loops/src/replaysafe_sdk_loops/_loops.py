"""What ``replaysafe_sdk_loops.openai`` and ``replaysafe_sdk_loops.anthropic`` share; imports neither SDK."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from replaysafe import CallKey, Ledger, is_replay_safe, replay_safe, tool_call


@dataclasses.dataclass(frozen=True)
class Call:
    """One tool call the model asked for, keyed by ``(thread_id, message_id, tool_call_id)``."""

    key: CallKey
    name: str
    arguments: Mapping[str, Any]

    def describe(self) -> str:
        return f"tool call {self.name!r} ({self.key})"


@dataclasses.dataclass(frozen=True)
class Runner:
    """How the calls of one model response are run: the tools, ledger and ``@replay_safe`` options."""

    tools: Mapping[str, Callable[..., Any]]
    ledger: Ledger | None
    pauses: tuple[type[BaseException], ...]
    options: Mapping[str, Any]

    def protected(self, call: Call) -> Callable[..., Any]:
        """The call's tool: as it is if decorated with ``@replay_safe``, else protected here."""
        function = self.tools.get(call.name)
        if function is None:
            known = ", ".join(sorted(self.tools)) or "none"
            raise LookupError(
                f"{call.describe()}: no tool named {call.name!r} (tools: {known}). Add it to tools= and process "
                "the same response again; calls that already ran are not run twice."
            )
        if is_replay_safe(function):
            return function
        return replay_safe(name=call.name, **self.options)(function)

    def run(self, call: Call) -> Any:
        function = self.protected(call)
        if inspect.iscoroutinefunction(function):
            raise TypeError(f"{call.describe()}: the tool is async; run the calls with arun_tool_calls")
        with tool_call(*call.key, ledger=self.ledger, pauses=self.pauses):
            return function(**call.arguments)

    async def arun(self, call: Call) -> Any:
        function = self.protected(call)
        async with tool_call(*call.key, ledger=self.ledger, pauses=self.pauses):
            if inspect.iscoroutinefunction(function):
                return await function(**call.arguments)
            # A worker thread gets a copy of this context, so the tool sees its call's ids.
            return await asyncio.to_thread(function, **call.arguments)


def runner(
    tools: Mapping[str, Callable[..., Any]],
    ledger: Ledger | None,
    pauses: Sequence[type[BaseException]],
    options: Mapping[str, Any],
) -> Runner:
    return Runner(tools, ledger, tuple(pauses), dict(options))


def parse_arguments(text: str | None, *, describe: str) -> dict[str, Any]:
    """A call's JSON arguments as keyword arguments."""
    try:
        arguments = json.loads(text or "{}")
    except ValueError as exc:
        raise ValueError(f"{describe}: its arguments are not valid JSON ({exc}); nothing ran") from exc
    if not isinstance(arguments, dict):
        raise ValueError(f"{describe}: its arguments are a JSON {type(arguments).__name__}, not an object; nothing ran")
    return arguments


def as_text(result: Any) -> str:
    """A tool's result as the text the model reads: a string as is, anything else as JSON."""
    if isinstance(result, str):
        return result
    return json.dumps(result, default=_jsonable, ensure_ascii=False)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):  # a pydantic model
        return model_dump(mode="json")
    return str(value)
