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
import json
import os
import sys
import sysconfig
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
    EventKind.APPROVED,
    EventKind.REJECTED,
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


def _installed_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib") if name in paths}
    return tuple(sorted(os.path.join(os.path.realpath(root), "") for root in roots))


def installed_modules() -> list[str]:
    """The modules this process has imported from the standard library and installed packages, in the
    order they were imported: what a server can import ahead of a run. Code of the project itself
    (anything not installed, editable installs included) is left to each run."""
    roots = _installed_roots()
    names = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name == "__main__" or not isinstance(file, str):
            continue
        if os.path.realpath(file).startswith(roots):
            names.append(name)
    return names


def _count(effect: str, entry: str) -> None:
    """Wrap the function ``module:qualname`` where it is defined, as ``side_effect`` does (the entry point's
    own file, named by its path or its module name, is the module the entry point was loaded as)."""
    module_name, _, qualname = effect.partition(":")
    entry_file = entry.rpartition(":")[0]
    owner: Any
    if module_name in (entry_file, Path(entry_file).stem) and ENTRY_MODULE in sys.modules:
        owner = sys.modules[ENTRY_MODULE]
    elif module_name.endswith(".py"):
        owner = load_file(f"__replaysafe_crashtest_{Path(module_name).stem}__", str(Path(module_name).resolve()))
    else:
        owner = importlib.import_module(module_name)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    function = getattr(owner, name)
    wrapped = side_effect(function)
    functools.update_wrapper(wrapped, function)
    setattr(owner, name, wrapped)


def main(argv: list[str]) -> int:
    entry, policy, *effects = argv
    given = json.loads(os.environ.get(_case.SYS_PATH_ENV, "[]"))
    sys.path.extend(path for path in given if path not in sys.path)  # after this process's own, as it started
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
        function = load(entry)
    except BaseException as exc:  # the entry point never ran
        case.note("outcome", ok=False, found=False, error=f"{type(exc).__name__}: {exc}")
        return 3
    try:
        for effect in effects:
            _count(effect, entry)
    except BaseException as exc:
        case.note("outcome", ok=False, found=False, error=f"--effects {effect}: {type(exc).__name__}: {exc}")
        return 3
    try:
        value = function()
        if inspect.isawaitable(value):
            asyncio.run(_awaited(value))
    except SystemExit as exc:
        if exc.code not in (None, 0):
            return _failed(case, exc)
    except BaseException as exc:
        return _failed(case, exc)
    finally:
        if case.run == "discover":  # what the later runs can have imported ahead (_forkserver)
            case.note("modules", names=installed_modules())
    case.note("outcome", ok=True, found=True)
    return 0


def _leaves(exc: BaseException) -> list[BaseException]:
    """The errors an exception group holds, however deep (an anyio or asyncio task group's), or ``exc``."""
    inner = getattr(exc, "exceptions", None)
    if not isinstance(inner, tuple) or not all(isinstance(e, BaseException) for e in inner):
        return [exc]
    return [leaf for e in inner for leaf in _leaves(e)]


def _failed(case: _case.Case, exc: BaseException) -> int:
    """The entry point raised: logged with where (its last frames) and what type, not its message (values).
    A group of errors of one type (a task group's) is logged as that type."""
    kinds = {type(leaf) for leaf in _leaves(exc)}
    kind = kinds.pop() if len(kinds) == 1 else type(exc)
    name = f"{kind.__module__}.{kind.__qualname__}"
    frames = "".join(traceback.format_tb(exc.__traceback__, limit=-8))
    case.note("outcome", ok=False, found=True, error_type=name, traceback=f"{frames}{name}")
    return 1


async def _awaited(value: Any) -> Any:
    return await value


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
