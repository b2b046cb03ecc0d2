"""``@replay_safe``: decide, once per call, whether and how a call is protected."""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import time
import types
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, overload

import wrapt

from . import _config, _constants, _drivers
from ._codec import JsonSerializer, Serializer
from ._config import default_ledger
from ._constants import UNSET, timeout_setting
from ._context import (
    CallScope,
    InDoubt,
    NodeScope,
    RunningCall,
    _current,
    _node,
    _scope,
    check_in_doubt,
)
from ._core import Earlier, LateResult, OnLedgerError, Phase, ToolSpec, begin, effective_timeout, replay
from ._drivers import Driving, Planned, adrive, drive
from ._errors import ArgumentDigestError, MissingCallIdError, ToolTimeoutError, UnprotectedCallWarning, describe
from ._events import EventKind, emit, wanted
from ._identity import SignatureDigest, args_digest
from ._keys import args_key, business_key, step_key
from ._owners import owner_token
from ._records import CallKey, new_tuple
from ._streaming import astream, begun_when_read, stream
from ._undo import register as register_undo
from .ledgers import Ledger

F = TypeVar("F", bound=Callable[..., Any])
OnMissingIds = Literal["warn", "raise"]

_DEFAULT_SERIALIZER = JsonSerializer()
_warned_disabled = False


@_config.on_reset
def _reset_warnings() -> None:
    global _warned_disabled
    _warned_disabled = False


#: What identifies a tool's calls: the framework's ids (``"call"``, the default), the thread
#: and arguments (``"args"``), or a business key computed from the arguments (a callable).
KeyChoice = Literal["call", "args"] | Callable[..., Any]


