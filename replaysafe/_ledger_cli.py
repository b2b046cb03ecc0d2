"""``replaysafe ledger ...``: inspect and settle a ledger after an incident.

Exit codes: 0 done; 1 no such record, nothing matched (a page past the end, a ledger
holding no record) or the record cannot be settled; 2 bad usage; 3 the ledger cannot be
opened (unreachable, wrong URL, missing database or table); 4 the operator did not
confirm; 5 the ledger seals its records and no signing key was given; 6 ``resolve`` was to seal a
result with a key that is not shown to be the application's: the first key given (the one that seals)
checks none of the ledger's seals (nothing was written; ``--seal-with-unchecked-key`` seals with it
knowingly). Reading never refuses a key: a key that checks no seal is warned of, and the seals it
does not check are reported ``tampered``.

Options go before or after the action (``ledger --ledger URL list`` is ``ledger list
--ledger URL``). ``--json`` makes every action print one JSON document on stdout (and its
questions and notes on stderr). The command never vouches for what it cannot check:
without the signing key a sealed record's seal is reported unverified, and a result is
never written unsealed into a ledger that seals. Every string read from the store is
escaped in human output, so an id holding a newline or a terminal escape sequence cannot
forge or hide lines.

``show``, ``resolve`` and ``delete`` name a call by its three ids, each as ``list`` prints it: whole, or
shortened, ending in ``…`` (``list`` shortens ids past 24 characters; ``--wide`` does not), or ending in ``*``.
An id that ends so is a prefix, unless a record holds it whole. The ids must name one record: a prefix that
names several is refused (exit 2), listing them by their ids only.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import importlib
import itertools
import json
import os
import re
import shlex
import sqlite3
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from . import approvals
from ._approvals import STATE_PREFIX, CallState, parse_state
from ._clock import utcnow
from ._constants import LEDGER_URL_ENV
from ._core import STEPS_PREFIX, Verdict, answers_a_rerun_keeps, judge
from ._errors import LedgerError, ReplaySafeError, TamperedRecordError
from ._identity import call_idempotency_key
from ._keys import late_result_of, step_parent, undo_key
from ._operations import _reason as error_text
from ._owners import owner_alive
from ._records import CallKey, Record, Status
from ._sealing import FINISHED, SEALED, SIGNING_KEY_ENV, Sealer, is_sealed, unsealed
from ._shapes import JSON_NAME, Evidence, Installed, ResultShape, evidence, form_of, installed
from ._undo import aundo
from ._undo import plan as undo_plan
from ._unrecorded import PREFIX as UNRECORDED_PREFIX
from ._unrecorded import REASONS as UNRECORDED_REASONS
from ._unrecorded import parse as unrecorded
from .ledgers import Ledger, open_ledger
from .ledgers._options import redact
from .ledgers._protocol import diagnose

EXIT_OK, EXIT_NOT_FOUND, EXIT_USAGE, EXIT_LEDGER, EXIT_DECLINED, EXIT_NO_KEY, EXIT_WRONG_KEY = 0, 1, 2, 3, 4, 5, 6
#: ``resolve``'s option to seal with a first key that checks none of the ledger's seals, knowingly.
UNCHECKED_KEY = "--seal-with-unchecked-key"
#: The states ``list --status`` and ``stats`` know, named as ``Status`` names them.
STATUSES = ("running", "completed", "failed", "in_doubt", "paused")
_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: The same records in every ledger: SQLSTATEs of a missing table or schema, SQLite's text.
_MISSING_TABLE_STATES = ("42P01", "3F000")
#: What ends an id given as a prefix: the "…" ``list`` shortens an id with, or "*".
PREFIX_MARKS = ("…", "*")
#: How many records a refused prefix names (ids only); the rest are counted.
CANDIDATES_SHOWN = 10
#: How ``show``, ``resolve`` and ``delete`` name a call, for their ``--help``.
_KEY_HELP = (
    "The call is named by its THREAD, MESSAGE and CALL ids, each whole or as `list` prints it: an id ending in … "
    "(as `list` shortens one) or * is taken as the start of the id, unless a record holds it whole. They must name "
    "one record: ids that name several are refused (exit 2), listing them. Quote each id for the shell; an id that "
    "starts with - goes after --."
)


class CommandError(Exception):
    def __init__(self, message: str, code: int, details: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.code = code
        #: Lines printed after the message: each printable, made so by the code that wrote it.
        self.details = tuple(details)


def age(text: str) -> dt.timedelta:
    """``90s``, ``15m``, ``1h``, ``30d``, ``2w`` as a duration."""
    match = _AGE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age like 90s, 15m, 1h, 30d or 2w")
    return dt.timedelta(seconds=float(match[1]) * _UNITS[match[2]])


def moment(text: str) -> dt.datetime | dt.timedelta:
    """An age (``1h``: that long ago) or an absolute ISO 8601 time (UTC unless it names its offset)."""
    if _AGE.fullmatch(text.strip()):
        return age(text)
    iso = text.strip()
    if iso.endswith(("Z", "z")):
        iso = iso[:-1] + "+00:00"  # Python 3.10's fromisoformat does not take a Z
    try:
        when = dt.datetime.fromisoformat(iso)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an age (90s, 15m, 1h, 30d, 2w) nor an ISO time (2026-12-03T07:00:00Z)"
        ) from None
    return when.replace(tzinfo=dt.timezone.utc) if when.tzinfo is None else when.astimezone(dt.timezone.utc)


def status(text: str) -> str:
    """A status as ``Status`` names it; ``in-doubt`` is taken for ``in_doubt``."""
    name = text.strip().lower().replace("-", "_")
    if name not in STATUSES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a status: choose from {', '.join(STATUSES)}")
    return name


def _options(parser: argparse.ArgumentParser, *, below: bool) -> None:
    """The options every action takes, before or after the action's name. Below the action they
    default to nothing at all, so that a value given before the action is not overwritten."""
    default: Any = argparse.SUPPRESS if below else None
    parser.add_argument(
        "--ledger", metavar="URL", default=default, help=f"the ledger's URL (default: ${LEDGER_URL_ENV})"
    )
    parser.add_argument(
        "--signing-key-file",
        metavar="PATH",
        default=default,
        help=f"a file holding the ledger's signing key(s), comma- or newline-separated, the first signs (default: "
        f"${SIGNING_KEY_ENV}); needed to check seals and to record a result in a ledger that seals. A file, not "
        "the key itself: a command line is visible to every user of the machine",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if below else False,
        help="print one JSON document, for scripts (questions and notes go to stderr)",
    )


def _action(actions: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = actions.add_parser(name, help=help, description=description)
    _options(parser, below=True)
    return parser


def add_commands(commands: Any) -> None:
    ledger = commands.add_parser(
        "ledger",
        help="inspect and settle the records of a ledger",
        description="Inspect and settle a ledger's records. Exit codes: 0 done, 1 no such record or nothing "
        "matched, 2 bad usage, 3 ledger unreachable / wrong URL / missing database or table, 4 not confirmed, "
        "5 the ledger seals its records and no signing key was given, 6 resolve was to seal a result with a "
        "first signing key that checks none of the ledger's seals (see --seal-with-unchecked-key).",
    )
    _options(ledger, below=False)
    actions = ledger.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = _action(
        actions,
        "list",
        "list records, newest first",
        "List records, newest first, a page at a time. Ids past 24 characters are shortened, ending in … "
        "(--wide prints them whole): show, resolve and delete take them as printed. With --status in_doubt, a "
        "resolve command to paste follows for each call listed.",
    )
    listing.add_argument("--thread", help="only this thread (ending in … or *: threads that start so)")
    listing.add_argument("--message", help="only this message (ending in … or *: messages that start so)")
    listing.add_argument("--tool", help="only this tool")
    listing.add_argument(
        "--status", type=status, metavar="STATUS", help=f"only records in this state: {', '.join(STATUSES)}"
    )
    listing.add_argument(
        "--since", type=moment, metavar="WHEN", help="only records updated since WHEN: an age (1h, 30d) or an ISO time"
    )
    listing.add_argument(
        "--until", type=moment, metavar="WHEN", help="only records updated before WHEN: an age (1h, 30d) or an ISO time"
    )
    listing.add_argument("--limit", type=int, default=None, help="records per page (default 50)")
    listing.add_argument("--page", type=int, default=None, help="page number, from 1")
    listing.add_argument(
        "--jsonl", action="store_true", help="one JSON object per line, every matching record (no paging unless asked)"
    )
    listing.add_argument(
        "--wide",
        action="store_true",
        help="print ids whole, however long (else past 24 characters they are shortened, ending in …)",
    )

    show = _action(
        actions,
        "show",
        "one record, its result as stored",
        "Show one record: its idempotency key, the seal check, and its result as the ledger stores it (JSON, "
        "pretty-printed: nothing is decoded or imported), or in words what the ledger keeps in its place (a result "
        f"not recorded, the steps a paused or in-doubt call made). {_KEY_HELP}",
    )
    _add_key(show)

    resolve = _action(
        actions,
        "resolve",
        "settle an in-doubt call",
        "Settle an in-doubt call: record its result, or let the next replay run it again. A call whose owner is "
        f"still alive, or that is already finished, is refused unless --force. {_KEY_HELP}",
    )
    _add_key(resolve)
    how = resolve.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--result",
        metavar="JSON",
        help="the call's result, as JSON in the shape its replay reads (what the provider did); a value the call's "
        "shape, when the ledger tells it or --shape names it, cannot read is refused",
    )
    how.add_argument(
        "--text",
        metavar="TEXT",
        help="the call's result as plain text (what the provider answered), written in the shape the call's "
        "adapter records: a CallToolResult with one text block for an MCP call, a JSON string for a tool "
        "recorded by replaysafe's JSON codec. Needs --shape when the ledger cannot tell the shape",
    )
    how.add_argument(
        "--rerun",
        action="store_true",
        help="remove the record so the next replay runs the tool (a call decided on a human's answers: keep it "
        "paused for a new decision)",
    )
    resolve.add_argument(
        "--shape",
        metavar="NAME",
        help="the shape the call's adapter records results in: json (replaysafe's JSON codec: @replay_safe and the "
        "LangGraph, Pydantic AI, OpenAI Agents SDK, sdk_loops and 10xGraph adapters), mcp (replaysafe-mcp), "
        "or another an installed package declares. Without it, the shape is told by the call's "
        "key space or by finished records of the same tool, when they show it",
    )
    resolve.add_argument(
        "--force",
        action="store_true",
        help="settle a call even though its owner is alive (a stuck call; the owner, if it finishes, reports a "
        "duplicate execution) or it is already finished (its recorded result cannot be read)",
    )
    resolve.add_argument(
        UNCHECKED_KEY,
        action="store_true",
        help="seal the result with the first signing key given even though it checks none of the ledger's seals "
        "(exit 6 without it): a key just rotated in that nothing is sealed with yet, or a store whose seals were "
        "all forged. Only once you know it is the key the application signs with: a replay refuses a result "
        "sealed with another",
    )
    resolve.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    delete = _action(
        actions,
        "delete",
        "delete one record, so the call may run again",
        "Delete one call's record (a recorded failure to retry, a record to drop): the next replay runs the tool "
        f"again. A call whose owner is still alive is refused unless --force. {_KEY_HELP}",
    )
    _add_key(delete)
    delete.add_argument(
        "--force", action="store_true", help="delete it even though its owner is alive (the call may then run twice)"
    )
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    purge = _action(
        actions, "purge", "delete records in bounded batches", "Delete records, after asking (unless --yes)."
    )
    which = purge.add_mutually_exclusive_group(required=True)
    which.add_argument("--thread", help="every record of this thread")
    which.add_argument("--expired", action="store_true", help="records whose ttl has passed")
    which.add_argument("--older-than", type=age, metavar="AGE", help="finished records not updated for AGE (30d)")
    purge.add_argument("--batch-size", type=int, default=1000, help="records deleted per batch (default 1000)")
    purge.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    _action(
        actions,
        "stats",
        "counts per status and tool; the oldest in-doubt call; running calls past their lease",
        "Counts per status and per tool, the oldest in-doubt call, and running calls past their lease.",
    )
    _add_undo(actions)
    _add_decisions(actions)


def _add_decisions(actions: Any) -> None:
    approve = _action(
        actions,
        "approve",
        "approve a paused call, once, for a while",
        "Approve a paused call (see them with list --status paused): the next call of the same key, with the "
        "same tool and arguments, runs once on it, before it expires; any other call of the key is refused and "
        f"the call stays paused. An approval already spent is never spent again. {_KEY_HELP}",
    )
    _add_key(approve)
    approve.add_argument("--by", required=True, metavar="NAME", help="who approves (kept with the decision)")
    approve.add_argument(
        "--expires",
        type=age,
        metavar="AGE",
        default=None,
        help="how long the approval holds: 90s, 15m, 1h (default 15m); it is refused once past",
    )
    approve.add_argument(
        "--args",
        metavar="JSON",
        help="an edit: the complete arguments the call runs with instead, as a JSON object by parameter name",
    )
    approve.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    reject = _action(
        actions,
        "reject",
        "reject a paused call",
        "Reject a paused call: it does not run on this decision (its caller gets ApprovalRejectedError with the "
        f"reason); a later approve replaces it. {_KEY_HELP}",
    )
    _add_key(reject)
    reject.add_argument("--by", required=True, metavar="NAME", help="who rejects (kept with the decision)")
    reject.add_argument("--reason", required=True, help="why (shown to the call's caller)")
    reject.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _add_key(parser: argparse.ArgumentParser) -> None:
    for name, metavar, what in (
        ("thread_id", "THREAD", "thread"),
        ("message_id", "MESSAGE", "message"),
        ("tool_call_id", "CALL", "tool call"),
    ):
        parser.add_argument(name, metavar=metavar, help=f"the {what} id, whole or its start ending in … or *")


@dataclasses.dataclass
class Output:
    """Where an action writes: its answer on ``out``; with ``--json`` its questions and notes on ``err``,
    so that stdout holds exactly one JSON document."""

    out: TextIO
    err: TextIO
    stdin: TextIO
    as_json: bool

    def say(self, text: str) -> None:
        print(text, file=self.err if self.as_json else self.out, flush=True)

    def answer(self, text: str) -> None:
        """The action's result line: on stdout in human mode, nowhere with ``--json`` (the document says it)."""
        if not self.as_json:
            print(text, file=self.out)

    def document(self, value: Any) -> None:
        if self.as_json:
            json.dump(value, self.out, indent=2)
            self.out.write("\n")

    def confirm(self, question: str, yes: bool) -> bool:
        if yes:
            return True
        stream = self.err if self.as_json else self.out
        print(f"{question} [y/N] ", end="", file=stream, flush=True)
        return self.stdin.readline().strip().lower() in ("y", "yes")


