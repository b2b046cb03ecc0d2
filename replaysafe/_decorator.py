"""``@replay_safe``: the thin sync and async drivers of the replay protocol."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
import warnings
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Literal, TypeVar, overload

import tenacity
import wrapt

from . import _constants
from ._codec import JsonSerializer, Serializer
from ._config import default_ledger
from ._context import CallScope, _current, _scope
from ._core import Effect, LedgerOp, OnLedgerError, Protocol, RunTool, Sleep, ToolSpec, replay
from ._errors import LedgerError, MissingCallIdError, UnprotectedCallWarning, describe
from ._identity import args_digest
from ._records import CallKey
from .ledgers import Ledger

F = TypeVar("F", bound=Callable[..., Any])
OnMissingIds = Literal["warn", "raise"]

_DEFAULT_SERIALIZER = JsonSerializer()
_warned_no_ledger = False


class _Tool:
    """One decorated tool: its protocol settings and how its arguments bind."""

    __slots__ = ("_signatures", "exclude_args", "ledger", "on_missing_ids", "spec", "warned_missing")

    def __init__(
        self, spec: ToolSpec, ledger: Ledger | None, on_missing_ids: OnMissingIds, exclude_args: tuple[str, ...]
    ) -> None:
        self.spec = spec
        self.ledger = ledger
        self.on_missing_ids = on_missing_ids
        self.exclude_args = exclude_args
        self.warned_missing = False
        signature = inspect.signature(spec.function)
        unknown = [name for name in exclude_args if name not in signature.parameters]
        if unknown:
            raise TypeError(f"@replay_safe(exclude_args=...) on {spec.name}: no parameter named {', '.join(unknown)}")
        parameters = list(signature.parameters.values())
        # Called through an instance or class, wrapt hands us args without self/cls.
        self._signatures = (signature, signature.replace(parameters=parameters[1:]))

    def digest(self, instance: object, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """Bind the call's arguments by name (defaults applied) and digest them."""
        bound = self._signatures[instance is not None].bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        for name in self.exclude_args:
            arguments.pop(name, None)
        return args_digest(arguments, tool_name=self.spec.name)

    def plan(
        self, instance: object, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Ledger, CallScope, str] | None:
        """The ledger, key and argument digest of a protected call; ``None`` to run it plainly."""
        if _current.get() is not None:
            return None  # called from inside another protected tool, whose record covers it
        scope = _scope.get()
        ledger = self.ledger or (scope.ledger if scope is not None else None) or default_ledger()
        if ledger is None:
            _warn_no_ledger(self.spec.name)
            return None
        if scope is None or not all(scope.key):
            self._missing_ids(scope.key if scope is not None else None)
            return None
        return ledger, scope, self.digest(instance, args, kwargs)

    def _missing_ids(self, key: CallKey | None) -> None:
        missing = "no tool_call(...) is set" if key is None else f"empty ids in ({key})"
        message = (
            f"{self.spec.name} ran WITHOUT replay protection: {missing}. Wrap the call in "
            "replaysafe.tool_call(thread_id, message_id, tool_call_id), or use an adapter that does."
        )
        if self.on_missing_ids == "raise":
            raise MissingCallIdError(message, tool_name=self.spec.name, key=key)
        if not self.warned_missing:
            self.warned_missing = True
            warnings.warn(message, UnprotectedCallWarning, stacklevel=4)


def _warn_no_ledger(tool_name: str) -> None:
    global _warned_no_ledger
    if not _warned_no_ledger:
        _warned_no_ledger = True
        warnings.warn(
            f"{tool_name} and every other @replay_safe tool run WITHOUT replay protection: no ledger is configured. "
            "Pass @replay_safe(ledger=...), call replaysafe.set_default_ledger(...), or set "
            f"{_constants.LEDGER_URL_ENV}.",
            UnprotectedCallWarning,
            stacklevel=4,
        )


# --- performing effects: the only code that differs between sync and async ---------


