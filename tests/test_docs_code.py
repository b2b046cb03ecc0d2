"""Every code block of the docs runs: README.md, SECURITY.md, docs/**/*.md and the adapters' READMEs.

A block's info string says what happens to it:

- ``python``: runs as a program of its own, in a fresh interpreter and an empty directory (the adapters'
  READMEs included: their examples run on each framework's own offline test model), then once more in the
  same directory, as a reader runs an example a second time: what the first run left there (a ledger file,
  a checkpoint, a fixed message id recorded) must not make the second one fail. An adapter's README runs
  in an interpreter that can import only what the README's first ``pip install`` line installs (the
  distributions that line names, with their extras and dependencies, as this environment's metadata and the
  checkout's pyproject.toml files say): a module of any other distribution is missing there, as it is
  for a reader who ran that line.
- ``python continuation``: runs after the previous ``python`` block of the same file, in the same program
  (for a guide that builds one example over several blocks).
- ``sh`` / ``bash`` / ``console``: runs in ``bash -eu``, in an empty directory, with this environment's
  ``bin`` first on PATH (so ``replaysafe`` is the CLI of this checkout), and a second time there too.
- ``<language> notest``: shown, not run (a signature, an output sample, a fragment, a command that takes
  longer than a test may). Any language other than the ones above must say ``notest``. The example of
  an adapter of ``integrations/isolated.toml`` (10xGraph needs Python 3.12; others' frameworks conflict
  with this environment's) says ``notest`` here: its own suite runs it, with this module's functions,
  under ``integrations/run-isolated`` (e.g. ``integrations/tenxgraph/tests/test_tenxgraph_readme.py``).

Every ``pip install`` line, in any block (``notest`` included) or inline code, is checked against this
checkout: a local path holds a project with the extras named, a ``replaysafe*`` name is one of the
distributions this checkout builds, and an adapter installed from a checkout comes with the library
from the same checkout (tests/test_packaging.py builds and installs them for real).

Names a guide leaves to the reader (``ledger``, ``thread_id``, ``message_id``, ``tool_call_id``,
``order_id``, ...) are defined by ``PRELUDE`` below before a python block runs, and URLs of example
servers (``postgresql://app@db/agents``, ``redis://cache:6379/0``) are replaced by the local test servers,
with a schema or key prefix of the test's own.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tomllib
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent

DOCUMENTS = sorted(
    {
        ROOT / "README.md",
        ROOT / "SECURITY.md",
        *ROOT.glob("docs/**/*.md"),
        *ROOT.glob("integrations/*/README.md"),
    }
)

PYTHON = {"python", "py"}
SHELL = {"sh", "bash", "console", "shell"}
NOTEST = "notest"
CONTINUATION = "continuation"

PRELUDE = """\
from replaysafe import MemoryLedger as _MemoryLedger

ledger = _MemoryLedger()
thread_id, message_id, tool_call_id = "support-thread-42", "msg_7", "call_1"
order_id, refund_number, payment_intent_id = "1042", 2, "pi_1042"


def alert_operator(*details):
    print("operator alerted:", *details)
"""

#: Runs a block: the prelude, then the block's code compiled under the document's name, so that a
#: traceback points at the document's own line numbers. ``__file__`` and ``sys.argv`` are those of
#: ``python block.py``, so a block may start itself as a subprocess (an MCP server over stdio); run so,
#: it runs without the prelude. A fourth argument, when not empty, is code run first: ``only_installed_by``.
DRIVER = """\
import sys
prelude, path, name, setup = sys.argv[1:5]
exec(setup, {"__name__": "replaysafe_docs_setup"})
sys.argv = [path]
namespace = {"__name__": "__main__", "__file__": path}
exec(prelude, namespace)
with open(path, encoding="utf-8") as source:
    exec(compile(source.read(), name, "exec"), namespace)
