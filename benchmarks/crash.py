"""``python -m benchmarks.crash``: the adapters' crash matrix, a long run (not CI).

Every conformance scenario (``replaysafe.testing.conformance``), every call at every kill point, on every
adapter's driver and every durable ledger, repeated ``--rounds`` times: each case is one SIGKILL of a
child process and one resume. It counts the SIGKILL scenarios run and the duplicates found where the docs
promise none (a held case that broke), and writes the table to ``--out`` (default
``benchmarks/results/crash-matrix.md``). CI runs each scenario's key case once, on SQLite.

    .venv/bin/python -m benchmarks.crash [--rounds N] [--jobs N] [--ledger URL ...] [--scenario NAME ...]
                                         [--driver NAME ...] [--driver NAME=MODULE:ATTR ...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
import sys
import time
from collections import Counter
from pathlib import Path

from replaysafe.testing import CrashTestError, conformance

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
#: The adapters of integrations/isolated.toml, each run by name from its own environment (integrations/run-isolated
#: makes it), e.g. ``integrations/adk/.venv311/bin/python -m benchmarks.crash --driver "Google ADK"``.
ISOLATED = {
    "10xGraph": ("integrations/tenxgraph/tests", "tenxgraph_conformance_driver:DRIVER"),
    "Google ADK": ("integrations/adk/tests", "adk_conformance:DRIVER"),
    "CrewAI": ("integrations/crewai/tests", "crewai_conformance:DRIVER"),
    "Strands": ("integrations/strands/tests", "strands_conformance:DRIVER"),
}
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
    parser.add_argument("--jobs", type=int, default=1, help="cases of one scenario run side by side")
    parser.add_argument("--ledger", action="append", help="sqlite, or a server's URL (default: all four)")
    parser.add_argument(
        "--driver", action="append", help="an adapter's NAME, or NAME=MODULE:ATTR (default: every adapter's)"
    )
    parser.add_argument("--scenario", action="append", help="a scenario's name (default: every one a driver offers)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "crash-matrix.md")
    args = parser.parse_args(argv)
    drivers = dict(DRIVERS)
    if args.driver:  # a known adapter's driver keeps its directory; another must be importable as it is
        known = {**DRIVERS, **ISOLATED}
        folder_of = {spec: folder for folder, spec in known.values()}
        drivers = {}
        for given in args.driver:
            name, _, spec = given.partition("=")
            drivers[name] = known[given] if given in known else (folder_of.get(spec, ""), spec)
    ledgers = args.ledger or LEDGERS
    # The drivers' directories, importable here and in the kit's child processes.
    folders = [str(ROOT), *(str(ROOT / folder) for folder, _ in drivers.values() if folder)]
    sys.path[:0] = folders
    os.environ["PYTHONPATH"] = os.pathsep.join([*folders, *filter(None, [os.environ.get("PYTHONPATH")])])
    # Each round runs the whole matrix, so a run stopped early has covered every adapter as often as it could.
    rows: dict[tuple[str, str, str], Counter[str]] = {}
    totals: Counter[str] = Counter()
    started = time.monotonic()

    def write(rounds_done: int) -> None:
        # Written after every row: a run stopped early keeps the figures of what it ran.
        minutes = (time.monotonic() - started) / 60
        state = (
            f"{minutes:.0f} minutes"
            if rounds_done == args.rounds
            else f"stopped after {minutes:.0f} minutes, {rounds_done} of {args.rounds} rounds done"
        )
        errors = f", {totals['errors']} could not be tested (see its output)" if totals["errors"] else ""
        lines = [
            "# Adapters' crash matrix",
            "",
            f"`python -m benchmarks.crash --rounds {args.rounds} --jobs {args.jobs}`, {dt.date.today()}, {state}: "
            f"**{totals['kills'] + totals['control']:,} SIGKILL scenarios**, {totals['kills']:,} with the adapter "
            f"({totals['duplicates']} duplicates where none is promised) and {totals['control']:,} without it "
            f"(the control: {totals['broke']:,} ran something twice){errors}.",
            "",
            "| adapter | ledger | scenario | kills with the adapter | duplicates | kills without | ran twice without |",
            "|---|---|---|---:|---:|---:|---:|",
            *(
                f"| {' | '.join(row)} | {n['kills']} | {n['duplicates']} | {n['control']} | {n['broke']} |"
                for row, n in rows.items()
            ),
            "",
        ]
        args.out.write_text("\n".join(lines), encoding="utf-8")

    targets = {
        name: getattr(importlib.import_module(spec.partition(":")[0]), spec.partition(":")[2])
        for name, (_, spec) in drivers.items()
    }
    for done in range(args.rounds):
        for name, (_, driver) in drivers.items():
            for ledger in ledgers:
                for scenario in conformance.scenarios_for(targets[name]):
                    if args.scenario and scenario.name not in args.scenario:
                        continue
                    counts = rows.setdefault((name, ledger_name(ledger), scenario.name), Counter())
                    count = _one(name, driver, scenario, None if ledger == "sqlite" else ledger, args.jobs)
                    counts.update(count)
                    totals.update(count)
                    print(
                        f"{name:16} {ledger_name(ledger):10} {scenario.name:16} {count['kills']:5} kills, "
                        f"{count['duplicates']} dup",
                        flush=True,
                    )
                    write(done)
    write(args.rounds)
    print(f"wrote {args.out}")
    return 1 if totals["duplicates"] or totals["errors"] else 0


def _one(name: str, driver: str, scenario: conformance.Scenario, ledger: str | None, jobs: int) -> Counter[str]:
    """One scenario's every case, with the adapter and without: what the table counts of it."""
    try:
        held, control = conformance.check(driver, scenario, every_case=True, ledger=ledger, jobs=jobs)
    except conformance.ConformanceError as exc:
        print(f"FAIL {name} {ledger or 'sqlite'} {exc}", flush=True)
        return Counter(duplicates=1)
    except CrashTestError as exc:  # a hung case, say: counted and named, and the run goes on
        print(f"ERROR {name} {ledger or 'sqlite'} {scenario.name}: {exc}", flush=True)
        return Counter(errors=1)
    return Counter(
        kills=len(held.cases),
        # A scenario that runs a tool unprotected, as documented, breaks there by design.
        duplicates=sum(case.broken for case in held.cases) if scenario.runs_unprotected is None else 0,
        control=len(control.cases),
        broke=scenario.cases_broken(control),
    )


if __name__ == "__main__":
    sys.exit(main())
