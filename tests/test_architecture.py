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


def _module_graph() -> dict[str, set[str]]:
    """Each module of the package and the modules of the package it imports (lazy and type-checking imports too)."""
    names = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        reached = set()
        for imported in _imports(path):
            parts = imported.split(".")
            for end in range(len(parts), 0, -1):  # the longest prefix that is a module of the package
                candidate = ".".join(parts[:end])
                if candidate in names:
                    if candidate != name:
                        reached.add(candidate)
                    break
        graph[name] = reached
    return graph


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_circle_inside_the_package() -> None:
    """A module never reaches itself through the modules it imports, lazily or not: shared names live in the
    lower module (``UNSET`` in ``_constants``, the request keys in ``_request_keys``)."""
    assert _circles(_module_graph()) == []


def test_the_circle_check_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _circles(graph) == [["a", "b", "c"]]
