"""The distributions install as users get them: every sdist and wheel built, installed into a fresh environment.

``python -m build`` makes each project's sdist and then its wheel from that sdist (so the sdist is complete
enough to build from). The wheels of the library and of every adapter that can share an environment go into a
new virtual environment of Python 3.12: this project's distributions from the built files alone (never from an
index), their dependencies from the configured index. (Each adapter of integrations/isolated.toml is installed
from its wheel into an environment of its own, by integrations/run-isolated, which runs its tests there.)
Then each package imports there and the ``replaysafe`` command runs. A second test runs the README's first
command, word for word, in a copy of the sources made from the library's sdist: a fresh checkout, as a new user
has it.
"""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
from uv import find_uv_bin

from .test_docs_code import ROOT, SHELL, assert_ran, blocks_of, run_bash

# Building seven projects and installing every adapter's framework takes minutes, more on a loaded machine.
# One worker runs them all under pytest-xdist, so the distributions are built once per run.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600), pytest.mark.xdist_group("packaging")]

PROJECTS = [ROOT, *sorted(path.parent for path in ROOT.glob("integrations/*/pyproject.toml"))]
#: Adapters whose framework cannot share an environment with the others: integrations/run-isolated installs
#: each from its built wheel into an environment of its own, beside its framework, and runs `pip check` there.
ISOLATED = set(tomllib.loads((ROOT / "integrations" / "isolated.toml").read_text(encoding="utf-8")))
SHARED = [project for project in PROJECTS if project.name not in ISOLATED]
#: Extras that are tooling for working on a project, not features a user installs.
TOOLING_EXTRAS = {"test", "lint", "dev", "bench", "docs", "release"}


def project_meta(project: Path) -> dict[str, object]:
    meta: dict[str, object] = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return meta


def python312() -> str:
    """Python 3.12: pyenv's newest, else a python3.12 on PATH (as integrations/run-isolated finds it)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = sorted(root.glob("3.12*/bin/python3.12"), key=lambda p: [int(x) for x in p.parts[-3].split(".")])
    found = str(candidates[-1]) if candidates else shutil.which("python3.12")
    assert found, "no Python 3.12 (pyenv or python3.12 on PATH): the packaging test installs every adapter under it"
    return found


def run(*command: str, cwd: Path | None = None, timeout: float = 900) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, (
        f"{' '.join(command)} failed (exit {result.returncode})\n--- stdout\n{result.stdout[-6000:]}\n"
        f"--- stderr\n{result.stderr[-6000:]}"
    )
    return result.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every project's sdist and wheel, built with ``python -m build`` (the wheel from the sdist)."""
    out = tmp_path_factory.mktemp("dist")
    for project in PROJECTS:
        run(sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(project))
    return out


