"""The identity of the tool call about to run, carried in a context variable."""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._records import CallKey

if TYPE_CHECKING:
    from .ledgers import Ledger


@dataclasses.dataclass(frozen=True, slots=True)
class CallScope:
    """What ``tool_call(...)`` sets: the key of the next protected call and its options."""

    key: CallKey
    ledger: Ledger | None = None
    #: Exceptions that pause the call (human in the loop): the claim is released, never recorded.
    pauses: tuple[type[BaseException], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class CallInfo:
    """A protected call as its tool (``current_call()``) and a reconciler see it."""

    thread_id: str
    message_id: str
    tool_call_id: str
    tool_name: str
    #: 1 for the first execution; +1 each time an in-doubt call is run again.
    attempt: int
    #: The same on every attempt and replay of this call: hand it to your provider.
    idempotency_key: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> CallKey:
        return CallKey(self.thread_id, self.message_id, self.tool_call_id)


_scope: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar("replaysafe_scope", default=None)
_current: contextvars.ContextVar[CallInfo | None] = contextvars.ContextVar("replaysafe_current", default=None)


def _check_id(name: str, value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"tool_call(): {name} must be a str, got {type(value).__name__} {value!r}")
    return value


class tool_call:  # noqa: N801 - used like a function: `with tool_call(...):`
    """Set the identity of the tool call about to run (``with`` and ``async with``).

    A hand-written agent loop wraps each tool call in it; adapters set it for their
    framework. The value lives in a context variable, so parallel calls in threads or
    asyncio tasks each carry their own. One block identifies one tool call.

    ``pauses`` names exceptions a host framework raises to pause a call for a human
    (LangGraph's ``GraphInterrupt``): its claim is released, and the call is neither recorded nor in doubt.
    """

    __slots__ = ("_tokens", "scope")

    def __init__(
        self,
        thread_id: str | None,
        message_id: str | None,
        tool_call_id: str | None,
        *,
        ledger: Ledger | None = None,
        pauses: tuple[type[BaseException], ...] = (),
    ) -> None:
        key = CallKey(
            _check_id("thread_id", thread_id),
            _check_id("message_id", message_id),
            _check_id("tool_call_id", tool_call_id),
        )
        self.scope = CallScope(key=key, ledger=ledger, pauses=tuple(pauses))
        self._tokens: list[contextvars.Token[CallScope | None]] = []

    def __enter__(self) -> CallKey:
        self._tokens.append(_scope.set(self.scope))
        return self.scope.key

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _scope.reset(self._tokens.pop())

    async def __aenter__(self) -> CallKey:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def current_scope() -> CallScope | None:
    return _scope.get()


def current_call() -> CallInfo | None:
    """Inside a running protected tool, the identity of its call; ``None`` elsewhere."""
    return _current.get()
