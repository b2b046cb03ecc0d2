"""Run the benchmark sections and write the results (see benchmarks/README.md)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import adapters, concurrency, overhead, parallel, report, scale, tenxgraph, threads
from ._env import Scratch, cpus_kept_awake, load_average, machine_info
from ._progress import progress
from .settings import FULL, QUICK

RESULTS = Path(__file__).parent / "results"
#: Section name -> the module that produces it; ``overhead`` also produces ``floor`` and ``alternative``.
SECTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "overhead": overhead.run,
    "concurrency": concurrency.run,
    "threads": threads.run,
    "parallel": parallel.run,
    "tenxgraph": tenxgraph.run,  # in the 10xGraph adapter's Python 3.12 environment, as a subprocess
    "adapters": adapters.run,  # each adapter in its own environment, as a subprocess
    "scale": scale.run,  # last: its big loads may leave the servers busy for a while
}


def _log(message: str) -> None:
    clear = "\r\x1b[2K" if progress.tty else ""  # over a bar drawn in place
    print(f"{clear}[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _step(message: str) -> None:
    """What a section says it starts ("overhead: redis"): shown on the progress bar."""
    progress.start_step(message.partition(": ")[2] or message)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run in under a minute (small, noisy numbers)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"directory for the results (default {RESULTS})")
    parser.add_argument(
        "--only", nargs="+", choices=sorted(SECTIONS), help="run only these sections (the JSON lacks the others)"
    )
    parser.add_argument(
        "--idle-cpus",
        action="store_true",
        help="do not keep idle vCPUs awake with nice-19 spinners (round trips then include wake-up latency)",
    )
    parser.add_argument(
        "--report", type=Path, metavar="JSON", help="only rewrite the markdown and chart of an earlier run's JSON"
    )
    args = parser.parse_args(argv)
    if args.report:
        return _rewrite(args.report)
    settings = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.perf_counter()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results: dict[str, Any] = {}
    quiet_start = load_average()  # before the spinners start: they add to the load average themselves
    try:
        with Scratch.discover() as scratch, cpus_kept_awake(not args.idle_cpus) as spinners:
            _log(f"postgres: {scratch.postgres_url or 'not answering'}; redis: {scratch.redis_url or 'not answering'}")
            results["meta"] = machine_info(scratch)
            results["meta"]["load_average_at_start"] = quiet_start
            results["meta"]["cpu_spinners"] = spinners
            warning = report.load_warning(results["meta"])
            if warning:
                _log(f"WARNING: {warning}")
            chosen = [name for name in SECTIONS if not args.only or name in args.only]
            for index, name in enumerate(chosen, 1):
                progress.start_section(name, index, len(chosen))
                results.update(_section(name, SECTIONS[name](settings, scratch, _step)))
    except KeyboardInterrupt:
        _log("interrupted: the run's schema, keys and files are removed; nothing written")
        return 130
    results["meta"]["settings"] = settings.as_dict()
    results["meta"]["load_average_at_end"] = load_average()  # the spinners and this process counted out (report)
    results["meta"]["load_warning"] = report.load_warning(results["meta"])
    results["meta"]["duration_s"] = round(time.perf_counter() - started, 1)
    results["targets"] = report.targets(results)
    paths = report.write(results, args.out, f"{stamp}{'-quick' if args.quick else ''}")
    print(report.summary(results, paths))
    return 0


def _rewrite(path: Path) -> int:
    """The markdown and chart of an earlier run, from its JSON (after a change to the report's layout)."""
    results = json.loads(path.read_text())
    results["meta"].setdefault("load_warning", report.load_warning(results["meta"]))
    results["targets"] = report.targets(results)
    for kind, written in report.write(results, path.parent, path.stem).items():
        _log(f"{kind}: {written}")
    return 0


def _section(name: str, produced: dict[str, Any]) -> dict[str, Any]:
    return produced if name == "overhead" else {name: produced}
