"""What the running code says about the call: ``tool_call``, ``node``, ``current_call``."""

from __future__ import annotations

import contextvars
import itertools
import operator
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from . import _config
from ._constants import NODE_TIMEOUT, UNSET, timeout_setting
from ._keys import RESERVED_PREFIX, reserved_id
from ._records import CallKey, Status, new_tuple

if TYPE_CHECKING:
    from .ledgers import Ledger


#: What to do with an in-doubt call: run it again, raise, or ask a reconciler.
InDoubt = Literal["rerun", "raise"] | Callable[["CallInfo"], Any]


def check_in_doubt(value: InDoubt | None, where: str) -> InDoubt | None:
    if value is None or value in ("rerun", "raise") or callable(value):
        return value
    raise ValueError(f"{where}: in_doubt must be 'rerun', 'raise' or a reconciler function, got {value!r}")


class CallScope(NamedTuple):
    """What ``tool_call(...)`` sets: the key of the next protected call and its options."""

    key: CallKey
    ledger: Ledger | None = None
    #: Exceptions that pause the call (human in the loop): it is kept paused, and the next call resumes it.
    pauses: tuple[type[BaseException], ...] = ()
    tool_timeout: float | None = UNSET
    in_doubt: InDoubt | None = None
    #: The protected call this one is a step of, ``None`` for a call of its own.
    parent: CallInfo | None = None
    #: What the missing-ids warning tells the user to do, when an adapter knows its own fix.
    missing_ids_fix: str | None = None


class NodeScope(NamedTuple):
    """What ``node(...)`` sets: a deadline shared by every protected call inside it."""

    #: ``time.monotonic()`` value at which the node's time runs out, or ``None``.
    deadline: float | None
    tool_timeout: float | None = UNSET
    #: Whether the user gave the node's timeout (a hard deadline), not the built-in one.
    deadline_given: bool = False


class CallInfo(NamedTuple):
    """A protected call as its tool (``current_call()``) and a reconciler see it."""

    thread_id: str
    message_id: str
    tool_call_id: str
    tool_name: str
    #: 1 for the first execution; +1 each time an in-doubt call is taken over.
    attempt: int
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = MappingProxyType({})
    #: The call this one is a step of (a protected call made inside it); ``None`` otherwise.
    parent: CallInfo | None = None

    @property
    def key(self) -> CallKey:
        return CallKey(self.thread_id, self.message_id, self.tool_call_id)

    @property
    def idempotency_key(self) -> str:
        """The same on every attempt and replay of this call: hand it to your provider."""
        from ._identity import call_idempotency_key  # computed only when asked for: it costs a digest

        return call_idempotency_key(self.thread_id, self.message_id, self.tool_call_id, self.tool_name)


class RecordedSteps(NamedTuple):
    """What the record of a call's last execution says of its steps, read when the call runs again:
    how that execution ended (``paused``, or ``in_doubt``) and the tool name of each step it made, in
    the order they were made (its place among all the call's steps, from 1)."""

    status: Status
    names: tuple[str, ...]


#: Guards the place of each step of a call run again (``RunningCall.next_ordinal``), whose steps may be made in threads.
_places_lock = threading.Lock()