"""

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")
POSTGRES_URL = re.compile(r"postgres(?:ql)?(?:\+\w+)?://[^\s\"'`]+")
REDIS_URL = re.compile(r"rediss?://[^\s\"'`]+")
INLINE_CODE = re.compile(r"(?<!`)(`+)(?!`)(?P<code>.+?)(?<!`)\1(?!`)")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the line of the block's first line of code (1-based)
    language: str
    flags: frozenset[str]
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks_of(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, their code dedented by the fence's indent."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        index += 1
        if not opening:
            continue
        indent, fence = opening["indent"], opening["fence"]
        words = opening["info"].split()
        body: list[str] = []
        while index < len(lines):
            closing = FENCE.match(lines[index])
            if closing and closing["fence"].startswith(fence) and not closing["info"].strip():
                break
            line = lines[index]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            index += 1
        start = index - len(body) + 1
        index += 1
        found.append(Block(path, start, words[0] if words else "", frozenset(words[1:]), "\n".join(body) + "\n"))
    return found


ALL_BLOCKS = [block for path in DOCUMENTS for block in blocks_of(path)]


def python_programs() -> list[list[Block]]:
    """Each python block not marked notest, with the continuations that follow it in its file."""
    programs: list[list[Block]] = []
    previous: Block | None = None
    for block in ALL_BLOCKS:
        if block.language not in PYTHON:
            continue
        if NOTEST in block.flags:
            pass
        elif CONTINUATION in block.flags and previous and previous.path == block.path and NOTEST not in previous.flags:
            programs[-1].append(block)
        else:
            programs.append([block])
        previous = block
    return programs


PROGRAMS = python_programs()
SHELL_BLOCKS = [b for b in ALL_BLOCKS if b.language in SHELL and NOTEST not in b.flags]


def with_test_servers(code: str, request: pytest.FixtureRequest) -> str:
    """The code with every example server URL replaced by a local test server of this test's own."""
    if POSTGRES_URL.search(code):
        url = str(request.getfixturevalue("postgres_url"))
        code = POSTGRES_URL.sub(lambda _: url, code)
    if REDIS_URL.search(code):
        url = str(request.getfixturevalue("redis_url"))
        code = REDIS_URL.sub(lambda _: url, code)
    return code


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLAYSAFE_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONWARNINGS"] = "error::SyntaxWarning"
    return env


#: Each running block runs twice in one fresh directory: a reader who runs an example again gets the same.
RUNS = ("first run, in an empty directory", "second run, in the directory the first run left")


