"""The README's examples run, as far as they go offline, with only what their install lines install.

tests/test_docs_code.py runs every other adapter's README example so (twice, in one fresh directory); 10xGraph
needs Python 3.12, so these run here, with the same machinery. The first example builds its ledger, checkpointer
and agent when it runs and reaches PostgreSQL, Redis and the model only in ``turn``, which it does not call:
what runs is everything it imports and builds (``PgCheckpointer`` refuses to be built without asyncpg and redis,
the agent without the OpenAI client), with only what the README's first install line installs. The second, the
crash test on the scripted model and ``SqliteCheckpointer``, runs whole, with only what its own line installs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "integrations" / "tenxgraph" / "README.md"


def docs_code() -> ModuleType:
    """The library's docs test module, tests/test_docs_code.py, loaded from its file."""
    spec = importlib.util.spec_from_file_location("replaysafe_docs_code", ROOT / "tests" / "test_docs_code.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_readme_example_builds_with_only_what_its_first_install_line_installs(tmp_path: Path) -> None:
    docs = docs_code()
    example, _ = [block for block in docs.blocks_of(README) if block.language in docs.PYTHON]
    line = docs.first_install_line(README)
    env = {**docs.environment(), "OPENAI_API_KEY": "sk-offline"}  # the client is built, never called
    for run in docs.RUNS:
        result = docs.run_python(
            docs.program_code([example]), README, tmp_path, setup=docs.only_installed_by(line), env=env
        )
        docs.assert_ran(result, f"{example.where} ({run}, with only what `{line.strip()}` installs)")


def test_the_crash_test_example_holds_with_only_what_its_install_line_installs(tmp_path: Path) -> None:
    docs = docs_code()
    _, example = [block for block in docs.blocks_of(README) if block.language in docs.PYTHON]
    line = next(line for _, line in docs.install_lines(README) if "[sqlite_checkpoint]" in line)
    for run in docs.RUNS:
        result = docs.run_python(docs.program_code([example]), README, tmp_path, setup=docs.only_installed_by(line))
        docs.assert_ran(result, f"{example.where} ({run}, with only what `{line.strip()}` installs)")
        assert "1 held, 0 broke the promise" in result.stdout, result.stdout
