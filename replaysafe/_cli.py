"""The ``replaysafe`` command."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Sequence

from . import _ledger_cli as ledger_commands


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
    return parser


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
    if args.command == "ledger":
        try:
            return ledger_commands.run(args)
        except BrokenPipeError:  # the reader (| head) left: stop quietly, as other commands do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    raise AssertionError(args.command)  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
