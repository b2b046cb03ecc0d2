"""Every supported Python: the core and ledger suites, one session per version (``nox -s tests-3.10``).

The whole suite (adapters, docs, packaging) runs on the default Python through the README's test
command; ``.ci/run`` runs these sessions for the other versions. Each needs PostgreSQL and Redis,
as the suite does.
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

nox.options.default_venv_backend = "venv"
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


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The library's own suite (core and ledgers) on one Python; arguments replace pytest's default ones."""
    # langchain-core: the codec's property tests also round-trip LangChain messages (1.8+ needs Python 3.11).
    session.install("-e", ".[postgres,redis,otel,test]", "langchain-core>=1,<2")
    ignored = [f"--ignore={path}" for path in NEEDS_WHOLE_ENVIRONMENT]
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *(session.posargs or ["tests", *ignored]))