def run(
    args: argparse.Namespace, out: TextIO | None = None, stdin: TextIO | None = None, err: TextIO | None = None
) -> int:
    # The streams of the moment (not those of import time): a caller that redirects sys.stdout is heard.
    out = sys.stdout if out is None else out
    stdin = sys.stdin if stdin is None else stdin
    err = sys.stderr if err is None else err
    output = Output(out, err, stdin, bool(getattr(args, "json", False)))
    try:
        from_env = not args.ledger
        url = args.ledger or os.environ.get(LEDGER_URL_ENV)
        ledger = _open(url, _signing_keys(args.signing_key_file), from_env=from_env)
        with ledger:
            action = _ACTIONS[args.action]
            try:
                if ledger.sealer is not None and not _seals_a_result(args):
                    _warn_of_the_key(ledger, ledger.sealer, _named_call(args), output)
                return action(ledger, args, output)
            except (CommandError, BrokenPipeError):
                raise
            except Exception as exc:
                raise _ledger_failure(ledger, exc) from exc
    except CommandError as exc:
        print(f"replaysafe ledger {args.action}: {printable(str(exc))}", file=err)
        for line in exc.details:
            print(line if line.isprintable() else printable(line), file=err)
        return exc.code


def _seals_a_result(args: argparse.Namespace) -> bool:
    """Whether the action seals something with the signing key: only ``resolve --result`` or ``--text``."""
    return bool(args.action == "resolve" and not args.rerun)


def _named_call(args: argparse.Namespace) -> CallKey | None:
    """The call the action names (``show``, ``resolve``, ``delete``), if any."""
    if not hasattr(args, "tool_call_id"):
        return None
    return CallKey(args.thread_id, args.message_id, args.tool_call_id)


@dataclasses.dataclass
class KeyCheck:
    """What the signing keys given check among the ledger's seals."""

    tried: int = 0  #: sealed records the keys were tried on
    signs: bool = False  #: the first key, the one that seals, checks one of them
    reader: int | None = None  #: else the position (from 1) of a later key that checks one, if any


def _check_key(ledger: Ledger, sealer: Sealer, near: CallKey | None) -> KeyCheck:
    """Try the keys on the ledger's seals, those nearest the call ``near`` first, until the first key checks one.

    Every sealed record is tried if need be: a bounded number could all be forged by whoever can write the
    store, which would lock the right key out (an altered or forged seal checks with no key). A wrong key is
    told only by a seal it does not check, so with no sealed record at all nothing tells (``tried == 0``).
    """
    check = KeyCheck()
    for record in _nearest_first(ledger, near):
        if not is_sealed(record.result):
            continue
        check.tried += 1
        position = sealer.key_of(record)
        if position == 0:
            check.signs = True
            return check
        if position is not None and check.reader is None:
            check.reader = position + 1
    return check