class RunningCall(CallInfo):
    """The ``CallInfo`` of one execution of a protected call: it numbers the steps made inside it.

    A tuple subclass without ``__slots__`` has a ``__dict__``: the execution's state lives
    there, out of the public fields, and follows the object wherever ``current_call()`` is
    set (each chunk of a stream, a worker thread's copied context).
    """

    scope: CallScope
    _ordinals: dict[str | None, Any]
    #: The tool name of each step made in this execution, in the order they were made.
    _made: list[str]
    #: What the record of the call's last execution said of its steps, when it runs again (``run_again``);
    #: ``None`` otherwise. A class default: read on every step, as a plain attribute.
    recorded_steps: RecordedSteps | None = None
    #: Where each step of this execution stands among all its steps (``(tool name, ordinal)``: place from 1), kept
    #: only when the call runs again with its steps recorded (``recorded_steps``).
    _places: dict[tuple[str, int], int]

    @classmethod
    def of(
        cls, scope: CallScope, tool_name: str, attempt: int, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> RunningCall:
        key = scope.key
        call: RunningCall = new_tuple(
            cls, (key.thread_id, key.message_id, key.tool_call_id, tool_name, attempt, args, kwargs, scope.parent)
        )
        call.scope = scope
        return call

    #: The scope's key, whose ids these are: read by a C getter, without a Python call (the hot
    #: path reads it several times), and read-only, as on ``CallInfo``.
    key = property(operator.attrgetter("scope.key"))

    def _replace(self, **changes: Any) -> CallInfo:  # type: ignore[override]
        """A plain ``CallInfo`` with ``changes`` (its key built from its ids): the execution's state,
        its scope and step counters, stays with this one."""
        return CallInfo(*self)._replace(**changes)

    def next_ordinal(self, tool_name: str) -> int:
        """1 for this execution's first step named ``tool_name``, then 2, 3...; thread-safe.

        The step's name is kept in the order the steps are made (its place among all of them), for
        the record of this execution if it pauses or stops in doubt (``steps_made``).
        """
        ordinal = self._next(tool_name)
        made = self.__dict__.get("_made")
        if made is None:
            made = self.__dict__.setdefault("_made", [])
        if self.recorded_steps is None:
            made.append(tool_name)  # a first execution: only the order is kept (an append is atomic)
        else:
            with _places_lock:  # run again: where the step stands is looked up by its protocol
                made.append(tool_name)
                self.__dict__.setdefault("_places", {})[tool_name, ordinal] = len(made)
        return ordinal

    def steps_made(self) -> tuple[str, ...]:
        """The tool name of each step made so far in this execution, in the order they were made."""
        return tuple(self.__dict__.get("_made", ()))

    def run_again(self, recorded: RecordedSteps) -> None:
        """This execution runs the call again, whose last execution recorded ``recorded``: set before it starts."""
        self.recorded_steps = recorded

    def place_of(self, tool_name: str, ordinal: int) -> int | None:
        """Where the ``ordinal``-th step named ``tool_name`` of this execution stands among all its steps
        (from 1); ``None`` when it is not known (the call is not run again with its steps recorded)."""
        places = self.__dict__.get("_places")
        return None if places is None else places.get((tool_name, ordinal))

    def keep_recorded(self, place: int) -> None:
        """The step made at ``place`` was refused (another step is recorded there): this execution's record
        keeps the recorded step's name at that place, so that the next execution is checked against it too."""
        recorded, made = self.recorded_steps, self.__dict__.get("_made")
        if recorded is not None and made is not None and 0 < place <= min(len(made), len(recorded.names)):
            with _places_lock:
                made[place - 1] = recorded.names[place - 1]

    def next_request_ordinal(self) -> int:
        """1 for this execution's first keyed HTTP request, then 2, 3...; thread-safe (``replaysafe.http``)."""
        return self._next(None)  # no tool's name: requests are numbered apart from every step

    def _next(self, counted: str | None) -> int:
        ordinals = self.__dict__.get("_ordinals")
        if ordinals is None:
            ordinals = self.__dict__.setdefault("_ordinals", {})
        counter = ordinals.get(counted)
        if counter is None:
            counter = ordinals.setdefault(counted, itertools.count(1))  # one winner among threads
        return next(counter)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return "CallInfo" + super().__repr__().removeprefix(type(self).__name__)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled or copied, it is the plain CallInfo it shows: its execution's state (a ledger,
        # counters) stays in this process.
        return (CallInfo, tuple(self))


_scope: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar("replaysafe_scope", default=None)
_node: contextvars.ContextVar[NodeScope | None] = contextvars.ContextVar("replaysafe_node", default=None)
_current: contextvars.ContextVar[CallInfo | None] = contextvars.ContextVar("replaysafe_current", default=None)


#: The longest id every ledger stores, in UTF-8 bytes.
MAX_ID_BYTES = 65536


def _check_id(name: str, value: object) -> str:
    """Ids are text every store keeps as is; anything else is refused before any I/O."""
    # The common id, checked fast: short ASCII text without NUL.
    if type(value) is str and len(value) <= MAX_ID_BYTES and value.isascii() and "\x00" not in value:
        return value
    if value is None:
        return ""
    if not isinstance(value, str):
        # The type only: a message object passed by mistake would quote the model's text or arguments.
        raise TypeError(f"tool_call(): {name} must be a str, got {type(value).__name__}")
    problem = None
    if "\x00" in value:
        problem = "contains a NUL character, which PostgreSQL text cannot hold"
    elif not value.isascii():
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            problem = "contains a lone surrogate, which is not valid UTF-8"
        else:
            if size > MAX_ID_BYTES:
                problem = f"is {size} bytes long; the limit is {MAX_ID_BYTES}"
    elif len(value) > MAX_ID_BYTES:
        problem = f"is {len(value)} bytes long; the limit is {MAX_ID_BYTES}"
    if problem is not None:
        from ._errors import InvalidCallIdError

        raise InvalidCallIdError(
            f"tool_call(): {name} {value[:40]!r}... {problem}. Use the id your framework gives, or a digest of it "
            "(replaysafe.idempotency_key(raw_id))."
        )
    return value


def _call_key(thread_id: object, message_id: object, tool_call_id: object) -> CallKey:
    """The key of ``tool_call``'s three ids, each checked by ``_check_id`` and none reserved (``reserved_id``)."""
    if type(thread_id) is str and type(message_id) is str and type(tool_call_id) is str:
        # The common ids, checked at once: short ASCII text without NUL (so each passes _check_id),
        # and without a '>' or the reserved prefix, one of which every reserved id holds (so none is reserved).
        joined = thread_id + message_id + tool_call_id
        if (
            len(joined) <= MAX_ID_BYTES
            and joined.isascii()
            and "\x00" not in joined
            and ">" not in joined
            and RESERVED_PREFIX not in joined
        ):
            return new_tuple(CallKey, (thread_id, message_id, tool_call_id))  # type: ignore[no-any-return]
    key: CallKey = new_tuple(
        CallKey,
        (
            _check_id("thread_id", thread_id),
            _check_id("message_id", message_id),
            _check_id("tool_call_id", tool_call_id),
        ),
    )
    reserved = reserved_id(key)
    if reserved is not None:
        from ._errors import InvalidCallIdError

        field, why = reserved
        raise InvalidCallIdError(f"tool_call(): {field} {getattr(key, field)[:80]!r} {why}")
    return key


def _config_value(config: Mapping[str, Any], name: str) -> Any:
    """A setting from a run config, at the top or under LangGraph's ``configurable``."""
    if name in config:
        return config[name]
    nested = config.get("configurable")
    return nested.get(name, UNSET) if isinstance(nested, Mapping) else UNSET


class _Scoped:
    """Sets a context variable for the duration of a ``with`` or ``async with`` block."""

    __slots__ = ("_tokens",)
    _var: contextvars.ContextVar[Any]

    def __init__(self) -> None:
        self._tokens: list[contextvars.Token[Any]] = []

    def _value(self) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Any:
        value = self._value()
        self._tokens.append(self._var.set(value))
        return value

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._var.reset(self._tokens.pop())

    async def __aenter__(self) -> Any:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)


