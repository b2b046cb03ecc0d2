"""The ``replaysafe`` command."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _ledger_cli as ledger_commands
from ._crash_points import POINTS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replaysafe", description="Stop AI agents from repeating side effects after a crash."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser(
        "demo",
        help="show a crash-and-resume refunding once with @replay_safe and twice without",
        description="Run an agent-like loop that is SIGKILLed after refund_order returns, then resume it.",
    )
    demo.add_argument(
        "--in-doubt",
        action="store_true",
        help="kill the agent while the refund is in flight instead, and resume it under each in-doubt policy "
        "with a provider that dedupes by idempotency key",
    )
    ledger_commands.add_commands(commands)
    _add_crashtest(commands)
    return parser


def _add_crashtest(commands: Any) -> None:
    crashtest = commands.add_parser(
        "crashtest",
        help="SIGKILL an agent at every point of every tool call, resume it, and count side effects",
        description="Run ENTRY once to learn its tool calls; then, for each call and kill point, run it in a "
        "fresh directory, SIGKILL it there, run it again (the resume) and count what ran. Exit 0: every case "
        "holds; 1: something ran more often than promised; 2: it could not test. See docs/crashtest.md.",
    )
    crashtest.add_argument(
        "entry", metavar="ENTRY", help="path/to/file.py:function or package.module:function, called with no arguments"
    )
    crashtest.add_argument(
        "--ledger",
        metavar="URL",
        help="the ledger the agent uses (REPLAYSAFE_LEDGER_URL in its runs; each case gets a table or key prefix of "
        "its own); default: a SQLite file in each case's directory",
    )
    crashtest.add_argument(
        "--points",
        default=",".join(POINTS),
        help=f"kill points, comma-separated (default: {','.join(POINTS)})",
    )
    crashtest.add_argument(
        "--policy",
        choices=("rerun", "raise"),
        help="the in-doubt policy of the tools that choose none (default: rerun, the library's)",
    )
    crashtest.add_argument(
        "--effects",
        action="append",
        default=[],
        metavar="MODULE:FUNCTION",
        help="count a function as a side effect, as @replaysafe.testing.side_effect would (repeatable, or "
        "comma-separated)",
    )
    crashtest.add_argument("--case", metavar="N@POINT", help="run one case alone (the report prints each case's)")
    crashtest.add_argument("--jobs", type=int, default=1, metavar="N", help="cases run side by side (default 1)")
    crashtest.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="the longest one run may take (default 60)"
    )
    crashtest.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report, one test case per case")
    crashtest.add_argument("--json", action="store_true", help="print the report as one JSON document")
    crashtest.add_argument("--keep", action="store_true", help="keep every case's directory (failing ones always)")


def version() -> str:
    """The installed distribution's version, whatever name it is published under: the one whose
    ``replaysafe`` command is this one (another project may own the name ``replaysafe``)."""
    for script in importlib.metadata.entry_points(group="console_scripts", name="replaysafe"):
        if script.value == "replaysafe._cli:main" and script.dist is not None:
            return f"{script.dist.version} ({script.dist.metadata['Name']})"
    return "(not installed: run from a checkout)"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo" and args.in_doubt:
        from ._demo.in_doubt import main as demo_in_doubt

        return demo_in_doubt()
    if args.command == "demo":
        from ._demo.double_refund import main as demo

        return demo()
    if args.command == "crashtest":
        return _crashtest(args)
    if args.command == "ledger":
        try:
            return ledger_commands.run(args)
        except BrokenPipeError:  # the reader (| head) left: stop quietly, as other commands do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    raise AssertionError(args.command)  # pragma: no cover - argparse rejects unknown commands


def _crashtest(args: argparse.Namespace) -> int:
    from .testing._crashtest import UNTESTABLE, CrashTestError, crashtest

    effects = [name.strip() for value in args.effects for name in value.split(",") if name.strip()]
    points = [point.strip() for point in args.points.split(",") if point.strip()]
    bar = sys.stderr.isatty() and not args.json

    def progress(done: int, total: int, broken: int) -> None:
        if bar:
            width = 30
            filled = width * done // total
            line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} cases, {broken} broken"
            print(f"\r{line}", end="" if done < total else "\n", file=sys.stderr, flush=True)

    try:
        report = crashtest(
            args.entry,
            ledger=args.ledger,
            points=points,
            policy=args.policy,
            jobs=args.jobs,
            timeout=args.timeout,
            effects=effects,
            case=args.case,
            keep=args.keep,
            progress=progress,
        )
    except CrashTestError as exc:
        print(f"replaysafe crashtest: {exc}", file=sys.stderr)
        return UNTESTABLE
    if args.junit:
        Path(args.junit).write_text(report.junit(), encoding="utf-8")
    if args.json:
        json.dump(report.document(), sys.stdout, indent=2)
        print()
    else:
        print(report.table())
    return report.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