def _ledger_error(effect: LedgerOp, spec: ToolSpec, ledger: Ledger, exc: BaseException) -> LedgerError:
    operation = type(effect).__name__.lower()
    transient = isinstance(exc, ledger.transient_errors)
    # A driver's own error, not SQLAlchemy's wrapper, whose text would quote the
    # statement's parameters: those hold the tool's result.
    cause = getattr(exc, "orig", None) or exc
    return LedgerError(
        f"ledger {operation} failed for {describe(spec.name, effect.key)} on {ledger!r} "
        f"({type(cause).__name__}: {str(cause).strip()}). Check that the ledger is reachable and its table exists.",
        tool_name=spec.name,
        key=effect.key,
        transient=transient,
    )


def _retrying_kwargs(ledger: Ledger) -> dict[str, Any]:
    """Bounded retry of transient errors; the first attempt was made already."""
    return {
        "stop": tenacity.stop_after_attempt(max(ledger.retry.attempts - 1, 1))
        | tenacity.stop_after_delay(ledger.retry.max_seconds),
        "wait": tenacity.wait_random_exponential(multiplier=0.01, max=0.1),
        "retry": tenacity.retry_if_exception_type(ledger.transient_errors),
        "reraise": True,
    }


def _perform_ledger_op(effect: LedgerOp, ledger: Ledger, spec: ToolSpec) -> Any:
    try:
        return effect.on(ledger)
    except Exception as exc:
        if not isinstance(exc, ledger.transient_errors) or ledger.retry.attempts <= 1:
            raise _ledger_error(effect, spec, ledger, exc) from exc
    try:
        for attempt in tenacity.Retrying(**_retrying_kwargs(ledger)):
            with attempt:
                return effect.on(ledger)
    except Exception as exc:
        raise _ledger_error(effect, spec, ledger, exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover


async def _aperform_ledger_op(effect: LedgerOp, ledger: Ledger, spec: ToolSpec) -> Any:
    aio = ledger.aio
    try:
        return await effect.on(aio)
    except Exception as exc:
        if not isinstance(exc, ledger.transient_errors) or ledger.retry.attempts <= 1:
            raise _ledger_error(effect, spec, ledger, exc) from exc
    try:
        async for attempt in tenacity.AsyncRetrying(**_retrying_kwargs(ledger)):
            with attempt:
                return await effect.on(aio)
    except Exception as exc:
        raise _ledger_error(effect, spec, ledger, exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover


def _drive(protocol: Protocol, ledger: Ledger, spec: ToolSpec, wrapped: Callable[..., Any]) -> Any:
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect: Effect = protocol.send(send) if error is None else protocol.throw(error)
        except StopIteration as stop:
            return stop.value
        send = error = None
        try:
            if isinstance(effect, RunTool):
                token = _current.set(effect.call)
                try:
                    send = wrapped(*effect.call.args, **effect.call.kwargs)
                finally:
                    _current.reset(token)
            elif isinstance(effect, Sleep):
                time.sleep(effect.seconds)
            else:
                send = _perform_ledger_op(effect, ledger, spec)
        except BaseException as exc:
            error = exc


async def _adrive(protocol: Protocol, ledger: Ledger, spec: ToolSpec, wrapped: Callable[..., Any]) -> Any:
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect: Effect = protocol.send(send) if error is None else protocol.throw(error)
        except StopIteration as stop:
            return stop.value
        send = error = None
        try:
            if isinstance(effect, RunTool):
                token = _current.set(effect.call)
                try:
                    send = await wrapped(*effect.call.args, **effect.call.kwargs)
                finally:
                    _current.reset(token)
            elif isinstance(effect, Sleep):
                await asyncio.sleep(effect.seconds)
            else:
                send = await _aperform_ledger_op(effect, ledger, spec)
        except BaseException as exc:
            error = exc


# --- the decorator -------------------------------------------------------------


@overload
def replay_safe(func: F, /) -> F: ...


@overload
def replay_safe(
    *,
    ledger: Ledger | None = None,
    name: str | None = None,
    record_errors: bool | type[BaseException] | tuple[type[BaseException], ...] = False,
    exclude_args: tuple[str, ...] | list[str] = (),
    on_missing_ids: OnMissingIds = "warn",
    on_ledger_error: OnLedgerError = "warn",
    lease: float = _constants.LEASE,
    wait_timeout: float = _constants.WAIT_TIMEOUT,
    serializer: Serializer | None = None,
) -> Callable[[F], F]: ...


def replay_safe(
    func: Any = None,
    /,
    *,
    ledger: Ledger | None = None,
    name: str | None = None,
    record_errors: bool | type[BaseException] | tuple[type[BaseException], ...] = False,
    exclude_args: tuple[str, ...] | list[str] = (),
    on_missing_ids: OnMissingIds = "warn",
    on_ledger_error: OnLedgerError = "warn",
    lease: float = _constants.LEASE,
    wait_timeout: float = _constants.WAIT_TIMEOUT,
    serializer: Serializer | None = None,
) -> Any:
    """Protect a tool with side effects from running again when its call is replayed.

    Inside ``tool_call(thread_id, message_id, tool_call_id)`` the call is claimed in
    the ledger before the tool runs; a call already recorded returns its recorded
    result without running. See docs/semantics.md for every rule.
    """
    if func is None:
        return functools.partial(
            replay_safe,
            ledger=ledger,
            name=name,
            record_errors=record_errors,
            exclude_args=exclude_args,
            on_missing_ids=on_missing_ids,
            on_ledger_error=on_ledger_error,
            lease=lease,
            wait_timeout=wait_timeout,
            serializer=serializer,
        )
    function = getattr(func, "__func__", func)  # a staticmethod or classmethod object
    if not callable(function):
        raise TypeError(f"@replay_safe decorates functions, not {type(func).__name__}")
    tool_name = name or function.__name__
    if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
        raise TypeError(f"@replay_safe on {tool_name}: generator (streaming) tools are not supported yet")
    if on_missing_ids not in ("warn", "raise"):
        raise ValueError(f"@replay_safe on {tool_name}: on_missing_ids must be 'warn' or 'raise'")
    if on_ledger_error not in ("warn", "raise"):
        raise ValueError(f"@replay_safe on {tool_name}: on_ledger_error must be 'warn' or 'raise'")
    if lease <= 0 or wait_timeout < 0:
        raise ValueError(f"@replay_safe on {tool_name}: lease must be > 0 and wait_timeout >= 0")
    if record_errors is True:
        recorded: tuple[type[BaseException], ...] = (Exception,)
    elif record_errors is False:
        recorded = ()
    elif isinstance(record_errors, type):
        recorded = (record_errors,)
    else:
        recorded = tuple(record_errors)
    spec = ToolSpec(
        name=tool_name,
        serializer=serializer or _DEFAULT_SERIALIZER,
        record_errors=recorded,
        on_ledger_error=on_ledger_error,
        lease=timedelta(seconds=lease),
        wait_timeout=wait_timeout,
        function=function,
    )
    tool = _Tool(spec, ledger, on_missing_ids, tuple(exclude_args))

    # Sync or async is chosen once, here, not on every call.
    if inspect.iscoroutinefunction(function):

        @wrapt.decorator
        async def protect_async(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            plan = tool.plan(instance, args, kwargs)
            if plan is None:
                return await wrapped(*args, **kwargs)
            ledger, scope, digest = plan
            return await _adrive(replay(spec, scope, digest, args, kwargs), ledger, spec, wrapped)

        return protect_async(func)

    @wrapt.decorator
    def protect(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        plan = tool.plan(instance, args, kwargs)
        if plan is None:
            return wrapped(*args, **kwargs)
        ledger, scope, digest = plan
        return _drive(replay(spec, scope, digest, args, kwargs), ledger, spec, wrapped)

    return protect(func)
