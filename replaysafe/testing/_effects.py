"""``side_effect``: mark a function whose every execution ``replaysafe crashtest`` counts."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from .._identity import args_digest
from . import _case

F = TypeVar("F", bound=Callable[..., Any])

#: The module name a crash test's child gives the entry point's file (``_crashtest_child``).
ENTRY_MODULE = "__replaysafe_crashtest_entry__"


def _module_name(function: Callable[..., Any]) -> str:
    """Where ``function`` is defined, as the report names it: the entry point's file by its file name."""
    module = getattr(function, "__module__", None) or "?"
    if module == ENTRY_MODULE:
        return os.path.basename(getattr(sys.modules.get(module), "__file__", None) or module)
    return module


def _digest(
    signature: inspect.Signature | None, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str | None:
    """The digest of one execution's arguments, bound by parameter name (as a tool's are): two executions with
    the same digest did the same thing. ``None`` for arguments that are not data (nothing to compare them by)."""
    if signature is None:
        return None
    try:
        return args_digest(signature.bind(*args, **kwargs).arguments, tool_name=name)
    except TypeError:  # arguments that do not bind, or are not data (ArgumentDigestError)
        return None


def side_effect(function: F, /) -> F:
    """Count each execution of ``function`` (a side effect that is not a protected tool) in a crash test.

    Under ``replaysafe crashtest`` each execution (returned or raised) is counted across the crashed run and its resume,
    in the case's directory: an effect that runs again after a crash and a resume is reported,
    named, as one that ran more often than once ("`send_sms` is not protected"). Inside a protected
    tool, the crash test also kills the process right after the tool's first marked effect (its
    ``inside`` point), which is where a crash leaves the call in doubt. Each execution is also counted
    by the digest of its arguments (bound by name, as a tool's): one with arguments the run that was not
    killed never used (an approval or a plan bound to other arguments, carried out on resume) is reported
    too. Outside a crash test it calls ``function`` and nothing else. Sync and async functions both work.
    """
    name = f"{_module_name(function)}:{function.__qualname__}"
    try:
        signature: inspect.Signature | None = inspect.signature(function)
    except (TypeError, ValueError):  # a callable without one: counted by name alone
        signature = None
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def counted_async(*args: Any, **kwargs: Any) -> Any:
            case = _case.current()
            digest = None if case is None else _digest(signature, name, args, kwargs)  # before it can change them
            try:
                return await function(*args, **kwargs)
            finally:
                if case is not None:
                    case.effect(name, digest)

        return counted_async  # type: ignore[return-value]

    @functools.wraps(function)
    def counted(*args: Any, **kwargs: Any) -> Any:
        case = _case.current()
        digest = None if case is None else _digest(signature, name, args, kwargs)  # before it can change them
        try:
            return function(*args, **kwargs)
        finally:
            if case is not None:  # counted whether it returned or raised: it may have taken effect
                case.effect(name, digest)

    return counted  # type: ignore[return-value]
