"""The README's example runs, twice in one directory, with only what its first install line installs.

tests/test_docs_code.py runs every adapter's README example so, in the main environment; CrewAI cannot share that
one (it needs openai<3, the OpenAI SDK adapters' tests openai 3), so its example runs here, in the adapter's own
environment, with the same machinery (as the 10xGraph adapter's does).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "integrations" / "crewai" / "README.md"


def docs_code() -> ModuleType:
    """The library's docs test module, tests/test_docs_code.py, loaded from its file."""
    spec = importlib.util.spec_from_file_location("replaysafe_docs_code", ROOT / "tests" / "test_docs_code.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_readme_example_runs_twice_with_only_what_its_first_install_line_installs(tmp_path: Path) -> None:
    docs_code().run_isolated_readme(README, tmp_path)
