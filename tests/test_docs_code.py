"""Every code block of the docs runs: README.md, SECURITY.md, docs/**/*.md and the adapters' READMEs.

A block's info string says what happens to it:

- ``python``: runs as a program of its own, in a fresh interpreter and an empty directory (the adapters'
  READMEs included: their examples run on each framework's own offline test model).
- ``python continuation``: runs after the previous ``python`` block of the same file, in the same program
  (for a guide that builds one example over several blocks).
- ``sh`` / ``bash`` / ``console``: runs in ``bash -eu``, in an empty directory, with this environment's
  ``bin`` first on PATH (so ``replaysafe`` is the CLI of this checkout).
- ``<language> notest``: shown, not run (a signature, an output sample, a fragment, a command that takes
  longer than a test may). Any language other than the ones above must say ``notest``. The 10xGraph
  adapter's example says ``notest`` here because 10xGraph needs Python 3.12: its own suite runs it
  (``integrations/tenxgraph/run-tests``).

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

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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
#: it runs without the prelude.
DRIVER = """\
import sys
prelude, path, name = sys.argv[1:4]
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


def assert_ran(result: subprocess.CompletedProcess[str], where: str) -> None:
    assert result.returncode == 0, (
        f"the code block at {where} failed (exit {result.returncode}); mark it `notest` only if it is not meant "
        f"to run\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )


@pytest.mark.parametrize("program", PROGRAMS, ids=[program[0].where for program in PROGRAMS])
def test_python_block_runs(program: list[Block], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    lines: list[str] = []
    for block in program:  # each block at its own line numbers, so tracebacks point into the document
        lines.extend([""] * (block.line - 1 - len(lines)))
        lines.extend(block.code.splitlines())
    source = tmp_path / "block.py"
    source.write_text(with_test_servers("\n".join(lines) + "\n", request), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, PRELUDE, str(source), str(program[0].path.relative_to(ROOT))],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert_ran(result, program[0].where)


def run_bash(code: str, cwd: Path, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Shell code as a docs block is run: ``bash -euo pipefail``, its output captured."""
    command = ["bash", "-euo", "pipefail", "-c", code]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=[block.where for block in SHELL_BLOCKS])
def test_shell_block_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    assert_ran(run_bash(with_test_servers(block.code, request), tmp_path, environment()), block.where)


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


def projects() -> dict[Path, Project]:
    found: dict[Path, Project] = {}
    for pyproject in [ROOT / "pyproject.toml", *ROOT.glob("integrations/*/pyproject.toml")]:
        meta = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        extras = frozenset(meta.get("optional-dependencies", {}))
        found[pyproject.parent] = Project(pyproject.parent, canonicalize_name(meta["name"]), extras)
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


def install_problems(line: str) -> list[str]:
    """What is wrong with one ``pip install`` command, as run from the checkout's root."""
    words = shlex.split(line, comments=True)
    start = next(i for i, word in enumerate(words) if word == "install" and i and words[i - 1].endswith("pip"))
    problems: list[str] = []
    local: list[Project] = []
    arguments = iter(words[start + 1 :])
    for word in arguments:
        if word in {"&&", ";", "|", "||"}:
            break
        if word in {"-r", "--requirement", "-c", "--constraint"}:
            if not (ROOT / next(arguments)).is_file():
                problems.append(f"no such file after {word}")
            continue
        if word in {"-e", "--editable"}:
            word = next(arguments)
        elif word.startswith("-"):
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