class tool_call(_Scoped):  # noqa: N801 - used like a function: `with tool_call(...):`
    """Set the identity of the tool call about to run (``with`` and ``async with``).

    A hand-written agent loop wraps each tool call in it; adapters set it for their
    framework. The value lives in a context variable, so parallel calls in threads or
    asyncio tasks each carry their own. One block identifies one tool call.

    ``tool_timeout`` and ``in_doubt`` override the decorator's settings for this call.
    ``pauses`` names exceptions a host framework raises to pause a call for a human
    (LangGraph's ``GraphInterrupt``), besides those of ``register_pause`` and
    ``@replay_safe(pause_on=...)``: the call is kept paused, neither failed nor in doubt,
    and the next call of the same key runs it again, its completed steps replaying.
    ``missing_ids_fix`` is what the warning about a missing id tells the user to do (an
    adapter names its own option), instead of the generic advice.

    Ids in replaysafe's own key spaces raise ``InvalidCallIdError``: the thread id
    ``replaysafe:key``, the message id ``replaysafe:args`` and a tool call id of a step's
    form (``call_1>charge#1``: a ``>``, then at its end ``#`` and a number).
    """

    __slots__ = ("scope",)
    _var = _scope
    scope: CallScope

    def __init__(
        self,
        thread_id: str | None,
        message_id: str | None,
        tool_call_id: str | None,
        *,
        ledger: Ledger | None = None,
        tool_timeout: float | None = UNSET,
        in_doubt: InDoubt | None = None,
        pauses: tuple[type[BaseException], ...] = (),
        missing_ids_fix: str | None = None,
    ) -> None:
        self._tokens = []
        key = _call_key(thread_id, message_id, tool_call_id)
        self.scope = new_tuple(
            CallScope,
            (
                key,
                ledger,
                tuple(pauses) if pauses else (),
                tool_timeout if tool_timeout is UNSET else timeout_setting(tool_timeout, "tool_timeout"),
                None if in_doubt is None else check_in_doubt(in_doubt, "tool_call()"),
                None,  # parent
                missing_ids_fix,
            ),
        )

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        *,
        message_id: str | None,
        tool_call_id: str | None,
        ledger: Ledger | None = None,
        pauses: tuple[type[BaseException], ...] = (),
    ) -> tool_call:
        """From a run config such as ``{"thread_id": "t1", "tool_timeout": 60, "in_doubt": "raise"}``.

        Keys are read at the top level or under ``"configurable"`` (LangGraph's form).
        """
        thread_id = _config_value(config, "thread_id")
        in_doubt = _config_value(config, "in_doubt")
        return cls(
            # Frameworks allow ints and UUIDs as thread ids: the ledger keys on their text.
            None if thread_id in (UNSET, None) else str(thread_id),
            message_id,
            tool_call_id,
            ledger=ledger,
            tool_timeout=_config_value(config, "tool_timeout"),
            in_doubt=None if in_doubt is UNSET else in_doubt,
            pauses=pauses,
        )

    def _value(self) -> CallScope:
        return self.scope

    def __enter__(self) -> CallKey:
        scope = self.scope  # _Scoped.__enter__, without its two calls: the hot path enters one per call
        self._tokens.append(_scope.set(scope))
        return scope.key

    async def __aenter__(self) -> CallKey:
        return self.__enter__()


