"""The documentation site builds without a warning: ``mkdocs build --strict`` (guides, adapter pages, API reference)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(900)


def test_the_site_builds_strictly_with_every_guide_adapter_and_the_api_reference(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=800,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for guide in sorted((ROOT / "docs").glob("*.md")):
        page = "index.html" if guide.stem == "index" else f"{guide.stem}/index.html"
        assert (site / page).is_file(), f"docs/{guide.name} is not a page of the site"
    for readme in sorted(ROOT.glob("integrations/*/README.md")):
        page = (site / "integrations" / readme.parent.name / "index.html").read_text(encoding="utf-8")
        title = readme.read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
        assert f">{title}<" in page, f"{readme} is not included in its page"
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    for name in ("replay_safe", "tool_call", "SqliteLedger", "CallInDoubtError"):
        assert f'id="replaysafe.{name}"' in reference, f"the API reference lacks {name}"
    # A block marked notest for the code-fence runner is still rendered as code.
    assert 'class="highlight"' in (site / "operations" / "index.html").read_text(encoding="utf-8")