class _Tool:
    """One decorated tool: its protocol settings and how its arguments bind."""

    __slots__ = (
        "_arity",
        "_binders",
        "_class_first",
        "_digests",
        "_signatures",
        "exclude_args",
        "key",
        "ledger",
        "on_missing_ids",
        "pause_on",
        "spec",
        "timeout",
        "warned_missing",
        "warned_no_ledger",
    )

    def __init__(
        self,
        spec: ToolSpec,
        ledger: Ledger | None,
        timeout: float | None,
        on_missing_ids: OnMissingIds,
        exclude_args: tuple[str, ...],
        key: KeyChoice = "call",
        pause_on: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.spec = spec
        self.ledger = ledger
        self.timeout = timeout
        self.on_missing_ids = on_missing_ids
        self.exclude_args = exclude_args
        self.key = key
        self.pause_on = pause_on
        # The reset generation in which each warning was said (-1: never): once per tool, again after a reset.
        self.warned_missing = -1
        self.warned_no_ledger = -1
        signature = inspect.signature(spec.function)
        unknown = [name for name in exclude_args if name not in signature.parameters]
        if unknown:
            raise TypeError(f"@replay_safe(exclude_args=...) on {spec.name}: no parameter named {', '.join(unknown)}")
        parameters = list(signature.parameters.values())
        # Called through an instance or class, wrapt hands us args without self/cls: the parameters
        # after the first, unless the first is *args (``def go(*args)``), which took the receiver in.
        receiver = int(bool(parameters) and parameters[0].kind is not inspect.Parameter.VAR_POSITIONAL)
        self._signatures = (signature, signature.replace(parameters=parameters[receiver:]))
        self._binders = (_Binder.of(parameters), _Binder.of(parameters[receiver:]))
        names = [parameter.name for parameter in parameters]
        defaults = _defaults(parameters)
        self._digests = (
            SignatureDigest(names, exclude_args, defaults),
            SignatureDigest(names[receiver:], exclude_args, defaults),
        )
        # How many arguments, given by position, are every parameter in order (-1: no such call).
        self._arity = tuple(-1 if binder is None else binder.all_by_position for binder in self._binders)
        # Under @classmethod, Python 3.13 calls the wrapper with the class as a plain first argument
        # (it no longer binds through the wrapper's __get__): a first parameter named cls, of a
        # function defined in a class, given a class, is the receiver, never data.
        owner = getattr(spec.function, "__qualname__", "").rpartition(".")[0]
        self._class_first = bool(names) and names[0] == "cls" and bool(owner) and not owner.endswith("<locals>")

    def _receiver(self, instance: object, args: tuple[Any, ...]) -> tuple[bool, tuple[Any, ...]]:
        """Whether the call came through an instance or class, and its arguments without the receiver."""
        if instance is None and self._class_first and args and isinstance(args[0], type):
            return True, args[1:]
        return instance is not None, args

    def digest(self, instance: object, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """Bind the call's arguments by name (defaults applied) and digest them."""
        method = False
        if instance is not None or self._class_first:
            method, args = self._receiver(instance, args)
        if not kwargs and len(args) == self._arity[method]:  # every parameter given by position
            digest = self._digests[method].of_positional(args)
            if digest is not None:
                return digest
        binder = self._binders[method]
        arguments = binder.bind(args, kwargs) if binder is not None else None
        if arguments is not None:
            return self._digests[method](arguments, self.spec.name)
        return self._digests[method](self._bind(method, args, kwargs), self.spec.name)

    def earlier(self, key: CallKey, args: tuple[Any, ...], kwargs: Mapping[str, Any], digest: str) -> Earlier:
        """The call as the earlier key rules (rs0) identified it: its argument digests (defaults
        included, numbers by type) and, for a derived key, its keys (the tool's name in place of its
        identity). The protocol's ``args`` do not say whether a receiver was left out, so both
        bindings are tried, and only one whose rs1 digest is the call's own (``digest``) is kept: a
        wrong binding can digest like another call once defaults and excluded arguments are left out
        (``pay(5)`` bound as ``tip=5`` is ``pay(0, 5)``)."""
        tried = [(0, args), (1, args)]
        if self._class_first and args and isinstance(args[0], type):
            tried.append((1, args[1:]))
        digests: dict[str, dict[str, Any]] = {}
        for method, given in tried:
            try:
                bound = self._signatures[method].bind(*given, **kwargs)
            except TypeError:
                continue
            bound.apply_defaults()
            arguments = {name: value for name, value in bound.arguments.items() if name not in self.exclude_args}
            try:
                if self._digests[method](dict(bound.arguments), self.spec.name) != digest:
                    continue  # not how this call was bound
                digests[args_digest(arguments, tool_name=self.spec.name, rs0=True)] = dict(bound.arguments)
            except ArgumentDigestError:
                continue
        keys: list[CallKey] = []
        for digest, arguments in digests.items():
            if self.key == "args":
                keys.append(args_key(key.thread_id, self.spec.name, digest))
            elif callable(self.key):
                try:
                    keys.append(business_key(self.spec.name, self.key(**arguments), rs0=True))
                except Exception:  # a binding the key function does not take: not this call's
                    continue
        return Earlier(frozenset(digests), tuple(keys))

    def digest_of(self, arguments: Mapping[str, Any]) -> str:
        """The digest of a call given ``arguments`` by name (an approver's edit, a framework's held-back call):
        bound as a function's, or, when that leaves out a receiver, as a method's. Arguments the digest
        leaves out (``exclude_args``: a framework's context, a client) need not be given."""
        missing = {name: None for name in self.exclude_args if name not in arguments}
        if missing:
            arguments = {**arguments, **missing}
        try:
            return self._digests[0](self._bind(False, (), arguments), self.spec.name)
        except TypeError:
            return self._digests[1](self._bind(True, (), arguments), self.spec.name)

    def arguments(self, instance: object, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, defaults applied (what a key function is given)."""
        method, args = self._receiver(instance, args)
        binder = self._binders[method]
        arguments = binder.bind(args, kwargs) if binder is not None else None
        return arguments if arguments is not None else self._bind(method, args, kwargs)

    def _bind(self, method: bool, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The general case, and every call the function would reject."""
        try:
            bound = self._signatures[method].bind(*args, **kwargs)
        except TypeError as exc:
            # inspect's text names the parameter, never a value; the tool's name says whose.
            raise TypeError(f"{self.spec.name}() {exc}") from None
        bound.apply_defaults()
        return bound.arguments

    def plan(
        self,
        instance: object,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        wrapped: Callable[..., Any],
        phase: Phase = replay,
    ) -> Planned | None:
        """A protected call's protocol (``phase``: ``replay``; for a stream ``begin``, or ``begun_when_read``
        for a sync one), ready to drive: its ledger, scope, argument digest and timeout decided.
        ``None`` to run the call plainly."""
        if _config.disabled:
            _warn_disabled(self.spec.name)
            return None
        parent = _current.get()
        if parent is None:
            scope = _scope.get()
        elif isinstance(parent, RunningCall):
            scope = parent.scope  # inside another protected call, its ledger, pauses and in-doubt policy carry over
        else:
            return None  # a CallInfo set by hand, not by a protected call: nothing to be a step of
        ledger = self.ledger or (scope.ledger if scope is not None else None) or default_ledger()
        if ledger is None:
            self._no_ledger()
            return None
        name = self.spec.name
        if self.key == "call":
            if parent is not None:  # a step: its parent's key, its tool name and its ordinal
                key = step_key(parent.key, name, parent.next_ordinal(name))
            elif scope is None or not all(scope.key):
                self._missing_ids(scope)
                return None
            else:
                key = scope.key
            digest = self.digest(instance, args, kwargs)
        elif self.key == "args":
            if scope is None or not scope.key.thread_id:
                self._missing_ids(scope, 'key="args" needs a thread id, and ')
                return None
            digest = self.digest(instance, args, kwargs)
            key = args_key(scope.key.thread_id, self.spec.identity, digest)
        else:
            key = business_key(self.spec.identity, self.key(**self.arguments(instance, args, kwargs)), tool_name=name)
            digest = self.digest(instance, args, kwargs)
        # The rest is written out here, not in helpers: it runs on every protected call.
        pauses = self.pause_on + _config.pauses
        if scope is None:
            scope = CallScope(key, ledger, pauses)
        elif key is not scope.key or ledger is not scope.ledger or pauses or parent is not None:
            # The scope the protocol and this call's steps see: its own key, ledger and pauses.
            fields = (key, ledger, scope.pauses + pauses, scope.tool_timeout, scope.in_doubt, parent, None)
            scope = new_tuple(CallScope, fields)
        # The timeout: min(tool_timeout, time left in the node), the most specific setting winning;
        # and whether it is a hard deadline, one the user gave rather than the built-in default. A
        # call inside another runs under its parent's deadline: a timer of its own would replace the
        # parent's (one SIGALRM per process) or move it to another thread.
        if parent is not None:
            timeout, hard = None, False
        else:
            node = _node.get()
            timeout = scope.tool_timeout
            if timeout is UNSET and node is not None:
                timeout = node.tool_timeout
            if timeout is UNSET:
                timeout = self.timeout
            if timeout is UNSET:
                timeout = _config.default_tool_timeout
            hard = timeout is not None and timeout is not UNSET
            if timeout is UNSET:
                timeout = _constants.TOOL_TIMEOUT
            if node is not None:
                timeout, hard = self._within_node(scope, node, timeout, hard)
        spec = self.spec
        host = _drivers.hosts.get(type(ledger)) or _drivers.host_for(ledger)  # (read here: tests replace them)
        sealer = getattr(ledger, "sealer", None)
        protocol = phase(spec, scope, digest, args, kwargs, timeout, sealer, owner_token(), host)
        return protocol, new_tuple(Driving, (ledger, name, spec, scope, wrapped, hard))

    def _within_node(
        self, scope: CallScope, node: NodeScope, timeout: float | None, hard: bool
    ) -> tuple[float | None, bool]:
        """The timeout shortened to the time left in ``node``; hard when the node's deadline was given."""
        deadline = node.deadline
        hard = hard or (deadline is not None and node.deadline_given)
        timeout = effective_timeout(timeout, deadline, time.monotonic)
        if timeout is not None and timeout <= 0:
            message = (
                f"{describe(self.spec.name, scope.key)} did not run: its node's time ran out before the call "
                "started. Raise the node_timeout, or split the node."
            )
            emit(EventKind.TIMEOUT, message, tool_name=self.spec.name, key=scope.key)
            raise ToolTimeoutError(message, timeout=0.0, tool_name=self.spec.name, key=scope.key)
        return timeout, hard

    def _no_ledger(self) -> None:
        """Warn once per tool (an app may hand one adapter a ledger and forget another's)."""
        name = self.spec.name
        if self.warned_no_ledger == _config.generation:
            _count_unprotected(name, "no ledger is configured")
            return
        self.warned_no_ledger = _config.generation
        message = (
            f"{name} ran WITHOUT replay protection: no ledger is configured. Pass @replay_safe(ledger=...) "
            "(or your adapter's ledger), call replaysafe.set_default_ledger(...), or set "
            f"{_constants.LEDGER_URL_ENV}."
        )
        emit(EventKind.UNPROTECTED, message, tool_name=name, key=None, level=10)
        warnings.warn(message, UnprotectedCallWarning, stacklevel=_callers_level())

    def _missing_ids(self, scope: CallScope | None, needed: str = "") -> None:
        key = scope.key if scope is not None else None
        if key is None:
            missing = needed + "no tool_call(...) is set"
            default_fix = (
                "Wrap the call in replaysafe.tool_call(thread_id, message_id, tool_call_id), or use an adapter "
                "that does."
            )
        else:
            empty = " and ".join(field for field, value in zip(_ID_FIELDS, key, strict=True) if not value)
            missing = needed + f"the call's {empty} is empty ({key})"
            default_fix = (
                f"Pass tool_call(...) the {empty} the framework gave the call, or key the tool by its arguments "
                '(@replay_safe(key="args")) or by a business key (@replay_safe(key=function)).'
            )
        fix = (scope.missing_ids_fix if scope is not None else None) or default_fix
        if self.on_missing_ids == "raise":
            message = f"{self.spec.name} did not run: {missing}, so the call has no identity to protect it. {fix}"
            raise MissingCallIdError(message, tool_name=self.spec.name, key=key)
        message = f"{self.spec.name} ran WITHOUT replay protection: {missing}. {fix}"
        emit(EventKind.UNPROTECTED, message, tool_name=self.spec.name, key=key, level=10)
        if self.warned_missing != _config.generation:
            self.warned_missing = _config.generation
            warnings.warn(message, UnprotectedCallWarning, stacklevel=_callers_level())


#: The three ids of ``tool_call(...)``, in order (named in the message when one is empty).
_ID_FIELDS = ("thread_id", "message_id", "tool_call_id")


class _Binder:
    """``inspect.Signature.bind`` for the common signature, several times faster.

    Only for parameters without ``*args``/``**kwargs``; it gives the same mapping as
    ``bind`` + ``apply_defaults``, and ``None`` for any call it is not sure of, so
    that ``bind`` handles it (and raises the function's own ``TypeError``).
    """

    __slots__ = ("all_by_position", "defaults", "keywords", "positional", "required", "size")

    def __init__(
        self, positional: tuple[str, ...], keywords: frozenset[str], defaults: dict[str, Any], required: frozenset[str]
    ) -> None:
        self.positional = positional
        self.keywords = keywords
        self.defaults = defaults
        self.required = required
        self.size = len(required) + len(defaults)
        #: The number of arguments that, given by position, are all the parameters (-1: none).
        self.all_by_position = len(positional) if len(positional) == self.size else -1

    @classmethod
    def of(cls, parameters: list[inspect.Parameter]) -> _Binder | None:
        kinds = {p.kind for p in parameters}
        if inspect.Parameter.VAR_POSITIONAL in kinds or inspect.Parameter.VAR_KEYWORD in kinds:
            return None
        positional = tuple(
            p.name
            for p in parameters
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        )
        keywords = frozenset(p.name for p in parameters if p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
        required = frozenset(p.name for p in parameters if p.default is inspect.Parameter.empty)
        return cls(positional, keywords, defaults, required)

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
        # The two common calls first: every parameter given, all by position or all by name.
        if not kwargs:
            if len(args) == self.all_by_position:
                return dict(zip(self.positional, args, strict=True))
        elif not args and len(kwargs) == self.size and kwargs.keys() <= self.keywords:
            return dict(kwargs)
        if len(args) > len(self.positional) or not kwargs.keys() <= self.keywords:
            return None
        arguments = dict(zip(self.positional, args, strict=False))  # fewer args than names: fine
        if kwargs:
            if not arguments.keys().isdisjoint(kwargs):
                return None  # given twice
            arguments.update(kwargs)
        for name, default in self.defaults.items():
            arguments.setdefault(name, default)
        return arguments if self.required <= arguments.keys() else None


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside this module: the line that called the tool
    (through wrapt's proxy, which adds no frame, or through this module's closure, which does).
    Told by the frame's module name: a file name would not match in an install without sources."""
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    return level


def _count_unprotected(tool_name: str, why: str) -> None:
    """Every unprotected call is an event (metrics count them); the warning is said only once."""
    if wanted(EventKind.UNPROTECTED):
        emit(EventKind.UNPROTECTED, f"{tool_name} ran WITHOUT replay protection: {why}", tool_name=tool_name, key=None)


def _warn_disabled(tool_name: str) -> None:
    global _warned_disabled
    if _warned_disabled:
        _count_unprotected(tool_name, f"{_constants.DISABLED_ENV}=1 is in effect")
    else:
        _warned_disabled = True
        message = (
            f"{tool_name} and every other @replay_safe tool run WITHOUT replay protection: "
            f"{_constants.DISABLED_ENV}=1 (or replaysafe.testing.disabled()) is in effect. Meant for unit tests of "
            f"tool bodies; unset {_constants.DISABLED_ENV} anywhere side effects matter."
        )
        emit(EventKind.UNPROTECTED, message, tool_name=tool_name, key=None, level=30)
        warnings.warn(message, UnprotectedCallWarning, stacklevel=_callers_level())


@overload
def replay_safe(func: F, /) -> F: ...


@overload
def replay_safe(
    *,
    ledger: Ledger | None = None,
    name: str | None = None,
    timeout: float | None = UNSET,
    in_doubt: InDoubt | None = None,
    record_errors: bool | type[BaseException] | tuple[type[BaseException], ...] = False,
    exclude_args: tuple[str, ...] | list[str] = (),
    on_missing_ids: OnMissingIds = "warn",
    on_ledger_error: OnLedgerError = "warn",
    lease: float | None = None,
    wait_timeout: float = _constants.WAIT_TIMEOUT,
    max_result_bytes: int = _constants.MAX_RESULT_BYTES,
    serializer: Serializer | None = None,
    key: KeyChoice = "call",
    pause_on: type[BaseException] | tuple[type[BaseException], ...] = (),
    needs_approval: bool = False,
    undo: Callable[[Any], Any] | None = None,
    on_late_result: Callable[[LateResult], Any] | None = None,
) -> Callable[[F], F]: ...


def replay_safe(
    func: Any = None,
    /,
    *,
    ledger: Ledger | None = None,
    name: str | None = None,
    timeout: float | None = UNSET,
    in_doubt: InDoubt | None = None,
    record_errors: bool | type[BaseException] | tuple[type[BaseException], ...] = False,
    exclude_args: tuple[str, ...] | list[str] = (),
    on_missing_ids: OnMissingIds = "warn",
    on_ledger_error: OnLedgerError = "warn",
    lease: float | None = None,
    wait_timeout: float = _constants.WAIT_TIMEOUT,
    max_result_bytes: int = _constants.MAX_RESULT_BYTES,
    serializer: Serializer | None = None,
    key: KeyChoice = "call",
    pause_on: type[BaseException] | tuple[type[BaseException], ...] = (),
    needs_approval: bool = False,
    undo: Callable[[Any], Any] | None = None,
    on_late_result: Callable[[LateResult], Any] | None = None,
) -> Any:
    """Protect a tool with side effects from running again when its call is replayed.

    Inside ``tool_call(thread_id, message_id, tool_call_id)`` the call is claimed in
    the ledger before the tool runs; a call already recorded returns its recorded
    result without running. A protected call made inside another is a step of it.
    ``key`` chooses what identifies a call: ``"call"`` (the ids of ``tool_call``),
    ``"args"`` (the thread id and the arguments) or a function of the arguments giving
    a business key. ``pause_on`` names exceptions that pause the call instead of ending
    it. ``in_doubt`` left out is ``"rerun"`` (``replaysafe crashtest --policy`` sets it for
    the tools of the agent it tests). ``needs_approval`` runs each call only on an approval it
    spends (docs/approvals.md). ``undo`` is the call's compensation, a function of its recorded
    result that ``ledger.undo(key)`` runs once (docs/approvals.md, Undo). ``on_late_result`` is handed a
    ``LateResult`` when a run ends after its call was settled elsewhere. See docs/semantics.md for every
    rule and option.
    """
    if func is None:
        return functools.partial(
            replay_safe,
            ledger=ledger,
            name=name,
            timeout=timeout,
            in_doubt=in_doubt,
            record_errors=record_errors,
            exclude_args=exclude_args,
            on_missing_ids=on_missing_ids,
            on_ledger_error=on_ledger_error,
            lease=lease,
            wait_timeout=wait_timeout,
            max_result_bytes=max_result_bytes,
            serializer=serializer,
            key=key,
            pause_on=pause_on,
            needs_approval=needs_approval,
            undo=undo,
            on_late_result=on_late_result,
        )
    function = getattr(func, "__func__", func)  # a staticmethod or classmethod object
    if not callable(function):
        raise TypeError(f"@replay_safe decorates functions, not {type(func).__name__}")
    tool_name = name or function.__name__
    where = f"@replay_safe on {tool_name}"
    identity = name or _qualified_name(function)
    if name is None:
        _hold_identity(identity, function, where)
    if on_missing_ids not in ("warn", "raise"):
        raise ValueError(f"{where}: on_missing_ids must be 'warn' or 'raise'")
    if on_ledger_error not in ("warn", "raise"):
        raise ValueError(f"{where}: on_ledger_error must be 'warn' or 'raise'")
    if (lease is not None and lease <= 0) or wait_timeout < 0 or max_result_bytes <= 0:
        raise ValueError(f"{where}: lease and max_result_bytes must be > 0, wait_timeout >= 0")
    if not (key in ("call", "args") or callable(key)):
        raise ValueError(f"{where}: key must be 'call', 'args' or a function of the arguments, got {key!r}")
    pauses = (pause_on,) if isinstance(pause_on, type) else tuple(pause_on)
    if not all(isinstance(p, type) and issubclass(p, BaseException) for p in pauses):
        raise TypeError(f"{where}: pause_on takes exception classes")
    if record_errors is True:
        recorded: tuple[type[BaseException], ...] = (Exception,)
    elif record_errors is False:
        recorded = ()
    elif isinstance(record_errors, type):
        recorded = (record_errors,)
    else:
        recorded = tuple(record_errors)
    is_async_stream = inspect.isasyncgenfunction(function)
    is_stream = is_async_stream or inspect.isgeneratorfunction(function)
    spec = ToolSpec(
        name=tool_name,
        serializer=serializer or _DEFAULT_SERIALIZER,
        record_errors=recorded,
        on_ledger_error=on_ledger_error,
        lease=lease,
        wait_timeout=wait_timeout,
        in_doubt=check_in_doubt(in_doubt, where) or _config.default_in_doubt,
        max_result_bytes=max_result_bytes,
        function=function,
        streaming=is_stream,
        identity=identity,
        needs_approval=bool(needs_approval),
        on_late_result=on_late_result,
    )
    tool = _Tool(spec, ledger, timeout_setting(timeout, "timeout"), on_missing_ids, tuple(exclude_args), key, pauses)
    spec.earlier = tool.earlier
    if undo is not None:
        register_undo(spec, undo, tool.timeout)
    spec.digest_of = tool.digest_of

    # Sync, async, or streaming is chosen once, here, not on every call. The frame that applied
    # the decorator: @replay_safe's own, or, for @replay_safe(...), the one that called the partial.
    plain = _is_plain_function(func, sys._getframe(1))
    if is_async_stream:

        @wrapt.decorator
        async def protect_async_stream(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            planned = tool.plan(instance, args, kwargs, wrapped, begin)
            chunks = wrapped(*args, **kwargs) if planned is None else astream(planned, wrapped, args, kwargs)
            async for chunk in chunks:
                yield chunk

        return _marked(protect_async_stream(func), tool)

    if is_stream:

        @wrapt.decorator
        def protect_stream(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            planned = tool.plan(instance, args, kwargs, wrapped, begun_when_read)
            return wrapped(*args, **kwargs) if planned is None else stream(planned, wrapped, args, kwargs)

        return _marked(protect_stream(func), tool)

    if inspect.iscoroutinefunction(function):
        # The plain closure repeats protect_async's two lines rather than call it: a frame less per call.
        async def protect_async(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            planned = tool.plan(instance, args, kwargs, wrapped)
            return await (wrapped(*args, **kwargs) if planned is None else adrive(*planned))

        if plain:

            @functools.wraps(function)
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                planned = tool.plan(None, args, kwargs, function)
                return await (function(*args, **kwargs) if planned is None else adrive(*planned))

            return _marked(call_async, tool)
        return _marked(wrapt.decorator(protect_async)(func), tool)

    # The same here: the plain closure repeats protect's two lines, a frame less per call.
    def protect(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        planned = tool.plan(instance, args, kwargs, wrapped)
        return wrapped(*args, **kwargs) if planned is None else drive(*planned)

    if plain:

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            planned = tool.plan(None, args, kwargs, function)
            return function(*args, **kwargs) if planned is None else drive(*planned)

        return _marked(call, tool)
    return _marked(wrapt.decorator(protect)(func), tool)


def _is_plain_function(func: Any, decorating: types.FrameType | None) -> bool:
    """Whether ``func`` is a function that is not a method: one to wrap in a plain closure.

    A closure costs about 4,000 fewer instructions per call than wrapt's proxy (which also
    looks up a ``__self__`` the function lacks, raising and clearing an AttributeError each
    time), but it binds as a function: called through an instance, its receiver would be an
    argument to digest. So wrapt's proxy, which binds like the function it wraps and hands the
    receiver apart, is kept for anything that may be a method: a function whose qualified name
    puts it in a class, one decorated in a class body (``decorating``, the frame that applied
    ``@replay_safe``: a class body's namespace holds ``__qualname__``; this catches a method
    under another decorator that did not copy its name), one whose first parameter is named
    ``self`` or ``cls``, a ``staticmethod`` or ``classmethod`` object, and a callable object.
    """
    if not inspect.isfunction(func):
        return False
    owner = func.__qualname__.rpartition(".")[0]
    if owner and not owner.endswith("<locals>"):
        return False
    if decorating is not None and "__qualname__" in decorating.f_locals and "__module__" in decorating.f_locals:
        return False
    first = next(iter(inspect.signature(func).parameters), None)
    return first not in ("self", "cls")


def _defaults(parameters: list[inspect.Parameter]) -> dict[str, Any]:
    """Each parameter's default, as ``apply_defaults`` fills it in (``()`` and ``{}`` for ``*args``
    and ``**kwargs``): an argument equal to it is left out of the digest."""
    defaults: dict[str, Any] = {}
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            defaults[parameter.name] = ()
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            defaults[parameter.name] = {}
        elif parameter.default is not inspect.Parameter.empty:
            defaults[parameter.name] = parameter.default
    return defaults


def _qualified_name(function: Any) -> str:
    """``module:qualname``, the identity of a tool given no ``name=``."""
    module = getattr(function, "__module__", None) or "?"
    return f"{module}:{getattr(function, '__qualname__', None) or function.__name__}"


#: The function holding each identity of a tool given no ``name=``, weakly: a function redefined
#: and collected (a notebook cell run again) gives its identity back.
_identities: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_identities_lock = threading.Lock()


def _hold_identity(identity: str, function: Any, where: str) -> None:
    """Refuse a second, different tool under one identity: the two would share their records (a
    business key or ``key="args"`` would hand one tool's result to the other). The same function
    decorated again, or the same code made anew (a factory's inner function), is the same tool. The
    code compared is the innermost one, under ``functools.wraps`` layers: every function a decorator
    wraps runs that decorator's one wrapper code."""
    with _identities_lock:
        held = _identities.get(identity)
        code = _innermost_code(function)
        if held is not None and held is not function and (code is None or _innermost_code(held) is not code):
            raise ValueError(
                f"{where}: two different tools have the identity {identity} ({_defined_at(held)} and "
                f"{_defined_at(function)}), so they would share their records. Give each its own name with "
                '@replay_safe(name="..."), or give both the same name= if they are one tool.'
            )
        with contextlib.suppress(TypeError):  # a callable that takes no weak reference is not checked
            _identities[identity] = function


def _innermost_code(function: Any) -> Any:
    with contextlib.suppress(ValueError):  # a __wrapped__ chain that loops: compare what is there
        function = inspect.unwrap(function)
    return getattr(function, "__code__", None)


def _defined_at(function: Any) -> str:
    code = _innermost_code(function)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else repr(function)


def _marked(wrapper: Any, tool: _Tool) -> Any:
    # On wrapt's proxy a _self_ attribute lives on the proxy itself, not on the wrapped function;
    # on a closure, on the closure (functools.wraps gave it a copy of the function's __dict__).
    wrapper._self_replaysafe_tool = tool
    return wrapper


def is_replay_safe(function: object) -> bool:
    """Whether ``function`` is protected by ``@replay_safe`` (through ``functools.wraps`` layers too).

    Adapters use it to leave decorated tools to their own protection.
    """
    return tool_of(function) is not None


def tool_of(function: object) -> _Tool | None:
    """The protection ``@replay_safe`` put on ``function`` (through ``functools.wraps`` layers), if any."""
    for _ in range(32):
        function = getattr(function, "__func__", function)  # a staticmethod or classmethod
        tool = getattr(function, "_self_replaysafe_tool", None)
        if isinstance(tool, _Tool):
            return tool
        unwrapped = getattr(function, "__wrapped__", None)
        if unwrapped is None or unwrapped is function:
            return None
        function = unwrapped
    return None
