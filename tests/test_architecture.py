"""The house rules of docs/architecture.md, checked on the source: who may import whom."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "replaysafe"
#: The protocol and what drives it: the ledger package never reaches them.
PROTOCOL = {"_core", "_drivers", "_operations", "_calls", "_streaming", "_decorator"}
FRAMEWORKS = {
    "langgraph",
    "langchain",
    "langchain_core",
    "pydantic_ai",
    "agents",
    "openai",
    "anthropic",
    "fastmcp",
    "mcp",
}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, relative ones resolved inside the package."""
    found: set[str] = set()
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = (
                    list(parts[: -node.level])
                    if path.name != "__init__.py"
                    else list(parts[: len(parts) - node.level + 1])
                )
                module = ".".join([*base, *([node.module] if node.module else [])])
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names)
            elif node.module:
                found.add(node.module)
    return found


def test_the_ledger_package_never_imports_the_protocol() -> None:
    for path in sorted((PACKAGE / "ledgers").glob("*.py")):
        reached = {name for name in _imports(path) if name.split(".")[:2] in [["replaysafe", m] for m in PROTOCOL]}
        assert not reached, f"{path.name} imports {sorted(reached)}: ledgers only store"


def test_the_ledger_package_reads_no_owner_identity() -> None:
    """Who claims (a probe's owner token, like a call's) is handed in by the drivers, never read by a ledger."""
    for path in sorted((PACKAGE / "ledgers").glob("*.py")):
        assert "replaysafe._owners" not in _imports(path), f"{path.name} imports replaysafe._owners"


def test_the_core_imports_no_ledger_and_does_no_io() -> None:
    imported = _imports(PACKAGE / "_core.py")
    forbidden = {"socket", "sqlite3", "os", "time", "subprocess", "threading", "asyncio", "redis", "psycopg"}
    assert not {name for name in imported if name.startswith("replaysafe.ledgers")}
    assert not imported & forbidden, f"_core imports {sorted(imported & forbidden)}"


def test_replaysafe_imports_no_agent_framework() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        roots = {name.split(".")[0] for name in _imports(path)}
        assert not roots & FRAMEWORKS, f"{path.relative_to(PACKAGE.parent)} imports {sorted(roots & FRAMEWORKS)}"
