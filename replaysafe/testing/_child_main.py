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

from ._child import OUTCOME_ENV


def _module(name: str, file: str | None) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        if not file:
            raise
    # A test module imported by path (pytest's importlib mode): load it the same way.
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