class node(_Scoped):  # noqa: N801 - used like a function: `with node(...):`
    """A deadline shared by every protected call inside the block (``with`` / ``async with``).

    Each call gets ``min(tool_timeout, time left in the node)``; a call that starts
    after the node's time ran out raises ``ToolTimeoutError`` without running.
    ``node_timeout`` defaults to the global one (900 s); ``None`` or ``0`` disables it.
    A config mapping (``{"node_timeout": 600, "tool_timeout": 60}``, also under
    ``"configurable"``) may carry both.
    """

    __slots__ = ("node_timeout", "tool_timeout")
    _var = _node
    node_timeout: float | None
    tool_timeout: float | None

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        node_timeout: float | None = UNSET,
        tool_timeout: float | None = UNSET,
    ) -> None:
        super().__init__()
        if config is not None:
            if node_timeout is UNSET:
                node_timeout = _config_value(config, "node_timeout")
            if tool_timeout is UNSET:
                tool_timeout = _config_value(config, "tool_timeout")
        self.node_timeout = timeout_setting(node_timeout, "node_timeout")
        self.tool_timeout = timeout_setting(tool_timeout, "tool_timeout")

    def _value(self) -> NodeScope:
        node_timeout = _config.default_node_timeout if self.node_timeout is UNSET else self.node_timeout
        given = node_timeout is not UNSET
        if not given:
            node_timeout = NODE_TIMEOUT
        deadline = None if node_timeout is None else time.monotonic() + node_timeout
        return NodeScope(deadline=deadline, tool_timeout=self.tool_timeout, deadline_given=given)


def current_scope() -> CallScope | None:
    return _scope.get()


def current_call() -> CallInfo:
    """The identity of the protected call running now; hand ``.idempotency_key`` to your provider.

    Raises ``NoCurrentCallError`` outside one: a tool that ran plainly (no ledger, no ids, or
    ``REPLAYSAFE_DISABLED=1``) has no stable identity to give. Code that also runs outside a
    protected call uses ``current_call_or_none()``.
    """
    call = _current.get()
    if call is None:
        from ._errors import NoCurrentCallError

        raise NoCurrentCallError(
            "current_call() was called outside a protected call, so there is no stable call identity. Call the "
            "tool under tool_call(thread_id=..., message_id=..., tool_call_id=...) or an adapter with a ledger "
            "configured; in code that also runs unprotected, use replaysafe.current_call_or_none()."
        )
    return call


def current_call_or_none() -> CallInfo | None:
    """Like ``current_call()``, but ``None`` outside a protected call."""
    return _current.get()
