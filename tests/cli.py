"""The `replaysafe` command run in this process, as a fresh ``python -m replaysafe`` process would run it.

A subprocess per command costs the interpreter's start and replaysafe's import each time (about a second on CI);
``cli`` calls ``replaysafe._cli.main`` instead, with what a new process would have: its own stdin, stdout and
stderr, the environment given, the directories of ``PYTHONPATH`` importable, Python's default warning filters
(not the suite's "error"), replaysafe's process-wide state as a fresh import has it (``REPLAYSAFE_DISABLED``
read again, the machine's clocks, no default ledger), its exit status from ``SystemExit`` as the interpreter
makes it, and an uncaught exception printed as a traceback with exit status 1.

``subprocess_cli`` is the real thing, for the few tests where the process is the point (the entry point itself,
signals, a closed pipe, a terminal, a second process at the same time).
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import importlib
import io
import os
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import replaysafe.testing
from replaysafe import _cli, _config, _drivers
from replaysafe._clock import MACHINE

#: Variables a process reads as it starts, which cannot be given to a call in a running one: run those for real.
_STARTUP_ONLY = ("REPLAYSAFE_OWNER_MACHINE",)  # _owners reads it once, at import


def cli(*args: str, stdin: str = "", env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``replaysafe *args`` with ``stdin`` as its input and ``env`` added to this process's environment (as
    ``subprocess.run(..., input=stdin, env={**os.environ, **env})`` ran it), in this process."""
    env = dict(env or {})
    unfit = [name for name in env if name in _STARTUP_ONLY or (name.startswith("PYTHON") and name != "PYTHONPATH")]
    if unfit:
        raise ValueError(f"{unfit} take effect as a process starts: run this command with subprocess_cli")
    out, err = io.StringIO(), io.StringIO()
    with (
        _environment(env),
        _importable(env.get("PYTHONPATH", "")),
        _fresh_replaysafe(),
        _default_warnings(),
        _streams(io.StringIO(stdin), out, err),
    ):
        # An empty context: none of the caller's context variables (a tool_call's ids, a running call) reach it.
        returncode = contextvars.Context().run(_main, list(args))
        gc.collect()  # what the command left to the collector is collected under its own warning filters
    return subprocess.CompletedProcess(["replaysafe", *args], returncode, out.getvalue(), err.getvalue())


def subprocess_cli(
    *args: str, stdin: str = "", env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m replaysafe *args`` in a new process: the entry point as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "replaysafe", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _main(argv: list[str]) -> int:
    """``sys.exit(main(argv))`` as the interpreter ends a process: the exit status it would have."""
    try:
        return _exit_status(_cli.main(argv))
    except SystemExit as exc:  # argparse: --help, --version, a usage error
        return _exit_status(exc.code)
    except Exception:
        traceback.print_exc()  # to the command's stderr, as an uncaught exception ends a process
        return 1


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF  # what a parent sees of it
    print(code, file=sys.stderr)  # sys.exit("message"): printed, exit status 1
    return 1


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``env`` added for the block; put back as it was after."""
    before = {name: os.environ.get(name) for name in env}
    # A piped stdout has no terminal size: a new process formats --help for 80 columns unless COLUMNS says.
    if "COLUMNS" not in env and "COLUMNS" not in os.environ:
        before["COLUMNS"] = None
        os.environ["COLUMNS"] = "80"
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _importable(pythonpath: str) -> Iterator[None]:
    """The directories of ``PYTHONPATH`` on ``sys.path`` for the block (modules, and the distributions whose
    entry points ``importlib.metadata`` finds there); the modules imported from them are forgotten after, as
    they are when a process ends."""
    on_path = {str(Path(entry).resolve()) for entry in sys.path if entry}
    # Those of this process's own PYTHONPATH are on sys.path already.
    directories = [d for d in (str(Path(p).resolve()) for p in pythonpath.split(os.pathsep) if p) if d not in on_path]
    if not directories:
        yield
        return
    path, imported = list(sys.path), set(sys.modules)
    sys.path[:0] = directories  # a new process puts them first too (after the script's directory)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - imported:
            file = getattr(sys.modules[name], "__file__", None)
            if file and any(Path(file).resolve().is_relative_to(d) for d in directories):
                del sys.modules[name]
        for directory in directories:
            sys.path_importer_cache.pop(directory, None)
        importlib.invalidate_caches()


@contextlib.contextmanager
def _fresh_replaysafe() -> Iterator[None]:
    """replaysafe's process-wide state as a fresh import has it, for the block, with the environment of the call
    (``REPLAYSAFE_DISABLED`` read again, the machine's clocks, no default ledger), and as the test's environment
    has it after.

    ``replaysafe.testing.reset()`` does both, as the suite's autouse fixture does between tests, so a test must
    not hold a default ledger or a stepped clock across a call: refused rather than undone behind its back.
    """
    if _config.explicit_default_ledger() is not None or _drivers._clocks is not MACHINE:
        raise RuntimeError("cli() resets replaysafe's process-wide state: set the default ledger or clock after it")
    replaysafe.testing.reset()
    try:
        yield
    finally:
        replaysafe.testing.reset()


@contextlib.contextmanager
def _default_warnings() -> Iterator[None]:
    """Python's default warning filters (the suite makes every warning an error; a new process does not):
    a warning is printed to the command's stderr, or ignored, as it would be there."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        yield


@contextlib.contextmanager
def _streams(stdin: io.StringIO, stdout: io.StringIO, stderr: io.StringIO) -> Iterator[None]:
    before = sys.stdin
    sys.stdin = stdin
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            yield
    finally:
        sys.stdin = before