def wheels(dist: Path) -> Iterator[tuple[Path, dict[str, str | list[str]]]]:
    for wheel in sorted(dist.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            message = email.parser.Parser().parsestr(archive.read(name).decode())
            names = archive.namelist()
            tops = sorted({n.split("/")[0] for n in names if n.count("/") == 1 and n.endswith("/__init__.py")})
            modules = sorted(n for n in names if "/" not in n and n.endswith(".py"))
        requires = message.get_all("Requires-Dist") or []
        yield wheel, {"name": message["Name"], "requires": requires, "packages": tops, "modules": modules}


def test_every_project_builds_an_sdist_and_a_wheel_under_its_distribution_name(dist: Path) -> None:
    names = {str(project_meta(project)["name"]) for project in PROJECTS}
    assert "replaysafe-tools" in names
    assert all(name.startswith("replaysafe-") for name in names), names
    built = {str(meta["name"]): meta for _, meta in wheels(dist)}
    assert set(built) == names
    sdists = sorted(path.name for path in dist.glob("*.tar.gz"))
    assert len(sdists) == len(names), sdists
    for name, meta in built.items():
        # One top-level import package per distribution, and no loose top-level module beside it.
        assert len(meta["packages"]) == 1, f"{name}'s wheel holds the import packages {meta['packages']}, not one"
        assert not meta["modules"], f"{name}'s wheel holds top-level modules {meta['modules']}"
        if name != "replaysafe-tools":  # each adapter depends on the library by its distribution name
            assert any(str(r).startswith("replaysafe-tools") for r in meta["requires"]), (name, meta["requires"])
        assert not any(str(r).split("[")[0].strip() == "replaysafe" for r in meta["requires"]), (name, meta)
    with tarfile.open(next(dist.glob("replaysafe_tools-*.tar.gz"))) as sdist:
        members = {member.split("/", 1)[-1] for member in sdist.getnames()}
    assert {"pyproject.toml", "README.md", "replaysafe/__init__.py", "replaysafe/py.typed"} <= members


def test_every_isolated_adapter_is_a_project_with_its_reason() -> None:
    names = {project.name for project in PROJECTS}
    table = tomllib.loads((ROOT / "integrations" / "isolated.toml").read_text(encoding="utf-8"))
    assert set(table) <= names, f"integrations/isolated.toml names no adapter: {set(table) - names}"
    assert all(entry["python"] and entry["why"] for entry in table.values()), table


def test_the_wheels_install_into_a_fresh_environment_and_import(dist: Path, tmp_path: Path) -> None:
    """Every project but the isolated adapters, together (those: integrations/run-isolated)."""
    venv = tmp_path / "venv"
    run(python312(), "-m", "venv", str(venv))
    requirements = []
    for project in SHARED:
        meta = project_meta(project)
        extras = sorted(set(meta.get("optional-dependencies", {})) - TOOLING_EXTRAS)  # type: ignore[call-overload]
        with_extras = f"{meta['name']}[{','.join(extras)}]" if extras else str(meta["name"])
        requirements.append(f"{with_extras}=={meta['version']}")
    # uv installs what pip would, in seconds where pip takes minutes; `pip check` below is pip's own.
    install = [
        find_uv_bin(),
        "pip",
        "install",
        "-q",
        "--python",
        str(venv / "bin" / "python"),
        "--find-links",
        str(dist),
    ]
    run(*install, "--no-index", "--no-deps", *requirements)  # ours from the built files only, never an index
    run(*install, *requirements, timeout=1800)  # then their dependencies, from the index
    run(str(venv / "bin" / "python"), "-m", "pip", "check")
    shared = {str(project_meta(project)["name"]) for project in SHARED}
    packages = sorted({str(p) for _, meta in wheels(dist) if meta["name"] in shared for p in meta["packages"]})
    expected = {"replaysafe", "replaysafe_langgraph", "replaysafe_mcp", "replaysafe_sdk_loops"}
    assert expected <= set(packages)
    # A package whose __init__ imports nothing of its own: its modules, each with the SDK it wraps.
    packages += ["replaysafe_sdk_loops.openai", "replaysafe_sdk_loops.anthropic"]
    imported = run(
        str(venv / "bin" / "python"),
        "-c",
        "import importlib, sys\nfor name in sys.argv[1:]: print(importlib.import_module(name).__file__)",
        *packages,
        cwd=tmp_path,
    )
    assert all(str(venv) in line for line in imported.splitlines()), imported  # not this checkout's sources
    assert "usage: replaysafe" in run(str(venv / "bin" / "replaysafe"), "--help", cwd=tmp_path)
    assert "refund" in run(str(venv / "bin" / "replaysafe"), "demo", cwd=tmp_path).lower()


def test_the_readme_first_command_installs_and_runs_the_demo_from_a_fresh_copy(dist: Path, tmp_path: Path) -> None:
    """The README's first command, word for word, in the library's sources as its sdist holds them."""
    first = next(block for block in blocks_of(ROOT / "README.md") if block.language in SHELL)
    assert first.code.strip().count("\n") == 0, "the README's first command is one line"
    assert "replaysafe demo" in first.code
    with tarfile.open(next(dist.glob("replaysafe_tools-*.tar.gz"))) as sdist:
        sdist.extractall(tmp_path, filter="data")
    (checkout,) = tmp_path.iterdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REPLAYSAFE_", "VIRTUAL_ENV"))}
    result = run_bash(first.code, checkout, env, timeout=1800)
    assert_ran(result, "README.md's first command")
    assert "refund" in result.stdout.lower()