def assert_ran(result: subprocess.CompletedProcess[str], where: str) -> None:
    assert result.returncode == 0, (
        f"the code block at {where} failed (exit {result.returncode}); mark it `notest` only if it is not meant "
        f"to run\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )


@pytest.mark.parametrize("program", PROGRAMS, ids=[program[0].where for program in PROGRAMS])
def test_python_block_runs(program: list[Block], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    code = with_test_servers(program_code(program), request)
    path, where = program[0].path, program[0].where
    setup, installed = "", ""
    if path in ADAPTER_READMES:
        line = first_install_line(path)
        setup, installed = only_installed_by(line), f", with only what `{line.strip()}` installs"
    for run in RUNS:  # the second in the directory (and the test servers' schema or prefix) the first left
        assert_ran(run_python(code, path, tmp_path, setup=setup), f"{where} ({run}{installed})")


def program_code(program: list[Block]) -> str:
    """The blocks' code, each at its own line numbers, so that tracebacks point into the document."""
    lines: list[str] = []
    for block in program:
        lines.extend([""] * (block.line - 1 - len(lines)))
        lines.extend(block.code.splitlines())
    return "\n".join(lines) + "\n"


def run_python(
    code: str, path: Path, cwd: Path, *, setup: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Python code as a docs block is run: after the prelude (and ``setup``), as ``python block.py`` in ``cwd``."""
    source = cwd / "block.py"
    source.write_text(code, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-c", DRIVER, PRELUDE, str(source), str(path.relative_to(ROOT)), setup],
        cwd=cwd,
        env=env or environment(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def run_bash(code: str, cwd: Path, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Shell code as a docs block is run: ``bash -euo pipefail``, its output captured."""
    command = ["bash", "-euo", "pipefail", "-c", code]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=[block.where for block in SHELL_BLOCKS])
def test_shell_block_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    code = with_test_servers(block.code, request)
    for run in RUNS:
        assert_ran(run_bash(code, tmp_path, environment()), f"{block.where} ({run})")


def test_every_block_runs_or_is_marked() -> None:
    """A block in a language the runner cannot run says ``notest``; a continuation follows a python block."""
    unmarked = [
        f"{b.where} ({b.language or 'no language'})"
        for b in ALL_BLOCKS
        if b.language not in PYTHON | SHELL and NOTEST not in b.flags
    ]
    assert not unmarked, f"code blocks that neither run nor say `notest`: {unmarked}"
    orphans = [program[0].where for program in PROGRAMS if CONTINUATION in program[0].flags]
    assert not orphans, f"continuations that follow no running python block of their file: {orphans}"
    assert len(PROGRAMS) >= 10, "the docs' python blocks were not found"


# --- install lines -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Project:
    directory: Path
    name: str
    extras: frozenset[str]
    meta: dict[str, Any] = field(compare=False, hash=False, repr=False)  # pyproject.toml's [project]
    packages: tuple[Path, ...] = field(compare=False, hash=False, repr=False)  # its import packages' sources


def projects() -> dict[Path, Project]:
    found: dict[Path, Project] = {}
    for pyproject in [ROOT / "pyproject.toml", *ROOT.glob("integrations/*/pyproject.toml")]:
        toml = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        meta = toml["project"]
        extras = frozenset(meta.get("optional-dependencies", {}))
        wheel = toml["tool"]["hatch"]["build"]["targets"]["wheel"]
        packages = tuple(pyproject.parent / package for package in wheel["packages"])
        found[pyproject.parent] = Project(pyproject.parent, canonicalize_name(meta["name"]), extras, meta, packages)
    return found


PROJECTS = projects()
LIBRARY = PROJECTS[ROOT]


def install_lines(path: Path) -> list[tuple[str, str]]:
    """Every ``pip install`` command in a document, with where it is: block lines and inline code."""
    found: list[tuple[str, str]] = []
    for block in blocks_of(path):
        for offset, line in enumerate(block.code.splitlines()):
            if "pip install" in line:
                found.append((f"{block.where.rsplit(':', 1)[0]}:{block.line + offset}", line))
    text = path.read_text(encoding="utf-8")
    in_prose = re.sub(r"^[ \t]*(`{3,}|~{3,}).*?^[ \t]*\1[ \t]*$", "", text, flags=re.M | re.S)
    for match in INLINE_CODE.finditer(in_prose):
        if "pip install" in match["code"]:
            found.append((f"{path.relative_to(ROOT)} (inline)", match["code"]))
    return found


def install_arguments(line: str) -> Iterator[tuple[str, str]]:
    """The arguments of one ``pip install`` command: ``(option, file)`` for ``-r``/``-c``, else ``("", what)``."""
    words = shlex.split(line, comments=True)
    start = next(i for i, word in enumerate(words) if word == "install" and i and words[i - 1].endswith("pip"))
    arguments = iter(words[start + 1 :])
    for word in arguments:
        if word in {"&&", ";", "|", "||"}:
            break
        if word in {"-r", "--requirement", "-c", "--constraint"}:
            yield word, next(arguments)
        elif word in {"-e", "--editable"}:
            yield "", next(arguments)
        elif not word.startswith("-"):
            yield "", word


def install_problems(line: str) -> list[str]:
    """What is wrong with one ``pip install`` command, as run from the checkout's root."""
    problems: list[str] = []
    local: list[Project] = []
    for option, word in install_arguments(line):
        if option:
            if not (ROOT / word).is_file():
                problems.append(f"no such file after {option}")
            continue
        target, _, extras_text = word.partition("[")
        extras = {e.strip() for e in extras_text.rstrip("]").split(",") if e.strip()}
        if target.startswith((".", "/")):
            project = PROJECTS.get((ROOT / target).resolve())
            if project is None:
                problems.append(f"{target!r} is not a project of this checkout")
                continue
            local.append(project)
        else:
            try:
                requirement = Requirement(word)
            except InvalidRequirement:
                problems.append(f"{word!r} is not a requirement")
                continue
            name = canonicalize_name(requirement.name)
            if not name.startswith("replaysafe"):
                continue  # a third-party package
            by_name = {p.name: p for p in PROJECTS.values()}
            if name not in by_name:
                problems.append(f"{requirement.name!r} is not a distribution of this project ({sorted(by_name)})")
                continue
            project, extras = by_name[name], set(requirement.extras)
        if unknown := extras - project.extras:
            problems.append(f"{project.name} has no extra {sorted(unknown)}")
    if local and LIBRARY not in local:
        problems.append("an adapter from a checkout needs the library from the same checkout (`pip install . ./...`)")
    return problems


@pytest.mark.parametrize("path", DOCUMENTS, ids=[str(p.relative_to(ROOT)) for p in DOCUMENTS])
def test_install_lines_name_what_this_checkout_builds(path: Path) -> None:
    problems = [
        f"{where}: {line.strip()!r}: {problem}"
        for where, line in install_lines(path)
        for problem in install_problems(line)
    ]
    assert not problems, "\n".join(problems)


def test_install_line_check_has_teeth() -> None:
    assert install_problems('pip install "replaysafe[postgres]"')  # the other project on the index
    assert install_problems('pip install "replaysafe-tools[postgre]"')
    assert install_problems("pip install ./integrations/langgraph")
    assert install_problems("pip install ./integrations/nowhere")
    assert not install_problems('pip install "replaysafe-tools[postgres]"  # the library')
    assert not install_problems('pip install . "./integrations/mcp[fastmcp]"')
    assert not install_problems("pip install -e . -e './integrations/sdk_loops[test,lint]'")
    assert install_lines(ROOT / "README.md"), "the README's install lines were not found"


# --- what an adapter's README installs ----------------------------------------------------------------

ADAPTER_READMES = sorted(ROOT.glob("integrations/*/README.md"))


def first_install_line(readme: Path) -> str:
    """The first ``pip install`` command of a README's code blocks: the one a reader runs before its example."""
    lines = [line for where, line in install_lines(readme) if not where.endswith("(inline)")]
    assert lines, f"{readme.relative_to(ROOT)} shows no `pip install` command"
    return lines[0]


def requirements_of(name: str, extra: str) -> list[Requirement]:
    """What a distribution needs with one of its extras (``""``: none): a project of this checkout as its
    pyproject.toml says, any other as its metadata in this environment says (nothing: not installed here)."""
    local = {project.name: project for project in PROJECTS.values()}
    if name in local:
        meta = local[name].meta
        optional = {canonicalize_name(key): value for key, value in meta.get("optional-dependencies", {}).items()}
        texts, marker_extra = (optional.get(extra, []) if extra else meta.get("dependencies", [])), ""
    else:
        try:
            texts, marker_extra = importlib.metadata.requires(name) or [], extra
        except importlib.metadata.PackageNotFoundError:
            return []
    requirements = [Requirement(text) for text in texts]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": marker_extra})]


def installed_by(line: str) -> set[str]:
    """The distributions (canonical names) a ``pip install`` command installs, with their dependencies."""
    todo: list[tuple[str, str]] = []
    for option, word in install_arguments(line):
        if option:
            continue
        target, _, extras_text = word.partition("[")
        if target.startswith((".", "/")):
            requirement = Requirement(f"{PROJECTS[(ROOT / target).resolve()].name}[{extras_text.rstrip(']')}]")
        else:
            requirement = Requirement(word)
        todo.extend((canonicalize_name(requirement.name), extra) for extra in ["", *requirement.extras])
    done: set[tuple[str, str]] = set()
    while todo:
        name, extra = todo.pop()
        if (name, canonicalize_name(extra)) in done:
            continue
        done.add((name, canonicalize_name(extra)))
        for requirement in requirements_of(name, canonicalize_name(extra)):
            todo.extend((canonicalize_name(requirement.name), extra) for extra in ["", *requirement.extras])
    return {name for name, _ in done}


#: Run first in a docs block's interpreter (after ``ALLOWED``, the distributions an install line installs,
#: and ``CHECKOUT``, the checkout's import packages with their distributions): the import system's finders
#: then find no module of any other distribution. The standard library and files of no distribution stay.
ONLY_INSTALLED = """\
import importlib.metadata, os, re, sys

OWNERS = {}  # file -> distribution
for dist in importlib.metadata.distributions():
    name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
    for file in dist.files or ():
        OWNERS[os.path.normpath(dist.locate_file(file))] = name


def owner(origin):
    path = os.path.normpath(origin)
    if path in OWNERS:
        return OWNERS[path]
    for package, name in CHECKOUT:  # installed in editable mode: the checkout's own files
        if path == package or path.startswith(package + os.sep):
            return name
    return None


class OnlyInstalled:
    def __init__(self, finders):
        self.finders = finders

    def find_spec(self, fullname, path=None, target=None):
        for finder in self.finders:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                found = owner(spec.origin) if spec.origin and os.path.isabs(spec.origin) else None
                return spec if found is None or found in ALLOWED else None
        return None

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        for finder in self.finders:
            for dist in getattr(finder, "find_distributions", lambda context: ())(context):
                if re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower() in ALLOWED:
                    yield dist

    def invalidate_caches(self):
        for finder in self.finders:
            getattr(finder, "invalidate_caches", lambda: None)()


sys.meta_path[:] = [OnlyInstalled(list(sys.meta_path))]
"""


def only_installed_by(line: str) -> str:
    """Code that leaves an interpreter able to import only what ``line`` installs (``ONLY_INSTALLED``)."""
    checkout = [(str(package), project.name) for project in PROJECTS.values() for package in project.packages]
    return f"ALLOWED = {sorted(installed_by(line))!r}\nCHECKOUT = {checkout!r}\n{ONLY_INSTALLED}"


#: The adapters whose framework is not in this environment (integrations/isolated.toml): each one's own suite
#: runs its README's example, in its own environment (integrations/run-isolated).
ISOLATED_READMES = {
    ROOT / "integrations" / name / "README.md"
    for name in tomllib.loads((ROOT / "integrations" / "isolated.toml").read_text(encoding="utf-8"))
}


def run_isolated_readme(readme: Path, tmp_path: Path) -> None:
    """An isolated adapter's README example (``notest`` here), run by the adapter's own suite in its environment:
    twice in ``tmp_path``, with only what its first install line (the library and the adapter, from this
    checkout) installs."""
    (example,) = [block for block in blocks_of(readme) if block.language in PYTHON]
    line = first_install_line(readme)
    assert line.split("#")[0].split() == ["pip", "install", ".", f"./integrations/{readme.parent.name}"]
    for run in RUNS:
        result = run_python(program_code([example]), readme, tmp_path, setup=only_installed_by(line))
        assert_ran(result, f"{example.where} ({run}, with only what `{line.strip()}` installs)")


def test_every_adapters_example_runs_with_only_what_its_first_install_line_installs() -> None:
    """test_python_block_runs runs each adapter's README so; an isolated adapter's own suite runs its own."""
    run_here = {program[0].path for program in PROGRAMS if program[0].path in ADAPTER_READMES}
    assert run_here | ISOLATED_READMES == set(ADAPTER_READMES)
    assert not run_here & ISOLATED_READMES


def test_only_installed_by_hides_what_the_line_does_not_install(tmp_path: Path) -> None:
    """The adapter and its dependencies import; the SQLite checkpointer, a distribution of its own, does not."""
    bare, with_test = "pip install . ./integrations/langgraph", "pip install . './integrations/langgraph[test]'"
    assert {"replaysafe-tools", "replaysafe-langgraph", "langgraph", "langchain-core"} <= installed_by(bare)
    assert "langgraph-checkpoint-sqlite" not in installed_by(bare)
    assert "langgraph-checkpoint-sqlite" in installed_by(with_test)
    code = "import replaysafe_langgraph, langgraph.checkpoint.memory\nimport langgraph.checkpoint.sqlite\n"
    readme = ROOT / "integrations" / "langgraph" / "README.md"
    hidden = run_python(code, readme, tmp_path, setup=only_installed_by(bare))
    assert hidden.returncode == 1, hidden.stdout + hidden.stderr
    assert "line 2" in hidden.stderr, hidden.stderr  # line 1 imported
    assert "ModuleNotFoundError: No module named 'langgraph.checkpoint.sqlite'" in hidden.stderr, hidden.stderr
    assert_ran(run_python(code, readme, tmp_path, setup=only_installed_by(with_test)), "with langgraph[test]")
