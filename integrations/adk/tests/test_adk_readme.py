"""The README's example runs as written, twice in one fresh directory, with only what its first install line
installs.

tests/test_docs_code.py runs the other adapters' README examples so; google-adk does not fit the repository's
shared test environment (it caps OpenTelemetry below what other adapters need), so the example says ``notest``
there and runs here, in this adapter's own environment, with the same machinery.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "integrations" / "adk" / "README.md"


def docs_code() -> ModuleType:
    """The library's docs test module, tests/test_docs_code.py, loaded from its file."""
    spec = importlib.util.spec_from_file_location("replaysafe_docs_code", ROOT / "tests" / "test_docs_code.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_readme_example_runs_with_only_what_its_first_install_line_installs(tmp_path: Path) -> None:
    docs_code().run_isolated_readme(README, tmp_path)


def test_every_install_line_names_what_this_checkout_builds() -> None:
    docs = docs_code()
    problems = [
        f"{where}: {problem}" for where, line in docs.install_lines(README) for problem in docs.install_problems(line)
    ]
    assert not problems, "\n".join(problems)
