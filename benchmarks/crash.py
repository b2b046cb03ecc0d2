"""``python -m benchmarks.crash``: the adapters' crash matrix, a long run (not CI).

Every conformance scenario (``replaysafe.testing.conformance``), every call at every kill point, on every
adapter's driver and every durable ledger, repeated ``--rounds`` times: each case is one SIGKILL of a
child process and one resume. It counts the SIGKILL scenarios run and the duplicates found where the docs
promise none (a held case that broke), and writes the table to ``--out`` (default
``benchmarks/results/crash-matrix.md``). CI runs each scenario's key case once, on SQLite.

    .venv/bin/python -m benchmarks.crash [--rounds N] [--ledger URL ...] [--driver MODULE:ATTR ...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from collections import Counter
from pathlib import Path

from replaysafe.testing import conformance

ROOT = Path(__file__).resolve().parent.parent
#: Each adapter's conformance driver: the directory that makes it importable, and its ``module:attribute``.
DRIVERS = {
    "reference loop": ("", "tests.conformance_driver:DRIVER"),
    "OpenAI chat loop": ("integrations/sdk_loops/tests", "sdk_loops_conformance:CHAT"),
    "Anthropic loop": ("integrations/sdk_loops/tests", "sdk_loops_conformance:ANTHROPIC"),
    "OpenAI chat loop, re-planning": ("integrations/sdk_loops/tests", "sdk_loops_conformance:CHAT_REPLAN"),
    "MCP client": ("integrations/mcp/tests", "mcp_conformance:DRIVER"),
    "LangGraph create_agent": ("integrations/langgraph/tests", "langgraph_conformance_driver:DRIVER"),
    "LangGraph ToolNode": ("integrations/langgraph/tests", "langgraph_conformance_driver:TOOLNODE_DRIVER"),
    "Pydantic AI": ("integrations/pydantic_ai/tests", "pydantic_ai_conformance:DRIVER"),
    "OpenAI Agents SDK": ("integrations/openai_agents/tests", "agents_conformance:DRIVER"),
    "LlamaIndex": ("integrations/llamaindex/tests", "llamaindex_conformance:DRIVER"),
}
#: The adapters of integrations/isolated.toml (10xGraph, Google ADK, CrewAI, Strands) run their matrix in their own
#: environment (integrations/run-isolated makes it), from their tests directory, e.g. for 10xGraph:
#: ``PYTHONPATH=tests .venv312/bin/python -m replaysafe.testing.conformance tenxgraph_conformance_driver:DRIVER``.
LEDGERS = [
    "sqlite",
    "postgresql://root@127.0.0.1:5432/test",
    "redis://127.0.0.1:6379/0",
    "postgresql://root@127.0.0.1:5432/test?cache=redis%3A%2F%2F127.0.0.1%3A6379%2F0",  # TieredLedger
]


def ledger_name(url: str) -> str:
    """How the table names a ledger: its scheme, or ``tiered`` for PostgreSQL with a Redis cache."""
    return "tiered" if "cache=" in url else url.split("://")[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.crash", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--ledger", action="append", help="sqlite, or a server's URL (default: all three)")
    parser.add_argument("--driver", action="append", help="NAME=MODULE:ATTR (default: every adapter's)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "crash-matrix.md")
    args = parser.parse_args(argv)
    drivers = dict(DRIVERS)
    if args.driver:  # a driver of DRIVERS keeps its directory; another must be importable as it is
        folder_of = {spec: folder for folder, spec in DRIVERS.values()}
        chosen = [spec.partition("=") for spec in args.driver]
        drivers = {name: (folder_of.get(spec, ""), spec) for name, _, spec in chosen}
    ledgers = args.ledger or LEDGERS
    # The drivers' directories, importable here and in the kit's child processes.
    folders = [str(ROOT), *(str(ROOT / folder) for folder, _ in drivers.values() if folder)]
    sys.path[:0] = folders
    os.environ["PYTHONPATH"] = os.pathsep.join([*folders, *filter(None, [os.environ.get("PYTHONPATH")])])
    rows: list[tuple[str, str, str, int, int, int, int]] = []
    totals: Counter[str] = Counter()
    started = time.monotonic()
    for name, (_, driver) in drivers.items():
        module = __import__(driver.partition(":")[0], fromlist=["_"])
        target = getattr(module, driver.partition(":")[2])
        for ledger in ledgers:
            for scenario in conformance.scenarios_for(target):
                kills = duplicates = control_kills = control_broke = 0
                for _ in range(args.rounds):
                    url = None if ledger == "sqlite" else ledger
                    try:
                        held, control = conformance.check(driver, scenario, every_case=True, ledger=url)
                    except conformance.ConformanceError as exc:
                        print(f"FAIL {name} {ledger} {exc}", flush=True)
                        duplicates += 1
                        continue
                    kills += len(held.cases)
                    if scenario.runs_unprotected is None:  # else it runs unprotected, as documented
                        duplicates += sum(case.broken for case in held.cases)
                    control_kills += len(control.cases)
                    control_broke += scenario.cases_broken(control)
                rows.append((name, ledger_name(ledger), scenario.name, kills, duplicates, control_kills, control_broke))
                totals.update(kills=kills, duplicates=duplicates, control=control_kills, broke=control_broke)
                print(
                    f"{name:16} {ledger_name(ledger):10} {scenario.name:16} {kills:5} kills, {duplicates} dup",
                    flush=True,
                )
    seconds = time.monotonic() - started
    lines = [
        "# Adapters' crash matrix",
        "",
        f"`python -m benchmarks.crash --rounds {args.rounds}`, {dt.date.today()}, {seconds / 60:.0f} minutes: "
        f"**{totals['kills'] + totals['control']:,} SIGKILL scenarios**, {totals['kills']:,} with the adapter "
        f"({totals['duplicates']} duplicates where none is promised) and {totals['control']:,} without it "
        f"(the control: {totals['broke']:,} ran something twice).",
        "",
        "| adapter | ledger | scenario | kills with the adapter | duplicates | kills without | ran twice without |",
        "|---|---|---|---:|---:|---:|---:|",
        *(f"| {a} | {b} | {c} | {d} | {e} | {f} | {g} |" for a, b, c, d, e, f, g in rows),
        "",
    ]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {args.out}")
    return 1 if totals["duplicates"] else 0


if __name__ == "__main__":
    sys.exit(main())
