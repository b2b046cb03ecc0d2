"""Every supported Python: a fast slice in CI (``nox -s tests-3.12``), the whole suite for a release (``nox -s full``).

The whole suite (adapters, docs, packaging, every ledger) runs on the default Python through the README's
test command. On the other Pythons, CI runs the slice that depends on the interpreter: the protocol, the
codec, identity and keys, the drivers and the decorator, and the memory and SQLite ledgers. ``nox -s full``
runs the core and ledger suites, every server ledger included, on every version (PostgreSQL and Redis
needed, as for the suite).
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]

#: Test files that need more than the library and its test extra: every adapter installed (the docs' code,
#: the packages built and installed), the docs tools (the site), the type checkers or the benchmark extra.
NEEDS_WHOLE_ENVIRONMENT = [
    "tests/test_docs_code.py",
    "tests/test_docs_site.py",
    "tests/test_packaging.py",
    "tests/test_typing.py",
    "tests/test_benchmarks_smoke.py",
]

#: The slice CI runs on every other Python: what the interpreter's own behaviour can change (hashing,
#: JSON, dataclasses, typing, asyncio, threads, signals), on the ledgers that live in the process or a file.
INTERPRETER_SLICE = [
    "tests/test_core.py",
    "tests/test_codec.py",
    "tests/test_codec_properties.py",
    "tests/test_identity.py",
    "tests/test_keys.py",
    "tests/test_decorator.py",
    "tests/test_semantics.py",
    "tests/test_steps.py",
    "tests/test_signing.py",
    "tests/test_streaming.py",
    "tests/ledgers/test_contract.py",
    "tests/ledgers/test_sqlite.py",
]
#: Within the slice, the parametrisations on a server ledger are left to the default Python's full run.
NO_SERVER_LEDGERS = "not postgres and not redis"

nox.options.default_venv_backend = "uv|venv"  # uv makes the environment and installs in seconds
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["tests"]


def _pyenv_interpreters_on_path() -> None:
    """Put pyenv's installed versions on PATH, where nox looks for ``python3.X``.

    pyenv's shims only answer for the versions selected globally; the interpreters themselves live
    in ``$(pyenv root)/versions/<version>/bin``.
    """
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    bins = [str(path.parent) for path in sorted(root.glob("3.*/bin/python3.*")) if path.name.count(".") == 1]
    os.environ["PATH"] = os.pathsep.join([*dict.fromkeys(bins), os.environ.get("PATH", "")])


_pyenv_interpreters_on_path()


def _install(session: nox.Session) -> None:
    # langchain-core: the codec's property tests also round-trip LangChain messages (1.8+ needs Python 3.11).
    session.install("-e", ".[postgres,redis,otel,test]", "langchain-core>=1,<2")


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The interpreter slice on one Python (CI's run on the other Pythons); arguments replace pytest's default ones."""
    _install(session)
    default = [*INTERPRETER_SLICE, "-k", NO_SERVER_LEDGERS]
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *(session.posargs or default))


@nox.session(python=PYTHONS)
def full(session: nox.Session) -> None:
    """The library's whole core and ledger suite on one Python, every ledger (a release's check)."""
    _install(session)
    ignored = [f"--ignore={path}" for path in NEEDS_WHOLE_ENVIRONMENT]
    default = ["-n", "auto", "tests", *ignored]
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *(session.posargs or default))
