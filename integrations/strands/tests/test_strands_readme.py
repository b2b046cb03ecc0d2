"""The README's example runs as written, twice in one fresh directory, with only what its first install line
installs: the machinery of the library's docs test (tests/test_docs_code.py), run here in this adapter's own
environment. strands-agents 1.62 needs mcp<2.2 and the MCP adapter mcp>=2.3, so the library's environment
cannot hold it; the README marks the block ``notest`` for the library's docs test, as the 10xGraph one does."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "integrations" / "strands" / "README.md"


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
    assert (tmp_path / "ledger.db").exists()
    assert len(list((tmp_path / "sessions").iterdir())) == 2  # two runs, two conversations
