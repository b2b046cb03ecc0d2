"""The documentation site builds without a warning: ``mkdocs build --strict`` (guides, adapter pages, API reference).

The site is built once per run (a fixture of this module; its tests share one xdist worker) and then checked:
every page is there, and every link of every built page that stays inside the site leads to a file of the
site (and an anchor to an id of the page it names).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from .test_docs_code import ROOT, blocks_of, install_lines

pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("docs_site")]

#: The build the test runs, and the one the README and docs/index.md tell a contributor to run.
BUILD = "mkdocs build --strict"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once: ``mkdocs build --strict`` into a temporary directory."""
    site = tmp_path_factory.mktemp("docs") / "site"
    result = subprocess.run(
        [sys.executable, "-m", *shlex.split(BUILD), "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=800,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return site


def test_the_site_builds_strictly_with_every_guide_adapter_and_the_api_reference(site: Path) -> None:
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


class Page(HTMLParser):
    """The links (``href``, ``src``) of an HTML page and the ids it holds."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in {"id", "name"}:
                self.ids.add(value)
            elif name in {"href", "src"}:
                self.links.append(value)


def broken_links(site: Path) -> list[str]:
    """Every link of the site's pages that stays in the site and leads nowhere: ``page: link (why)``.

    A link with a scheme or a host leaves the site and is not followed. A path is resolved against the page's
    directory (one starting with ``/`` against the site's root, where the site is served); a directory
    stands for its ``index.html``; an anchor must be an id of the page it names.
    """
    pages = {path: Page(path.read_text(encoding="utf-8")) for path in sorted(site.rglob("*.html"))}
    broken: list[str] = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc:
                continue
            target = path
            if parts.path:
                base = site if parts.path.startswith("/") else path.parent
                target = (base / unquote(parts.path).lstrip("/")).resolve()
                if target.is_dir():
                    target = target / "index.html"
                if not target.is_file() or not target.is_relative_to(site.resolve()):
                    broken.append(f"{path.relative_to(site)}: {link} (no such file in the site)")
                    continue
            fragment = unquote(parts.fragment)
            if fragment and target in pages and fragment not in pages[target].ids:
                broken.append(f"{path.relative_to(site)}: {link} (no id {fragment!r} in {target.relative_to(site)})")
    return broken


def test_every_link_within_the_site_leads_to_a_page_of_the_site(site: Path) -> None:
    assert len(list(site.rglob("*.html"))) > 10, "the site's pages were not found"
    broken = broken_links(site)
    assert not broken, "links that lead nowhere in the built site:\n" + "\n".join(broken)


def test_the_link_check_has_teeth(tmp_path: Path) -> None:
    (tmp_path / "guide").mkdir()
    (tmp_path / "index.html").write_text('<a href="guide/#top">g</a><a href="https://example.org/x">x</a>')
    (tmp_path / "guide" / "index.html").write_text('<h1 id="top">G</h1><a href="../">home</a><a href="/#">r</a>')
    assert broken_links(tmp_path) == []
    (tmp_path / "guide" / "index.html").write_text(
        '<h1 id="top">G</h1><a href="../../README.md">up</a><a href="../index.html#no">a</a><a href="/missing/">m</a>'
    )
    assert broken_links(tmp_path) == [
        "guide/index.html: ../../README.md (no such file in the site)",
        "guide/index.html: ../index.html#no (no id 'no' in index.html)",
        "guide/index.html: /missing/ (no such file in the site)",
    ]


@pytest.mark.parametrize("document", ["README.md", "docs/index.md"])
def test_the_docs_say_how_to_install_build_and_serve_the_site(document: str) -> None:
    """The install of the ``docs`` extra, the build this test runs, and ``mkdocs serve``, in a code block."""
    path = ROOT / document
    commands = "\n".join(block.code for block in blocks_of(path))
    assert any(re.search(r"\.\[docs\]", line) for _, line in install_lines(path)), f"{document}: no `.[docs]` install"
    assert BUILD in commands, f"{document} does not show `{BUILD}`, the build tests/test_docs_site.py runs"
    assert "mkdocs serve" in commands, f"{document} does not show `mkdocs serve`"
