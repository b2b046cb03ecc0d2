"""A child process of ``replaysafe crashtest``: run the entry point once, watching its calls.

``python -m replaysafe.testing._crashtest_child ENTRY POLICY [EFFECT ...]`` with the case's
environment (``_case``): every crash point a protected call reaches, every event of the library
and every marked side effect goes to the case's log, and the process SIGKILLs itself at the one
point it was asked to. How the entry point ended is the log's last line.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import _config, _crash_points
from .._events import Event, EventKind, on_event
from . import _case
from ._child_main import load_file
from ._effects import ENTRY_MODULE, side_effect

#: The events a case's verdict reads.
_LOGGED = {
    EventKind.STARTED,
    EventKind.REPLAYED,
    EventKind.IN_DOUBT,
    EventKind.UNPROTECTED,
    EventKind.PAUSED,
    EventKind.DUPLICATE_DETECTED,
    EventKind.MISMATCH,
    EventKind.TAMPERED,
}


def load(spec: str) -> Callable[..., Any]:
    """``path/to/file.py:function`` or ``package.module:function`` (the current directory importable)."""
    where, colon, name = spec.rpartition(":")
    if not colon or not where or not name:
        raise ImportError(f"{spec!r} is not ENTRY: give path/to/file.py:function or package.module:function")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where).resolve()
        if not path.is_file():
            raise ImportError(f"no file {where} (from the current directory {Path.cwd()})")
        sys.path.insert(0, str(path.parent))  # its own imports, as ``python file.py`` would find them
        module = load_file(ENTRY_MODULE, str(path))
    else:
        sys.path.insert(0, str(Path.cwd()))
        module = importlib.import_module(where)
    target: Any = module
    for part in name.split("."):
        if not hasattr(target, part):
            raise ImportError(f"{where} has no {name!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ImportError(f"{spec} is not a function")
    return target  # type: ignore[no-any-return]


def _count(effect: str) -> None:
    """Wrap the function ``module:qualname`` where it is defined, as ``side_effect`` does."""
    module_name, _, qualname = effect.partition(":")
    owner: Any = importlib.import_module(module_name)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    function = getattr(owner, name)
    wrapped = side_effect(function)
    functools.update_wrapper(wrapped, function)
    setattr(owner, name, wrapped)


def main(argv: list[str]) -> int:
    entry, policy, *effects = argv
    case = _case.current()
    if case is None:
        print("run by replaysafe crashtest only", file=sys.stderr)
        return 2
    if policy != "-":
        _config.default_in_doubt = policy  # type: ignore[assignment]  # "rerun" or "raise", checked by the command

    def logged(event: Event) -> None:
        if event.kind not in _LOGGED:
            return
        key = _case.key_list(event.key)
        case.note("event", event=event.kind.value, key=key, tool=event.tool_name, attempt=event.attempt)
        if event.kind is EventKind.STARTED and event.key is not None:
            case.started(event.key, event.tool_name)

    on_event(logged)
    _crash_points.watcher = case.point
    try:
        for effect in effects:
            _count(effect)
        function = load(entry)
    except BaseException as exc:  # the entry point never ran
        case.note("outcome", ok=False, found=False, error=f"{type(exc).__name__}: {exc}")
        return 3
    try:
        value = function()
        if inspect.isawaitable(value):
            asyncio.run(_awaited(value))
    except BaseException as exc:
        kind = type(exc)
        case.note(
            "outcome",
            ok=False,
            found=True,
            error_type=f"{kind.__module__}.{kind.__qualname__}",
            traceback=traceback.format_exc(limit=-8),
        )
        return 1
    case.note("outcome", ok=True, found=True)
    return 0


async def _awaited(value: Any) -> Any:
    return await value


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
