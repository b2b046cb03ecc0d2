"""The child process of ``run_in_child``: import the function, run it, report the outcome."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from ._case import OUTCOME_ENV

#: The name a script's ``__main__`` is loaded under here: not ``__main__``, so its ``if __name__ == "__main__":``
#: block does not run again in the child (as multiprocessing's spawn does it).
SCRIPT_MODULE = "__replaysafe_child_main__"


def _module(name: str, file: str | None) -> ModuleType:
    if name == "__main__":  # a function of the script run as ``python x.py``: loaded from its file
        if not file:
            raise ImportError("the function is defined in __main__, which has no file (an interactive session?)")
        name = SCRIPT_MODULE
    else:
        try:
            return importlib.import_module(name)
        except ImportError:
            if not file:
                raise
    # A test module imported by path (pytest's importlib mode), or a script: load it the same way.
    return load_file(name, file)


def load_file(name: str, file: str) -> ModuleType:
    """The Python file ``file``, run as the module ``name`` (and kept in ``sys.modules`` under it)."""
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    request = json.loads(sys.stdin.read())
    outcome = Path(os.environ[OUTCOME_ENV])
    sys.path[:] = request["sys_path"]
    try:
        target: Any = _module(request["module"], request["file"])
        for part in request["qualname"].split("."):
            target = getattr(target, part)
    except BaseException as exc:  # not the function's error: it never ran
        where = request["file"] or request["module"]
        text = json.dumps({"not_found": f"{type(exc).__name__}: {exc} (looking for {request['qualname']} in {where})"})
        outcome.write_text(text, encoding="utf-8")
        return
    try:
        value = target(*request["args"], **request["kwargs"])
        if inspect.isawaitable(value):
            value = asyncio.run(_await(value))
        text = json.dumps({"value": value})  # a value JSON cannot carry is reported as the error it is
    except BaseException as exc:  # everything the function raised goes back to the test
        kind = type(exc)
        text = json.dumps({"error_type": f"{kind.__module__}.{kind.__qualname__}", "traceback": traceback.format_exc()})
    outcome.write_text(text, encoding="utf-8")


async def _await(awaitable: Any) -> Any:
    return await awaitable


if __name__ == "__main__":
    main()