def _nearest_first(ledger: Ledger, near: CallKey | None) -> Iterator[Record]:
    """Every record of the ledger, once: ``near``'s own, then its thread's, then the others, newest first (the
    newest are the likeliest to be sealed with the key the application signs with now)."""
    seen: set[CallKey] = set()
    if near is not None:
        own = ledger.get(near)
        if own is not None:
            seen.add(own.key)
            yield own
    for thread_id in (near.thread_id, None) if near is not None else (None,):
        for record in reversed(list(ledger.records(thread_id=thread_id))):
            if record.key not in seen:
                seen.add(record.key)
                yield record


def _warn_of_the_key(ledger: Ledger, sealer: Sealer, near: CallKey | None, output: Output) -> None:
    """Before an action that seals nothing (reading, deleting): say when the key given checks none of the
    ledger's seals, or the first key does not. Never refused: an operator must be able to look at a store whose
    seals were forged, and deleting a record writes nothing with the key."""
    check = _check_key(ledger, sealer, near)
    if check.signs or not check.tried:
        return
    if check.reader is not None:
        text = (
            f"note: the first signing key given, the one that seals, checks none of the {check.tried} sealed "
            f"record(s) of this ledger; key {check.reader} does. Seals are read with every key given, but "
            "`resolve` seals with the first only: put the key the application signs with first."
        )
    else:
        text = (
            f"warning: the signing key given checks none of the {check.tried} sealed record(s) of this ledger: it "
            "is not the key the application signs with, or every seal was forged by someone who can write the "
            "store. Each seal is checked with it all the same (`show` reports one that does not check "
            "tampered), and `resolve` will not seal a result with it."
        )
    print(text, file=output.err, flush=True)


def _signing_key_or_refuse(ledger: Ledger, sealer: Sealer, call: CallKey, unchecked: bool) -> str | None:
    """Before ``resolve`` seals a result: refuse (exit 6) a first key that checks none of the ledger's seals,
    unless ``unchecked`` (``--seal-with-unchecked-key``). A key that merely checks *some* seal is not enough:
    the first key seals, so a rotation list whose first key is wrong would write a result every replay refuses.
    What to tell the operator before confirming, if anything."""
    check = _check_key(ledger, sealer, call)
    if check.signs:
        return None
    if not check.tried:
        return (
            "Note: no record of this ledger carries a seal, so the signing key given cannot be checked: the result "
            "is sealed with the first key as given. A replay refuses it if the application signs with another."
        )
    if check.reader is not None:
        problem = (
            f"the first signing key given seals, and it checks none of the {check.tried} sealed record(s) of this "
            f"ledger; key {check.reader} does. A result sealed with the first key is refused by a replay that does "
            "not accept that key"
        )
        fix = (
            "Give the keys in the order the application does: put the key the application signs with first "
            f"(--signing-key-file PATH or ${SIGNING_KEY_ENV}; while keys rotate, the new key, then the old one). If "
            f"the first key is the application's new key and nothing is sealed with it yet, pass {UNCHECKED_KEY}."
        )
    else:
        problem = (
            f"the signing key given checks none of the {check.tried} sealed record(s) of this ledger, so a result "
            "sealed with it may be refused by every replay"
        )
        fix = (
            "Either it is not the key the application signs with (give that key: --signing-key-file PATH or "
            f"${SIGNING_KEY_ENV}; while keys rotate, the new key, then the old one), or every seal tried was forged "
            "by someone who can write the store (`replaysafe ledger show` reports each record's seal check). Once "
            f"you know this is the application's key, pass {UNCHECKED_KEY} to seal the result with it anyway."
        )
    if not unchecked:
        raise CommandError(f"{problem}. {fix} Nothing was written.", EXIT_WRONG_KEY)
    return f"Careful ({UNCHECKED_KEY}): {problem}. It is sealed with the first key all the same."


def printable(text: str) -> str:
    """``text`` for a terminal: control and other unprintable characters (newlines, escape sequences,
    bidi overrides, lone surrogates) and the backslash escaped as ``repr`` escapes them, nothing else."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if c.isprintable() and c != "\\" else repr(c)[1:-1] for c in text)


def _signing_keys(path: str | None) -> list[str] | None:
    """The keys in ``--signing-key-file``; ``None`` leaves the ledger to read $REPLAYSAFE_SIGNING_KEY."""
    if path is None:
        return None
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"cannot read the signing key file {path} ({type(exc).__name__})", EXIT_USAGE) from exc
    keys = [k.strip() for k in re.split(r"[,\n]", text) if k.strip()]
    if not keys:
        raise CommandError(f"the signing key file {path} holds no key", EXIT_USAGE)
    return keys


def _open(url: str | None, signing_keys: list[str] | None = None, *, from_env: bool = False) -> Ledger:
    if not url:
        raise CommandError(f"no ledger: pass --ledger URL or set {LEDGER_URL_ENV}", EXIT_USAGE)
    where = f"${LEDGER_URL_ENV} names no usable ledger: " if from_env else ""
    scheme = url.partition(":")[0].lower().partition("+")[0]
    options: dict[str, Any] = {}
    if scheme == "memory":
        raise CommandError(
            f"{where}a memory:// ledger lives inside one process: there is nothing to inspect", EXIT_USAGE
        )
    if scheme == "sqlite":
        from .ledgers.sqlite import two_slash_suggestion

        suggestion = two_slash_suggestion(url)
        if suggestion is not None:
            raise CommandError(
                f"{where}{url} has two slashes, which name a host and no ledger file: did you mean {suggestion}?",
                EXIT_USAGE,
            )
        path = Path(url.partition("?")[0].split(":///", 1)[-1])
        if not path.is_file():
            raise CommandError(f"{where}no replaysafe records here: no ledger file at {path}", EXIT_LEDGER)
    if scheme in ("sqlite", "postgres", "postgresql"):
        options["create_schema"] = False  # an operator's typo must not create an empty ledger
    if signing_keys is not None:
        options["signing_key"] = signing_keys
    try:
        ledger = open_ledger(url, **options)
    except (ValueError, TypeError) as exc:
        raise CommandError(f"{where}{exc}", EXIT_USAGE) from exc
    try:
        ledger.get(CallKey("replaysafe-cli-probe", "-", "-"))
    except Exception as exc:
        ledger.close()
        raise _ledger_failure(ledger, exc, where) from exc
    return ledger


def _ledger_failure(ledger: Ledger, exc: BaseException, where: str = "") -> CommandError:
    """A ledger operation failed: a missing table is "no records here", anything else the ledger's own fix."""
    cause = getattr(exc, "orig", None) or exc  # the driver's error, not SQLAlchemy's wrapper
    if getattr(cause, "sqlstate", None) in _MISSING_TABLE_STATES or (
        isinstance(cause, sqlite3.OperationalError) and str(cause).startswith("no such table")
    ):
        table = getattr(getattr(ledger, "table", None), "fullname", "its table")
        return CommandError(
            f"{where}no replaysafe records here: {ledger!r} has no table {table} ({_mistyped(ledger)}?). The "
            "first protected call creates it, or apply ledger.ddl() (docs/ledgers.md).",
            EXIT_LEDGER,
        )
    fault = diagnose(ledger, exc)
    verb = "cannot reach the ledger" if fault.transient else "cannot use the ledger"
    if isinstance(exc, LedgerError):  # the package's own message: it names the call and the next step, no value
        return CommandError(f"{where}{verb} {ledger!r}: {exc}", EXIT_LEDGER)
    reason = error_text(cause)  # the driver's text only where it cannot hold a stored value
    return CommandError(f"{where}{verb} {ledger!r} ({reason}). {fault.fix}", EXIT_LEDGER)


def _mistyped(ledger: Ledger) -> str:
    """What an operator most likely mistyped to reach a ledger with nothing in it."""
    return {
        "RedisLedger": "a mistyped ?prefix= or database number",
        "PostgresLedger": "a mistyped database, ?schema= or ?table=",
        "SqliteLedger": "another file, or a mistyped ?table=",
    }.get(type(ledger).__name__, "a mistyped URL")


def _nothing_here(ledger: Ledger) -> CommandError:
    """A ledger that holds no record at all: most often a mistyped prefix, schema or file, so say what was
    looked at."""
    return CommandError(
        f"no replaysafe records here: {ledger!r} holds no record ({_mistyped(ledger)}?)", EXIT_NOT_FOUND
    )


def _state(record: Record, now: dt.datetime) -> str:
    """The status an operator cares about: a running record whose owner died is in doubt."""
    if record.status in (Status.RUNNING, Status.IN_DOUBT) and judge(record, now, owner_alive) is Verdict.IN_DOUBT:
        return Status.IN_DOUBT.value
    return record.status.value


