"""Section 9: what each framework adapter adds to a tool call, against the same framework without it.

For every adapter, in that adapter's environment, as a subprocess (``benchmarks/adapters_child.py``): the
framework's agent on the adapter's scripted model, making ``adapter_calls`` calls of a trivial tool per run,
in paired rounds of the framework alone, the framework with the adapter on a memory ledger and on
PostgreSQL, and the core's own overhead on the same ledgers in the same process (a plain function against
the same function under ``@replay_safe`` + ``tool_call(...)``). Per adapter and ledger: the time the adapter
adds per call (with it minus without, per round) and that over the core's overhead in the same round (issue
31's goal: at most 1.2x).

LlamaIndex (and the older LangGraph, Pydantic AI and OpenAI Agents SDK adapters) share the main
environment (this interpreter); Google ADK, CrewAI, Strands Agents and 10xGraph have their own
(``integrations/isolated.toml``; ``integrations/run-isolated NAME`` builds ``integrations/NAME/.venvXY``).
This section never builds one: without it, or without a PostgreSQL driver there, that adapter (or ledger)
is reported "not measured" and the run goes on.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._child import run_child
from ._env import Scratch, libpq_url
from ._stats import differences, excess_ratios, micros, summary
from .adapters_child import FRAMEWORKS
from .settings import Settings

ROOT = Path(__file__).resolve().parent.parent
INTEGRATIONS = ROOT / "integrations"
#: Adapter -> (its name in the report, its environment's interpreter: None for this one, the main environment).
#: Issue 31's four first, then the older adapters that run an agent of a framework (see the README).
ADAPTERS: dict[str, tuple[str, Path | None]] = {
    "llamaindex": ("LlamaIndex", None),
    "adk": ("Google ADK", INTEGRATIONS / "adk" / ".venv311" / "bin" / "python"),
    "crewai": ("CrewAI", INTEGRATIONS / "crewai" / ".venv311" / "bin" / "python"),
    "strands": ("Strands Agents", INTEGRATIONS / "strands" / ".venv311" / "bin" / "python"),
    "langgraph": ("LangGraph", None),
    "pydantic_ai": ("Pydantic AI", None),
    "openai_agents": ("OpenAI Agents SDK", None),
    "tenxgraph": ("10xGraph", INTEGRATIONS / "tenxgraph" / ".venv312" / "bin" / "python"),
}
LEDGERS = ("memory", "postgres")
#: The one adapter a ``--quick`` run measures (importing each framework takes seconds).
QUICK = "llamaindex"
TIMEOUT_S = 900


def interpreter(adapter: str) -> tuple[Path | None, str]:
    """The Python to measure ``adapter`` in, or why there is none (this section never builds an environment)."""
    _, python = ADAPTERS[adapter]
    if python is None:
        python = Path(sys.executable)
    elif not python.is_file():
        where = python.parent.parent.relative_to(ROOT)
        return None, f"not measured: no environment {where} (integrations/run-isolated {adapter} builds it)"
    distribution = FRAMEWORKS[adapter][2]  # read from metadata: importing a framework takes seconds
    probe = f"import importlib.metadata as m; m.version({distribution!r})"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, cwd=ROOT, check=False, timeout=120)
    if done.returncode != 0:
        return None, f"not measured: {distribution} is not installed in {python}"
    return python, ""


def run(settings: Settings, scratch: Scratch, log: Callable[[str], None]) -> dict[str, Any]:
    """Per adapter: the framework alone, with the adapter, and the core's overhead, per ledger."""
    section: dict[str, Any] = {
        "rounds": settings.adapter_rounds,
        "calls_per_run": settings.adapter_calls,
        "ledgers": list(LEDGERS),
    }
    for adapter in ADAPTERS:
        if settings.quick and adapter != QUICK:  # a smoke run: one adapter shows the section works
            section[adapter] = {"skipped": f"not measured: --quick measures {ADAPTERS[QUICK][0]} alone"}
            continue
        log(f"adapters: {adapter}")
        section[adapter] = measure(adapter, settings, scratch, log)
    return section


def measure(adapter: str, settings: Settings, scratch: Scratch, log: Callable[[str], None]) -> dict[str, Any]:
    python, why = interpreter(adapter)
    if python is None:
        log(f"adapters: {adapter}: {why}")
        return {"skipped": why}
    schema = f"{scratch.schema}_ad_{adapter}"
    spec = {
        "adapter": adapter,
        "calls": settings.adapter_calls,
        "rounds": settings.adapter_rounds,
        "warmup": settings.warmup,
        "ledger_url": scratch.postgres_url,
        "dsn": libpq_url(scratch.postgres_url) if scratch.postgres_url else None,
        "schema": schema,
    }
    measured, why = run_child(
        python, "adapters_child", spec, scratch, schema,
        what="the measurement", log=lambda message: log(f"adapters: {adapter}: {message}"), timeout_s=TIMEOUT_S,
    )  # fmt: skip
    if measured is None:
        return {"skipped": why}
    return summarize(measured)


def summarize(measured: dict[str, Any]) -> dict[str, Any]:
    """The child's per-round seconds per call as medians, and per ledger the adapter's added time and ratio."""
    per_call: dict[str, list[float]] = measured["per_call_s"]
    result: dict[str, Any] = {
        "framework": measured["framework"],
        "adapter_version": measured["adapter_version"],
        "python": measured["python"],
        "replaysafe_path": measured["replaysafe_path"],
        "framework_us": micros(per_call["framework"]),
        "bare_call_us": micros(per_call["core.bare"]),
    }
    for ledger in LEDGERS:
        if f"adapter.{ledger}" not in per_call:
            result[ledger] = {"skipped": measured["skipped"].get(ledger, "not measured")}
            continue
        added = differences(per_call, f"adapter.{ledger}", "framework")
        core = differences(per_call, f"core.{ledger}", "core.bare")
        result[ledger] = {
            "with_adapter_us": micros(per_call[f"adapter.{ledger}"]),
            "added_us": micros(added),
            "core_us": micros(per_call[f"core.{ledger}"]),
            "core_overhead_us": micros(core),
            "ratio": summary(excess_ratios(added, core)),
        }
    return result
