"""benchmarks/README.md stays a reference, and every link of the benchmark's docs leads somewhere.

The README says what is measured and how, the latest results, what they mean and how to run it; each kept
run's write-up lives beside its report in ``benchmarks/results/`` (``<run>-notes.md``), and what spans runs
in ``benchmarks/results/history.md``. So: the README stays under ``MAX_LINES`` lines, it links every
write-up, and every relative link of ``benchmarks/**/*.md`` (the README, the write-ups, the generated
reports) names a file that exists, and an anchor a heading of the Markdown file it names.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
README = BENCHMARKS / "README.md"
RESULTS = BENCHMARKS / "results"

#: Past this, the README is growing back into a diary: a run's story goes to its ``<run>-notes.md``.
MAX_LINES = 250

FENCED = re.compile(r"^(`{3,}|~{3,}).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+).+?\1", re.DOTALL)
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target), ![alt](target)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The text without code: a link shown in a code block or span is not a link."""
    return INLINE_CODE.sub("", FENCED.sub("", text))


def links_of(text: str) -> list[str]:
    """The targets of a Markdown text's inline links and images, outside code."""
    return LINK.findall(_prose(text))


def anchors_of(text: str) -> set[str]:
    """The ids GitHub gives a Markdown text's headings (lowercased, punctuation dropped, spaces as hyphens)."""
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for heading in HEADING.findall(FENCED.sub("", text)):
        plain = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", plain.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def broken_links(document: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of ``document`` that leads nowhere: ``document: link (why)``, named from ``root``."""
    broken = []
    for link in links_of(document.read_text(encoding="utf-8")):
        parts = urlsplit(link)
        if parts.scheme or parts.netloc:
            continue  # leaves the repository: not followed
        target = (document.parent / unquote(parts.path)).resolve() if parts.path else document
        name = document.relative_to(root)
        fragment = unquote(parts.fragment)
        if not target.is_file():
            broken.append(f"{name}: {link} (no such file)")
        elif fragment and target.suffix == ".md" and fragment not in anchors_of(target.read_text(encoding="utf-8")):
            broken.append(f"{name}: {link} (no heading {fragment!r} in {target.name})")
    return broken


def test_the_benchmark_readme_stays_a_reference_under_the_line_limit() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, (
        f"benchmarks/README.md has {len(lines)} lines (at most {MAX_LINES}): a run's write-up belongs in "
        "benchmarks/results/<run>-notes.md, what spans runs in benchmarks/results/history.md"
    )


def test_every_link_of_the_benchmark_docs_leads_to_a_file() -> None:
    documents = sorted(BENCHMARKS.rglob("*.md"))
    assert README in documents and len(documents) > 2, documents
    broken = [entry for document in documents for entry in broken_links(document)]
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_the_readme_links_every_write_up_and_the_history() -> None:
    linked = {
        (README.parent / unquote(urlsplit(link).path)).resolve()
        for link in links_of(README.read_text(encoding="utf-8"))
        if not urlsplit(link).scheme
    }
    write_ups = sorted(RESULTS.glob("*-notes.md"))
    assert write_ups, "no write-up found in benchmarks/results/"
    unlinked = [path.name for path in [*write_ups, RESULTS / "history.md"] if path.resolve() not in linked]
    assert not unlinked, f"benchmarks/README.md does not link {unlinked}"


def test_the_link_check_has_teeth(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "run-notes.md").write_text("# Run: write-up\n\n## The run\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# B\n\n[ok](results/run-notes.md#the-run) [top](#b) [web](https://example.org/x) `[code](nowhere.md)`\n"
        "\n```sh\n[block](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(readme, tmp_path) == []
    readme.write_text(
        "# B\n\n[gone](results/gone.md) ![chart](results/gone.png) [anchor](results/run-notes.md#no-such)\n",
        encoding="utf-8",
    )
    assert broken_links(readme, tmp_path) == [
        "README.md: results/gone.md (no such file)",
        "README.md: results/gone.png (no such file)",
        "README.md: results/run-notes.md#no-such (no heading 'no-such' in run-notes.md)",
    ]