def _ago(moment: dt.datetime, now: dt.datetime) -> str:
    seconds = max(0, int((now - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


#: How many characters of an id ``list`` prints without ``--wide``: a longer one is cut, ending in "…".
ID_WIDTH = 24


def _short(text: str, width: int = ID_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class IdGiven(NamedTuple):
    """One id as the operator gave it: the text to match, and whether it is a prefix (it ended in … or *)."""

    text: str
    prefix: bool

    @classmethod
    def of(cls, given: str) -> IdGiven:
        return cls(given[:-1], True) if given.endswith(PREFIX_MARKS) else cls(given, False)

    def matches(self, value: str) -> bool:
        """Whether the stored id ``value`` is this one: as stored, or as human output prints it (escaped)."""
        if self.prefix:
            return value.startswith(self.text) or printable(value).startswith(self.text)
        return value == self.text or printable(value) == self.text

    def starts(self, value: str) -> bool:
        """Whether ``value`` starts with this id, taken as a prefix though it was not given as one."""
        return IdGiven(self.text, True).matches(value)


_SHELL_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def shell_word(text: str, *, always: bool = False) -> str:
    """``text`` as one shell word, printable: ``shlex.quote`` (always single-quoted if ``always``), or, for text
    holding control or other unprintable characters, bash's ``$'...'`` with those characters escaped, so that
    the word pasted into bash or zsh is ``text`` exactly and printing it cannot act on the terminal."""
    if text.isprintable():
        quoted = shlex.quote(text)
        return f"'{quoted}'" if always and not quoted.startswith("'") else quoted
    escaped = []
    for char in text:
        code = ord(char)
        if char in "\\'":
            escaped.append("\\" + char)
        elif char in _SHELL_ESCAPES:
            escaped.append(_SHELL_ESCAPES[char])
        elif char.isprintable():
            escaped.append(char)
        elif code < 0x80:
            escaped.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            escaped.append(f"\\u{code:04x}")
        else:
            escaped.append(f"\\U{code:08x}")
    return "$'" + "".join(escaped) + "'"


def _ids(key: CallKey) -> str:
    """A call's three ids as shell words, as a command takes them."""
    return " ".join(shell_word(part, always=True) for part in key)


def _candidates(keys: list[CallKey]) -> list[str]:
    """Lines naming ``keys`` by their ids (ids only: never a result or an argument), a bounded number of them."""
    keys = sorted(keys)
    lines = [f"  {_ids(key)}" for key in keys[:CANDIDATES_SHOWN]]
    if len(keys) > CANDIDATES_SHOWN:
        lines.append(f"  and {len(keys) - CANDIDATES_SHOWN} more")
    return lines


def _at(when: dt.datetime | dt.timedelta, now: dt.datetime) -> dt.datetime:
    return now - when if isinstance(when, dt.timedelta) else when


def _all_records(ledger: Ledger, thread_id: str | None = None) -> list[Record]:
    """The records (of one thread); a ledger holding none at all is said to be empty, with what was looked at."""
    records = list(ledger.records(thread_id=thread_id))
    if not records and (thread_id is None or next(iter(ledger.records()), None) is None):
        raise _nothing_here(ledger)
    return records


def _list(ledger: Ledger, args: argparse.Namespace, output: Output) -> int:
    now = utcnow()
    since = _at(args.since, now) if args.since is not None else None
    until = _at(args.until, now) if args.until is not None else None
    thread = IdGiven.of(args.thread) if args.thread is not None else None
    message = IdGiven.of(args.message) if args.message is not None else None
    records = [
        r
        for r in _all_records(ledger, args.thread if thread is not None and not thread.prefix else None)
        if (args.status is None or _state(r, now) == args.status)
        and (thread is None or thread.matches(r.key.thread_id))
        and (message is None or message.matches(r.key.message_id))
        and (args.tool is None or r.tool_name == args.tool)
        and (since is None or r.updated_at >= since)
        and (until is None or r.updated_at < until)
    ]
    records.sort(key=lambda r: r.updated_at, reverse=True)
    nested = _nested(records)
    records = [record for record, _ in nested]
    depths = {record.key: depth for record, depth in nested}
    if args.jsonl and args.limit is None and args.page is None:
        shown, page, pages = records, 1, 1  # an export: every matching record
    else:
        limit, page = max(1, args.limit or 50), max(1, args.page or 1)
        pages = max(1, -(-len(records) // limit))
        if page > pages:
            raise CommandError(
                f"page {page} is past the end: {len(records)} matching record(s) make {pages} page(s) of {limit}",
                EXIT_NOT_FOUND,
            )
        shown = records[(page - 1) * limit : page * limit]
    if args.jsonl:
        for record in shown:
            output.out.write(json.dumps(_summary(record, now)) + "\n")
        return EXIT_OK
    if output.as_json:
        output.document(
            {"total": len(records), "page": page, "pages": pages, "records": [_summary(r, now) for r in shown]}
        )
        return EXIT_OK
    columns = ("THREAD", "MESSAGE", "CALL", "TOOL", "STATUS", "ATTEMPTS", "AGE", "OWNER")
    cut: Callable[[str], str] = (lambda text: text) if args.wide else _short
    rows = [
        (
            cut(printable(r.key.thread_id)),
            cut(printable(r.key.message_id)),
            cut(printable(r.key.tool_call_id)),
            "  " * (depths[r.key] - 1) + "└ " + printable(r.tool_name) if depths[r.key] else printable(r.tool_name),
            _state(r, now),
            str(r.attempt),
            _ago(r.updated_at, now),
            printable(r.owner),
        )
        for r in shown
    ]
    _table(output.out, columns, rows)
    print(f"{len(records)} record(s); page {page} of {pages}", file=output.out)
    if not args.wide and any(len(printable(part)) > ID_WIDTH for r in shown for part in r.key):
        print(
            "Ids ending in … are shortened: --wide prints them whole; show, resolve and delete take them as "
            "printed here.",
            file=output.out,
        )
    if args.status == Status.IN_DOUBT.value and shown:
        _resolve_commands(args, shown, output.out)
    return EXIT_OK


def _resolve_commands(args: argparse.Namespace, records: list[Record], out: TextIO) -> None:
    """A ``resolve`` command to paste for each of ``records``: the whole ids, shell-quoted, and the ledger and
    signing key file options as the operator gave them (a password in the URL left out). Comment lines, to
    paste with them."""
    words = ["replaysafe", "ledger"]
    hidden = False
    if args.ledger:
        url, hidden = _without_password(args.ledger)
        words += ["--ledger", shell_word(url)]
    if args.signing_key_file is not None:
        words += ["--signing-key-file", shell_word(args.signing_key_file)]
    print(
        "\n# Settle each call once its provider tells whether it happened (look it up by the idempotency key):\n"
        "# put what it did, as JSON in the shape its replay reads, in place of <json> (or --text TEXT for a text\n"
        "# answer: docs/operations.md); if it did not happen, --rerun in place of --result '<json>' lets the next\n"
        "# replay run it again.",
        file=out,
    )
    if hidden:
        print(
            "# The ledger URL's password is shown as ***: put it back, or set $REPLAYSAFE_LEDGER_URL and leave "
            "--ledger out.",
            file=out,
        )
    for record in records:
        key = record.key
        print(
            f"# {printable(record.tool_name)}, idempotency key {call_idempotency_key(*key, record.tool_name)}", file=out
        )
        if any(part.startswith("-") for part in key):  # an id argparse would read as an option goes after --
            print(" ".join([*words, "resolve", "--result", "'<json>'", "--", _ids(key)]), file=out)
        else:
            print(" ".join([*words, "resolve", _ids(key), "--result", "'<json>'"]), file=out)


def _without_password(url: str) -> tuple[str, bool]:
    """``url`` with every password in it shown as ``***`` (its user's, a ``password=`` option's, a nested cache
    URL's: ``redact``), and whether there was one: a command printed for an operator to paste may end up in a
    ticket."""
    hidden = redact(url)
    return hidden, hidden != url


def _nested(records: list[Record]) -> list[tuple[Record, int]]:
    """``records`` in their order, each step moved right after its parent (when the parent is among them,
    in the order the steps were made), with its depth: 0 for a call of its own, 1 for its steps..."""
    listed = {r.key for r in records}
    steps: dict[CallKey, list[Record]] = {}
    roots = []
    for record in records:
        parent = step_parent(record.key, record.tool_name)
        if parent is not None and parent in listed:
            steps.setdefault(parent, []).append(record)
        else:
            roots.append(record)
    nested: list[tuple[Record, int]] = []
    todo = [(root, 0) for root in reversed(roots)]
    while todo:  # depth first, without recursion: steps nest as deep as the tools do
        record, depth = todo.pop()
        nested.append((record, depth))
        made = sorted(steps.get(record.key, ()), key=lambda r: r.created_at)
        todo.extend((step, depth + 1) for step in reversed(made))
    return nested


def _table(out: TextIO, columns: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> None:
    rows = list(rows)
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    for row in (columns, *rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(), file=out)


def _summary(record: Record, now: dt.datetime) -> dict[str, Any]:
    parent = step_parent(record.key, record.tool_name)
    return {
        "thread_id": record.key.thread_id,
        "message_id": record.key.message_id,
        "tool_call_id": record.key.tool_call_id,
        "tool_name": record.tool_name,
        # What the call handed its provider: look the effect up by it before settling the call.
        "idempotency_key": call_idempotency_key(*record.key, record.tool_name),
        "status": _state(record, now),
        "stored_status": record.status.value,
        "attempt": record.attempt,
        "owner": record.owner,
        "created_at": record.created_at.isoformat(),
        "updated_at": record.updated_at.isoformat(),
        "lease_expires_at": record.lease_expires_at.isoformat(),
        "expires_at": record.expires_at.isoformat() if record.expires_at else None,
        # The call this record is a step of (docs/semantics.md, steps), None for a call of its own.
        "parent": None if parent is None else dict(zip(CallKey._fields, parent, strict=True)),
    }


def _record(ledger: Ledger, args: argparse.Namespace) -> Record:
    """The one record the ids given name: the record of those ids as given, else the only one they match, each
    id ending in … or * matching the ids that start so (docs/operations.md)."""
    key = CallKey(args.thread_id, args.message_id, args.tool_call_id)
    record = ledger.get(key)
    if record is not None:
        return record
    given = [IdGiven.of(part) for part in key]
    matched: list[Record] = []
    starting: list[CallKey] = []  # without … or *: the records whose ids start with the ids given
    prefixed = any(part.prefix for part in given)
    for other in _all_records(ledger):  # a ledger holding nothing at all is more likely the wrong one: say so
        if all(part.matches(value) for part, value in zip(given, other.key, strict=True)):
            matched.append(other)
        elif not prefixed and all(part.starts(value) for part, value in zip(given, other.key, strict=True)):
            starting.append(other.key)
    if len(matched) == 1:
        return matched[0]
    if matched:
        raise CommandError(
            f"the ids given ({key}) match {len(matched)} records: give more of each id, or the whole ids "
            f"(`replaysafe ledger list --wide` prints them). Nothing was changed. The records:",
            EXIT_USAGE,
            _candidates([other.key for other in matched]),
        )
    if prefixed:
        raise CommandError(f"no record matches {key} (an id ending in … or * is the start of an id)", EXIT_NOT_FOUND)
    if starting:
        raise CommandError(
            f"no record for {key}; the ids of {len(starting)} record(s) start with these. To name a record by the "
            "start of its ids, end each id you shortened with … or * (as `replaysafe ledger list` prints a long "
            "one), or give the whole ids:",
            EXIT_NOT_FOUND,
            _candidates(starting),
        )
    raise CommandError(f"no record for {key}", EXIT_NOT_FOUND)


#: What ``show`` says of each ``result_check``, for a human.
_CHECKS = {
    "ok": "the seal checks with the signing key",
    "tampered": "the seal does not check (or is missing): a replay refuses this record with TamperedRecordError",
    "unverified": f"sealed, but no signing key was given to check it: set ${SIGNING_KEY_ENV} or pass "
    "--signing-key-file",
    "unsealed": "no seal and no signing key given: nothing to check (a replay with a signing key refuses it)",
    "none": "no result: the call has not finished",
}


def _stored(ledger: Ledger, record: Record) -> tuple[str, str | None]:
    """(a key of ``_CHECKS``, the stored result text without its seal): only a seal checked with the key is
    "ok"; the text of a seal that does not check is not given."""
    if record.result is None and (record.status not in SEALED or ledger.sealer is None):
        return "none", None
    if ledger.sealer is not None:
        try:
            return "ok", ledger.sealer.open(record)
        except TamperedRecordError:
            return "tampered", None
    return ("unverified" if is_sealed(record.result) else "unsealed"), unsealed(record.result)


class StoredResult(NamedTuple):
    """What ``show`` says of the text a record keeps where a result goes, read as data only: JSON is parsed,
    never decoded into the classes it names (nothing is imported or run)."""

    kind: str | None  #: json, text (not JSON: a serializer's own), unrecorded, steps; None: nothing to show
    value: Any = None  #: the stored JSON value (json), the stored text (text)
    marker: Any = None  #: what a marker holds, as stored: the unrecorded result's reason, type and size; the steps
    note: str | None = None  #: what it is, in words


def _as_stored(record: Record, text: str | None) -> StoredResult:
    if text is None:
        return StoredResult(None)
    found = unrecorded(text)
    if found is not None:
        size = f", {found.size} bytes" if found.size is not None else ""
        return StoredResult(
            "unrecorded",
            marker=_json_or_none(text[len(UNRECORDED_PREFIX) :]),
            note=f"none: the call ran; its result was not recorded "
            f"({UNRECORDED_REASONS.get(found.reason, found.reason)}; a {found.type_name}{size}). It is finished "
            "and never runs again: a replay raises ResultEncodingError until it is settled",
        )
    if text.startswith(STATE_PREFIX) and record.status is not Status.COMPLETED and record.status is not Status.FAILED:
        state = parse_state(text)
        if state is not None:
            return StoredResult("approval", marker=_state_data(state), note=_state_note(record, state))
    if text.startswith(STEPS_PREFIX) and record.status in (Status.PAUSED, Status.IN_DOUBT):
        # Only there is it the steps marker (as a replay reads it): elsewhere it is a serializer's text.
        names = _json_or_none(text[len(STEPS_PREFIX) :])
        if isinstance(names, list) and all(isinstance(name, str) for name in names):
            return StoredResult(
                "steps",
                marker=names,
                note=f"none ({record.status.value}): the steps this call made, in order: {', '.join(names)}",
            )
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return StoredResult(
            "text",
            text,
            note="not JSON (a serializer of the application's own wrote it): shown as stored, escaped",
        )
    form = form_of(value)
    if record.status is Status.FAILED and isinstance(value, dict) and set(value) == {"type", "message"}:
        note = "the recorded failure: the error's type and message (a replay raises RecordedToolError)"
    elif form.text.startswith("a JSON ") or form.text in ("true or false", "null"):
        note = None
    else:
        note = (
            f"replaysafe's JSON codec stored {form} here; shown as stored, nothing was imported (a replay "
            "rebuilds it where its class is imported)"
        )
    return StoredResult("json", value, note=note)


def _state_data(state: CallState) -> dict[str, Any]:
    """A call's approval state as ``show --json`` prints it: decisions as recorded (no argument values but an
    approver's edit, which the approver wrote)."""
    return {
        "steps": list(state.steps),
        "requested": state.requested,
        "decision": None if state.decision is None else state.decision.to_data(),
        "spent": None if state.spent is None else state.spent.to_data(),
        "may_have_run": state.may_have_run,
    }


def _state_note(record: Record, state: CallState) -> str:
    """What a paused (or running, or in-doubt) call's approval state means, in words."""
    parts = [f"none ({record.status.value})"]
    decision = state.decision
    if decision is not None and decision.decision == "approved":
        until = "" if decision.expires_at is None else f" until {decision.expires_at.isoformat()}"
        edit = " with edited arguments" if decision.args is not None else ""
        parts.append(f"approved{edit} by {printable(decision.by)}{until}, not yet spent")
    elif decision is not None:
        parts.append(f"rejected by {printable(decision.by)}: it does not run on this decision")
    elif state.requested:
        parts.append(
            f"waits for a decision: {shlex.join(['replaysafe', 'ledger', 'approve', *record.key])} --by NAME "
            "(or reject)"
        )
    if state.spent is not None:
        parts.append(f"an attempt ran on the approval by {printable(state.spent.by)}, spent")
    if state.may_have_run:
        parts.append("its last approved attempt did not finish: its side effect may have happened")
    if state.steps:
        parts.append(f"steps made: {', '.join(state.steps)}")
    return "; ".join(parts)


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _show(ledger: Ledger, args: argparse.Namespace, output: Output) -> int:
    record = _record(ledger, args)
    summary = _summary(record, utcnow())
    check, text = _stored(ledger, record)
    stored = _as_stored(record, text)
    summary["result_check"] = check
    summary["result"] = stored.value
    summary["result_kind"] = stored.kind
    summary["result_marker"] = stored.marker
    summary["result_note"] = stored.note
    now = utcnow()
    thread = list(ledger.records(thread_id=record.key.thread_id))
    steps = [r for r in thread if step_parent(r.key, r.tool_name) == record.key]
    summary["steps"] = [_summary(step, now) for step in steps]
    summary["undone"] = _undone(ledger, record, now)
    # What runs that ended after the call was settled elsewhere returned: kept beside it, never in its place.
    lates = [r for r in thread if (of := late_result_of(r.key)) is not None and of[0] == record.key]
    summary["late_results"] = [_late(ledger, late, now) for late in lates]
    if output.as_json:
        output.document(summary)
        return EXIT_OK
    out = output.out
    for name, field in summary.items():
        if name == "result_check":
            print(f"{name:>16}: {check} ({_CHECKS[check]})", file=out)
        elif name == "parent" and field is not None:
            print(f"{name:>16}: {printable(str(CallKey(**field)))}", file=out)
        elif not name.startswith("result") and name not in ("steps", "late_results"):
            print(f"{name:>16}: {printable(str(field))}", file=out)
    if stored.kind == "json":
        # json.dumps escapes control and non-ASCII characters itself.
        print(f"{'result':>16}: {json.dumps(stored.value, indent=2)}", file=out)
    elif stored.kind == "text":
        print(f"{'result':>16}: {printable(stored.value)}", file=out)
    elif stored.kind is not None:
        print(f"{'result':>16}: {printable(str(stored.note))}", file=out)
    else:
        print(f"{'result':>16}: null", file=out)
    if stored.kind in ("json", "text") and stored.note is not None:
        print(f"{'':>16}  ({printable(stored.note)})", file=out)
    for step in steps:
        print(
            f"{'step':>16}: {printable(step.tool_name)}, {_state(step, now)}, attempt {step.attempt}, "
            f"CALL {printable(step.key.tool_call_id)}",
            file=out,
        )
    for late in summary["late_results"]:
        shown = json.dumps(late["result"]) if late["result_kind"] == "json" else printable(str(late["result"]))
        print(
            f"{'late_result':>16}: attempt {late['late_attempt']} {late['status']} at {late['updated_at']} after "
            f"the call was settled; it returned {shown} (the settlement above stands)",
            file=out,
        )
    return EXIT_OK


def _late(ledger: Ledger, late: Record, now: dt.datetime) -> dict[str, Any]:
    """A late result as ``show`` prints it: its record, the attempt that returned it, and what it returned."""
    summary = _summary(late, now)
    of = late_result_of(late.key)
    summary["late_attempt"] = None if of is None else of[1]
    check, text = _stored(ledger, late)
    stored = _as_stored(late, text)
    summary["result_check"] = check
    summary["result"] = stored.value
    summary["result_kind"] = stored.kind
    return summary


def _ledger_seals(ledger: Ledger, record: Record) -> tuple[bool | None, CallKey | None]:
    """Whether the ledger seals its records, told without the key, and the first sealed record found.

    Any record carrying a seal tells that it does: the record's own, then its thread's, then the ledger's. A
    ledger that signs seals every finished and paused record, and an in-doubt one that kept its steps (a result
    starting ``rs-steps-1:``), so a seal on any of them tells, even past older records written before signing
    was turned on. Without one, a record the ledger would have sealed (finished or paused, or holding a result)
    tells that it does not; ``None`` when no record tells.
    """
    told_unsealed = False
    for other in _nearest_first(ledger, record.key):
        if is_sealed(other.result):
            return True, other.key
        if other.status in SEALED or other.result is not None:
            told_unsealed = True
    return (False if told_unsealed else None), None


def _refuse_a_live_owner(record: Record, now: dt.datetime, force: bool) -> bool:
    """Whether the record's owner is alive (a running call); refused unless ``force``."""
    live_owner = judge(record, now, owner_alive) is Verdict.WAIT  # only a running record with a live owner waits
    if live_owner and not force:
        raise CommandError(
            f"{record.tool_name} ({record.key}) is still running in {record.owner}, which is alive (lease until "
            f"{record.lease_expires_at.isoformat()}). Wait for it; if you know it is stuck, pass --force. "
            "Nothing was changed.",
            EXIT_NOT_FOUND,
        )
    return live_owner


def _describe(record: Record, now: dt.datetime) -> str:
    return (
        f"{printable(record.tool_name)} ({record.key}) is {_state(record, now)}, attempt {record.attempt}, owner "
        f"{printable(record.owner)}, idempotency key {call_idempotency_key(*record.key, record.tool_name)}."
    )


_LIVE_OWNER_NOTE = (
    "Its owner is alive: forcing it, the owner will find its claim gone when it finishes and report a duplicate "
    "execution."
)


def _resolve(ledger: Ledger, args: argparse.Namespace, output: Output) -> int:
    given: Any = None
    if args.rerun and args.shape is not None:
        raise CommandError("--shape goes with --result or --text: --rerun records no result", EXIT_USAGE)
    if args.result is not None:
        try:
            given = json.loads(args.result)
        except ValueError as exc:
            raise CommandError(f"--result must be JSON ({exc})", EXIT_USAGE) from exc
    known = None if args.rerun else installed()
    if known is not None and args.shape is not None and args.shape not in known.shapes:
        raise CommandError(
            f"no installed package declares the result shape {args.shape!r} (known here: "
            f"{', '.join(known.shapes)}). Install the adapter's package where this command runs (replaysafe-mcp "
            "for mcp). Nothing was changed.",
            EXIT_USAGE,
        )
    if args.seal_with_unchecked_key and (args.rerun or ledger.sealer is None):
        raise CommandError(
            f"{UNCHECKED_KEY} goes with a signing key and --result or --text: "
            + ("--rerun seals nothing" if args.rerun else "no signing key was given"),
            EXIT_USAGE,
        )
    record = _record(ledger, args)
    seals, sealed = (None, None) if args.rerun or ledger.sealer is not None else _ledger_seals(ledger, record)
    if seals:
        # Written unsealed, the result would make every replay raise TamperedRecordError.
        raise CommandError(
            f"the ledger seals its records (the record of {sealed} carries a seal) and no signing key was given, "
            f"so the result of {record.key} cannot be sealed and would be refused on replay. Pass the key: set "
            f"${SIGNING_KEY_ENV} or use --signing-key-file PATH. (If this ledger does not sign its records, that "
            "seal was written by someone who can write the store: inspect it.) Nothing was changed.",
            EXIT_NO_KEY,
        )
    key_note = None
    if ledger.sealer is not None and not args.rerun:
        key_note = _signing_key_or_refuse(ledger, ledger.sealer, record.key, args.seal_with_unchecked_key)
    now = utcnow()
    live_owner = _refuse_a_live_owner(record, now, args.force)
    notes: list[str] = []
    shape: ResultShape | None = None
    if known is None:
        try:
            kept = answers_a_rerun_keeps(record, ledger.sealer)
        except ValueError as exc:
            raise CommandError(str(exc), EXIT_NO_KEY if ledger.sealer is None else EXIT_WRONG_KEY) from None
        what = (
            "keep it paused for a new decision (it was decided on a human's answers, whose ids its record keeps)"
            if kept
            else "remove its record, so the next replay runs the tool again"
        )
        result: Any = None
    else:
        finished = _finished_results(ledger, record)
        found = evidence(record.tool_name, record.key.thread_id, finished, known.shapes, args.shape)
        shape = found.shape
        result, what = _result_in_its_shape(record, found, given, args.text)
        notes = _shape_notes(record, found, known, result)
    output.say(_describe(record, now))
    for note in notes:
        output.say(printable(note))
    if key_note is not None:
        output.say(key_note)
    if seals is None and not args.rerun and ledger.sealer is None:
        output.say(
            "Note: no record shows whether this ledger seals its records. If your application signs "
            f"them, set ${SIGNING_KEY_ENV} or pass --signing-key-file, or a replay will refuse this result."
        )
    if live_owner:
        output.say(_LIVE_OWNER_NOTE)
    if not output.confirm(f"Settle it: {what}?", args.yes):
        output.say("not settled")
        return EXIT_DECLINED
    try:
        if args.rerun:
            settled = ledger.resolve(record.key, rerun=True, force=args.force)
        else:
            settled = ledger.resolve(record.key, result=result, force=args.force)
    except (ValueError, LookupError, RuntimeError) as exc:
        raise CommandError(str(exc), EXIT_NOT_FOUND) from exc
    output.answer(f"settled: {what}")
    output.document(
        {
            "settled": True,
            "how": "rerun" if args.rerun else "text" if args.text is not None else "result",
            "shape": shape.name if shape is not None else None,
            "record": _summary(settled, utcnow()) if settled is not None else None,
        }
    )
    return EXIT_OK


#: How many records ``_finished_results`` reads at most per pass (the call's thread, then the ledger), and how
#: many finished records of the tool it keeps: enough to tell a shape, bounded on a large ledger.
_SHAPE_READS, _SHAPE_RECORDS = 1000, 20


def _finished_results(ledger: Ledger, record: Record) -> list[str]:
    """The result text of other finished calls of the same tool: its thread's first, then the ledger's.

    Real results only (not a "result not recorded" marker); with the signing key, only those whose seal checks.
    """
    found: list[str] = []
    seen = {record.key}
    for thread_id in (record.key.thread_id, None):
        records = ledger.records(thread_id=thread_id)
        try:
            for other in itertools.islice(records, _SHAPE_READS):
                if other.key in seen or other.tool_name != record.tool_name or other.status is not Status.COMPLETED:
                    continue
                seen.add(other.key)
                text = _result_text(ledger, other)
                if text is not None and unrecorded(text) is None:
                    found.append(text)
                    if len(found) == _SHAPE_RECORDS:
                        return found
        finally:
            close = getattr(records, "close", None)  # a generator left early: its cursor is released now
            if close is not None:
                close()
    return found


def _result_text(ledger: Ledger, record: Record) -> str | None:
    if ledger.sealer is None:
        return unsealed(record.result)
    try:
        return ledger.sealer.open(record)
    except TamperedRecordError:
        return None


def _result_in_its_shape(record: Record, found: Evidence, given: Any, text: str | None) -> tuple[Any, str]:
    """The value to record and what the confirmation calls it; refused (nothing written) when a replay of the
    call could not read it, as far as its shape is known. Messages name fields and types, never the value."""
    call = f"{record.tool_name} ({record.key})"
    shape = found.shape
    if found.contradicted is not None and shape is not None:
        ledger_shape, why = found.contradicted
        raise CommandError(
            f"{call}: --shape {shape.name} contradicts the ledger: {why}, so a replay reads {ledger_shape.expects}. "
            f"Settle it in that shape: --text TEXT (or --result JSON) with --shape {ledger_shape.name}, or without "
            "--shape. Nothing was changed.",
            EXIT_USAGE,
        )
    if text is not None:
        if shape is None:
            raise CommandError(
                f"{call}: --text writes the text in the shape the call's adapter records, and which adapter recorded "
                f"it cannot be told here: {found.told_by}. Name the shape: {_shape_choices()}. Nothing was changed.",
                EXIT_USAGE,
            )
        value = shape.text(text, found.recorded)
        what = f"record the text given as its result, in the {shape.name} shape"
        source = "--text"
    else:
        value = given
        what = f"record the JSON given ({form_of(value)}) as its result"
        source = "--result"
    problem = shape.problem(value, found.recorded) if shape is not None else None
    if shape is None or problem is None:
        return value, what
    told = "as --shape says" if found.told_by == "--shape" else found.told_by
    if source == "--text":
        raise CommandError(
            f"{call} records its result in the {shape.name} shape ({told}), and the text alone cannot settle it: "
            f"{problem}. Settle it with --result in that shape: {shape.expects}. Nothing was changed.",
            EXIT_USAGE,
        )
    raise CommandError(
        f"{call} records its result in the {shape.name} shape ({told}), and a replay could not read this "
        f"--result: {problem}. A replay reads {shape.expects}. Settle it with --text TEXT (the provider's answer "
        "as text, written in that shape), or with --result in that shape. Nothing was changed.",
        EXIT_USAGE,
    )


def _shape_choices() -> str:
    return (
        "--shape json for replaysafe's JSON codec (@replay_safe, and the LangGraph, Pydantic AI, OpenAI Agents SDK, "
        "sdk_loops and 10xGraph adapters), --shape mcp for an MCP call (replaysafe-mcp), or the shape another "
        "adapter's package declares"
    )


def _shape_notes(record: Record, found: Evidence, known: Installed, value: Any) -> list[str]:
    """What the confirmation says of the result's shape: the shape and what told it, or that nothing does."""
    tool = record.tool_name
    notes = [f"Result shape left out: {skipped}." for skipped in known.skipped]
    shape = found.shape
    if shape is not None:
        told = "as --shape says" if found.told_by == "--shape" else found.told_by
        notes.append(f"Shape: {shape.name}, what {shape.who} record ({told}). A replay reads {shape.expects}.")
        if shape.unchecked and not found.recorded:
            notes.append(f"Not checked: no finished call of {tool} is found to compare with. {shape.unchecked}")
    else:
        notes.append(
            f"Shape unknown: what a replay of {tool} reads cannot be told here: {found.told_by}. The JSON given is "
            f"recorded as it is, which {known.shapes[JSON_NAME].who} read."
        )
        notes.extend(
            f"Careful: {adapter.who} read only {adapter.expects}. If this is one of them, answer no and settle it "
            f"with --text TEXT --shape {adapter.name}, or with --result in that shape."
            for adapter in known.adapters()
            if adapter.problem(value, ()) is not None
        )
        if not known.adapters():
            notes.append(
                "Careful: an adapter with a serializer of its own reads only its own shape (an MCP call reads a "
                "CallToolResult): install its package where this command runs (replaysafe-mcp), and pass --shape."
            )
    if shape is None or shape.name == JSON_NAME:
        notes.extend(_form_notes(tool, found, value))
    return notes


def _form_notes(tool: str, found: Evidence, value: Any) -> list[str]:
    """What the finished records of the same tool hold, when it differs from this result or names a class."""
    if len(found.forms) != 1:
        return []
    ((form, count),) = found.forms.items()
    mine = form_of(value)
    if form == mine:
        return []
    if form.from_object and mine.text == "a JSON object":
        return [
            f"The {count} finished record(s) of {tool} read here hold {form}. A replay rebuilds one from this "
            f"object only if {tool}'s return annotation names the class and the object holds its fields; "
            "otherwise it returns the object as it is."
        ]
    return [
        f"Careful: the {count} finished record(s) of {tool} read here all hold {form}, and this result is {mine}: "
        "a replay returns it as it is, a value of another type than the tool returned before."
    ]


def _delete(ledger: Ledger, args: argparse.Namespace, output: Output) -> int:
    record = _record(ledger, args)
    now = utcnow()
    live_owner = _refuse_a_live_owner(record, now, args.force)
    output.say(_describe(record, now))
    if live_owner:
        output.say(_LIVE_OWNER_NOTE)
    if not output.confirm("Delete its record, so the next replay runs the tool again?", args.yes):
        output.say("not deleted")
        return EXIT_DECLINED
    deleted = ledger.delete(record.key)
    if not deleted:
        raise CommandError(f"the record of {record.key} was already gone", EXIT_NOT_FOUND)
    output.answer(f"deleted the record of {printable(record.tool_name)} ({record.key})")
    output.document({"deleted": 1, "record": _summary(record, now)})
    return EXIT_OK


def _purge(ledger: Ledger, args: argparse.Namespace, output: Output) -> int:
    batch = max(1, args.batch_size)
    count: Callable[[], int]
    delete: Callable[[], int]
    if args.expired:
        purge_expired = getattr(ledger, "purge_expired", None)
        if purge_expired is None:
            output.answer("nothing to purge: this ledger expires records by itself (a Redis TTL)")
            output.document({"dry_run": args.dry_run, "which": "expired", "count": 0, "self_expiring": True})
            return EXIT_OK
        which, scope = "expired", "expired record(s)"
        count = lambda: purge_expired(batch_size=batch, dry_run=True)  # noqa: E731
        delete = lambda: purge_expired(batch_size=batch, dry_run=False)  # noqa: E731
    elif args.thread is not None:
        which, scope = "thread", f"record(s) of thread {args.thread!r}"  # repr escapes what a terminal runs
        doomed = _all_records(ledger, args.thread)
        count = lambda: len(doomed)  # noqa: E731
        delete = lambda: ledger.purge_thread(args.thread)  # noqa: E731
    else:
        cutoff = utcnow() - args.older_than
        which, scope = "older_than", f"finished record(s) not updated since {cutoff.isoformat()}"
        keys = [r.key for r in _all_records(ledger) if r.status in FINISHED and r.updated_at < cutoff]
        count = lambda: len(keys)  # noqa: E731
        delete = lambda: _delete_in_batches(ledger, keys, batch, output)  # noqa: E731
    planned = count()
    if planned == 0 and args.thread is not None and not args.dry_run:
        # Nothing left in the ledger, but a purge that failed half-way (a tiered ledger's cache) left what only
        # purge_thread clears: the retry its error advised must reach it.
        ledger.purge_thread(args.thread)
    if args.dry_run or planned == 0:
        verb = "would delete" if args.dry_run else "deleted"
        output.answer(f"{verb} {planned} {scope}" + (" (dry run: nothing was deleted)" if args.dry_run else ""))
        output.document({"dry_run": args.dry_run, "which": which, "count": planned})
        return EXIT_OK
    if not output.confirm(f"Delete {planned} {scope}?", args.yes):
        output.say("nothing deleted")
        return EXIT_DECLINED
    deleted = delete()
    output.answer(f"deleted {deleted} {scope}")
    output.document({"dry_run": False, "which": which, "count": deleted})
    return EXIT_OK


def _delete_in_batches(ledger: Ledger, keys: list[CallKey], batch: int, output: Output) -> int:
    total = 0
    for start in range(0, len(keys), batch):
        total += sum(ledger.delete(key) for key in keys[start : start + batch])
        if len(keys) > batch:
            print(f"deleted {total} of {len(keys)}", file=output.err, flush=True)  # progress, off the answer
    return total


def _stats(ledger: Ledger, args: argparse.Namespace, output: Output) -> int:
    now = utcnow()
    records = _all_records(ledger)
    states = Counter(_state(r, now) for r in records)
    tools = Counter((r.tool_name, _state(r, now)) for r in records)
    in_doubt = [r for r in records if _state(r, now) == Status.IN_DOUBT.value]
    oldest = min(in_doubt, key=lambda r: r.updated_at) if in_doubt else None
    # Owner alive, lease over: the call may be stuck under a live process, which nothing takes over.
    overdue = [r for r in records if _state(r, now) == "running" and r.lease_expires_at <= now]
    late = min(overdue, key=lambda r: r.lease_expires_at) if overdue else None
    if output.as_json:
        by_tool: dict[str, dict[str, int]] = {}
        for (tool, state), number in sorted(tools.items()):
            by_tool.setdefault(tool, {})[state] = number
        output.document(
            {
                "total": len(records),
                "by_status": {state: states.get(state, 0) for state in STATUSES},
                "by_tool": by_tool,
                "oldest_in_doubt": _summary(oldest, now) if oldest else None,
                "running_past_lease": len(overdue),
                "longest_past_lease": _summary(late, now) if late else None,
            }
        )
        return EXIT_OK
    out = output.out
    print(f"{len(records)} record(s)", file=out)
    for state in STATUSES:
        print(f"  {state:<10} {states.get(state, 0)}", file=out)
    if tools:
        print("per tool:", file=out)
        for (tool, state), number in sorted(tools.items()):
            print(f"  {printable(tool):<24} {state:<10} {number}", file=out)
    if oldest is not None:
        print(
            f"oldest in_doubt call: {printable(oldest.tool_name)} ({oldest.key}), {_ago(oldest.updated_at, now)} "
            f"old, attempt {oldest.attempt}, owner {printable(oldest.owner)}",
            file=out,
        )
    else:
        print("no call is in doubt", file=out)
    print(f"running past their lease: {len(overdue)}", file=out)
    if late is not None:
        print(
            f"longest past its lease: {printable(late.tool_name)} ({late.key}), lease ended "
            f"{_ago(late.lease_expires_at, now)} ago, attempt {late.attempt}, owner {printable(late.owner)} (alive). "
            "If it is stuck, settle it with `replaysafe ledger resolve ... --force`.",
            file=out,
        )
    return EXIT_OK


# --- undo -----------------------------------------------------------------------------------


def _add_undo(actions: Any) -> None:
    undo = _action(
        actions,
        "undo",
        "run a completed call's compensation (its undo), once",
        "Run the compensation of a completed call (@replay_safe(undo=...)), and first those of its steps, newest "
        "first: each runs once, recorded under a key of its own, so running this again replays them. A call "
        "running, paused or in doubt is refused unless --force (its compensation is then handed null); a failed "
        "call has nothing to undo. The compensations are those registered by the tools decorated in this "
        f"process: pass --app MODULE, the application module whose import decorates them. {_KEY_HELP}",
    )
    _add_key(undo)
    undo.add_argument(
        "--app",
        metavar="MODULE",
        action="append",
        default=[],
        help="import MODULE first (a dotted module name, importable from the current directory), so that its "
        "tools' compensations are registered; repeat it for several modules",
    )
    undo.add_argument(
        "--force",
        action="store_true",
        help="undo a call (or step) that is running, paused or in doubt: its compensation is handed null for a "
        "result, and must find the side effect by itself (a running owner may still finish it)",
    )
    undo.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _import_apps(modules: list[str]) -> None:
    """Import the application's modules, whose import decorates its tools (registering their compensations)."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the application's package is where the command runs
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise CommandError(f"--app {name}: cannot import it ({type(exc).__name__}: {exc})", EXIT_USAGE) from exc
        except Exception as exc:
            raise CommandError(
                f"--app {name}: importing it raised {type(exc).__name__}; nothing was undone", EXIT_USAGE
            ) from exc


def _undo(ledger: Ledger, args: argparse.Namespace, output: Output) -> int:
    _import_apps(args.app)
    record = _record(ledger, args)
    if ledger.sealer is None:
        seals, sealed = _ledger_seals(ledger, record)
        if seals:  # the compensation's record, written unsealed, would be refused on replay
            raise CommandError(
                f"the ledger seals its records (the record of {sealed} carries a seal) and no signing key was given, "
                f"so the undo of {record.key} cannot be recorded sealed. Pass the key: set ${SIGNING_KEY_ENV} or use "
                "--signing-key-file PATH. Nothing was undone.",
                EXIT_NO_KEY,
            )
    now = utcnow()
    try:
        planned = undo_plan(ledger, record.key, args.force)
    except (ValueError, LookupError) as exc:
        raise CommandError(str(exc), EXIT_NOT_FOUND) from exc
    output.say(_describe(record, now))
    for entry in planned:
        what = f"run {entry.undoer.spec.name}" if entry.undoer is not None else f"skip ({entry.note})"
        output.say(f"  {printable(entry.record.tool_name)} (CALL {printable(entry.record.key.tool_call_id)}): {what}")
    if not output.confirm("Undo it: run these compensations, each at most once?", args.yes):
        output.say("not undone")
        return EXIT_DECLINED
    try:
        if any(entry.undoer is not None and entry.undoer.is_async for entry in planned):
            done = asyncio.run(aundo(ledger, record.key, force=args.force))
        else:
            done = ledger.undo(record.key, force=args.force)
    except (ValueError, LookupError, ReplaySafeError) as exc:
        if isinstance(exc, LedgerError):
            raise
        raise CommandError(str(exc), EXIT_NOT_FOUND) from exc
    except Exception as exc:
        # The application's exception: its text may hold data, so only its type is said.
        raise CommandError(
            f"a compensation raised {type(exc).__name__}, so the undo of {record.key} stopped there. The "
            "compensations that ran before it are recorded (they replay); the one that raised is not: fix it, then "
            "run this command again. Run ledger.undo(key) in Python to see its traceback.",
            EXIT_NOT_FOUND,
        ) from exc
    labels = {"undone": "undone", "already_undone": "already undone (replayed)", "skipped": "skipped"}
    for item in done:
        note = f" ({item.note})" if item.note else ""
        output.answer(
            f"{labels.get(item.outcome, item.outcome)}: {printable(item.tool_name)} "
            f"(CALL {printable(item.key.tool_call_id)}){printable(note)}"
        )
    output.document(
        {
            "undone": [
                {
                    **dict(zip(CallKey._fields, item.key, strict=True)),
                    "tool_name": item.tool_name,
                    "outcome": item.outcome,
                    "note": item.note or None,
                }
                for item in done
            ]
        }
    )
    return EXIT_OK


def _undone(ledger: Ledger, record: Record, now: dt.datetime) -> str:
    """Whether ``show``'s call was undone (``replaysafe ledger undo``): its undo's record, in words."""
    found = ledger.get(undo_key(record.key))
    if found is None:
        return "no"
    state = _state(found, now)
    if state == Status.COMPLETED.value:
        return (
            f"yes: its compensation {found.tool_name} ran, finished {found.updated_at.isoformat()} "
            f"(attempt {found.attempt})"
        )
    return (
        f"not yet: its compensation {found.tool_name} is {state} (attempt {found.attempt}); "
        f"see {shlex.join(['replaysafe', 'ledger', 'show', *found.key])}"
    )


def _approve(ledger: Ledger, args: argparse.Namespace, output: Output) -> int:
    edit: Any = None
    if args.args is not None:
        try:
            edit = json.loads(args.args)
        except ValueError as exc:
            raise CommandError(f"--args must be a JSON object of the call's arguments ({exc})", EXIT_USAGE) from exc
        if not isinstance(edit, dict):
            raise CommandError("--args must be a JSON object of the call's arguments, by parameter name", EXIT_USAGE)
    expires = args.expires if args.expires is not None else approvals.DEFAULT_EXPIRY
    return _decide(
        ledger,
        args,
        output,
        "Approve it" + (" with these arguments instead" if edit is not None else "") + f", for {expires}?",
        lambda key: approvals.approve(key, by=args.by, expires_in=expires, args=edit, ledger=ledger),
    )


def _reject(ledger: Ledger, args: argparse.Namespace, output: Output) -> int:
    return _decide(
        ledger,
        args,
        output,
        "Reject it?",
        lambda key: approvals.reject(key, by=args.by, reason=args.reason, ledger=ledger),
    )


def _decide(
    ledger: Ledger, args: argparse.Namespace, output: Output, question: str, decide: Callable[[CallKey], Record]
) -> int:
    record = _record(ledger, args)
    now = utcnow()
    output.say(_describe(record, now))
    if not output.confirm(question, args.yes):
        output.say("not decided")
        return EXIT_DECLINED
    try:
        decided = decide(record.key)
    except (ValueError, LookupError, RuntimeError, TypeError) as exc:
        raise CommandError(f"{exc}. Nothing was decided.", EXIT_NOT_FOUND) from exc
    output.answer(f"{args.action}d {printable(record.tool_name)} ({record.key}) as {printable(args.by)}")
    output.document({"decided": args.action + "d", "by": args.by, "record": _summary(decided, utcnow())})
    return EXIT_OK


_ACTIONS: dict[str, Callable[[Ledger, argparse.Namespace, Output], int]] = {
    "list": _list,
    "show": _show,
    "resolve": _resolve,
    "delete": _delete,
    "purge": _purge,
    "stats": _stats,
    "undo": _undo,
    "approve": _approve,
    "reject": _reject,
}
