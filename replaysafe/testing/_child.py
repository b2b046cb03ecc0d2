"""Run a function in a new Python process, SIGKILLed at a named point if asked."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _forkserver
from ._case import OUTCOME_ENV

#: The environment variable that names the point at which the child kills itself.
KILL_AT_ENV = "REPLAYSAFE_TEST_KILL_AT"


def kill_point(name: str) -> None:
    """SIGKILL this process here when ``run_in_child(..., kill_at=name)`` started it; else do nothing.

    Put it where a crash should happen, for example right after a tool's side effect and
    before it returns (the call is then in doubt). The kill is a real SIGKILL: nothing after
    this line runs, no ``finally`` block, no ``atexit`` handler.
    """
    if os.environ.get(KILL_AT_ENV) != name:
        return
    outcome = os.environ.get(OUTCOME_ENV)
    if outcome:
        Path(outcome).write_text(json.dumps({"killed_at": name}), encoding="utf-8")
    os.kill(os.getpid(), signal.SIGKILL)


@dataclasses.dataclass(frozen=True)
class ChildRun:
    """How a ``run_in_child`` process ended: killed at its point, or returning ``value``."""

    #: The name of the ``kill_point`` the child died at; ``None`` when it returned.
    killed_at: str | None
    #: What the function returned (as JSON gives it back); ``None`` when killed.
    value: Any
    returncode: int
    stdout: str
    stderr: str

    @property
    def killed(self) -> bool:
        return self.killed_at is not None


class ChildError(Exception):
    """The function raised in the child, or the child died in a way nobody asked for."""

    def __init__(self, message: str, *, type_name: str | None = None, child_traceback: str = "") -> None:
        super().__init__(message)
        #: The qualified name of the exception the child raised (``replaysafe.CallInDoubtError``).
        self.type_name = type_name
        self.child_traceback = child_traceback


def _location(function: Callable[..., Any]) -> dict[str, Any]:
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if not module or "<locals>" in qualname or "<lambda>" in qualname:
        raise TypeError(
            f"run_in_child() needs a function defined at the top level of a module, got {function!r}: the child "
            "process imports it by name."
        )
    source = getattr(sys.modules.get(module), "__file__", None)
    return {"module": module, "qualname": qualname, "file": source}


def run_in_child(
    function: Callable[..., Any],
    /,
    *args: Any,
    kill_at: str | None = None,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> ChildRun:
    """Run ``function(*args, **kwargs)`` in a new Python process and wait for it.

    ``function`` must be defined at the top level of an importable module (a test module
    is fine) or of the script run as ``python x.py`` (loaded from its file in the child, under
    another name than ``__main__``, so its ``if __name__ == "__main__":`` block does not run
    again); an ``async def`` function runs under ``asyncio.run``. Arguments and the return
    value travel as JSON. With ``kill_at="name"``, the child SIGKILLs itself when it reaches
    ``kill_point("name")``, and ``ChildError`` is raised if it finishes without reaching it.
    Any ledger must be one that survives the process (a SQLite file, PostgreSQL, Redis):
    hand the child its URL. Raises ``ChildError`` when the function raises (with the child's
    traceback) and ``TimeoutError`` when it runs past ``timeout`` seconds (it is killed).
    """
    request = {**_location(function), "sys_path": sys.path, "args": list(args), "kwargs": kwargs}
    with tempfile.TemporaryDirectory(prefix="replaysafe-child-") as folder:
        outcome = Path(folder) / "outcome.json"
        child_env = {**os.environ, **(env or {}), OUTCOME_ENV: str(outcome)}
        child_env.pop(KILL_AT_ENV, None)
        if kill_at is not None:
            child_env[KILL_AT_ENV] = kill_at
        try:
            done = _forkserver.run_python(
                ["-m", "replaysafe.testing._child_main"], input=json.dumps(request), env=child_env, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:  # subprocess.run has killed it
            raise TimeoutError(f"run_in_child({_name(function)}) did not finish within {timeout} s") from exc
        report = json.loads(outcome.read_text(encoding="utf-8")) if outcome.exists() else None
    where = f"run_in_child({_name(function)})"
    if report is None:
        raise ChildError(
            f"{where}: the child exited with code {done.returncode} without reporting; its stderr:\n{done.stderr}"
        )
    if "not_found" in report:
        raise ChildError(
            f"{where}: the child could not find the function, which did not run: {report['not_found']}. It must be "
            "defined at the top level of a module or of the script being run, under the same name."
        )
    if "killed_at" in report:
        if done.returncode != -signal.SIGKILL:
            raise ChildError(f"{where}: the child reached kill point {kill_at!r} but ended with {done.returncode}")
        return ChildRun(report["killed_at"], None, done.returncode, done.stdout, done.stderr)
    if "error_type" in report:
        raise ChildError(
            f"{where}: the function raised {report['error_type']}; the child's traceback:\n{report['traceback']}",
            type_name=report["error_type"],
            child_traceback=report["traceback"],
        )
    if kill_at is not None:
        raise ChildError(f"{where}: the function returned without reaching kill_point({kill_at!r})")
    return ChildRun(None, report["value"], done.returncode, done.stdout, done.stderr)


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", repr(function))
