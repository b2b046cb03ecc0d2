"""``replaysafe ledger ...``: inspect and settle a ledger after an incident.

Exit codes: 0 done; 1 no such record (or nothing matched); 2 bad usage; 3 the ledger
cannot be opened (unreachable, wrong URL, missing table); 4 the operator did not confirm;
5 the ledger seals its records and no signing key was given.

The command never vouches for what it cannot check: without the signing key a sealed
record's seal is reported unverified, and a result is never written unsealed into a
ledger that seals. Every string read from the store is escaped in human output, so an
id holding a newline or a terminal escape sequence cannot forge or hide lines.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from ._clock import utcnow
from ._codec import JsonSerializer
from ._constants import LEDGER_URL_ENV
from ._core import Verdict, judge
from ._errors import TamperedRecordError
from ._records import CallKey, Record, Status
from ._sealing import FINISHED, SIGNING_KEY_ENV, is_sealed, unsealed
from .ledgers import Ledger, open_ledger

EXIT_OK, EXIT_NOT_FOUND, EXIT_USAGE, EXIT_LEDGER, EXIT_DECLINED, EXIT_NO_KEY = 0, 1, 2, 3, 4, 5
STATUSES = ("running", "completed", "failed", "in-doubt", "paused")
_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class CommandError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def age(text: str) -> dt.timedelta:
    """``90s``, ``15m``, ``1h``, ``30d``, ``2w`` as a duration."""
    match = _AGE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age like 90s, 15m, 1h, 30d or 2w")
    return dt.timedelta(seconds=float(match[1]) * _UNITS[match[2]])


def add_commands(commands: Any) -> None:
    ledger = commands.add_parser(
        "ledger",
        help="inspect and settle the records of a ledger",
        description="Inspect and settle a ledger's records. Exit codes: 0 done, 1 no such record, 2 bad usage, "
        "3 ledger unreachable / wrong URL / missing table, 4 not confirmed, 5 the ledger seals its records and "
        "no signing key was given.",
    )
    ledger.add_argument("--ledger", metavar="URL", help=f"the ledger's URL (default: ${LEDGER_URL_ENV})")
    ledger.add_argument(
        "--signing-key-file",
        metavar="PATH",
        help=f"a file holding the ledger's signing key(s), comma- or newline-separated, the first signs (default: "
        f"${SIGNING_KEY_ENV}); needed to check seals and to record a result in a ledger that seals. A file, not "
        "the key itself: a command line is visible to every user of the machine",
    )
    actions = ledger.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="list records, newest first", description="List records, newest first.")
    listing.add_argument("--thread", help="only this thread")
    listing.add_argument("--status", choices=STATUSES, help="only records in this state")
    listing.add_argument("--tool", help="only this tool")
    listing.add_argument("--since", type=age, metavar="AGE", help="only records updated within AGE (1h, 30d)")
    listing.add_argument("--limit", type=int, default=50, help="records per page (default 50)")
    listing.add_argument("--page", type=int, default=1, help="page number, from 1")
    listing.add_argument("--json", action="store_true", help="one JSON document, for scripts")

    show = actions.add_parser("show", help="one record, its result decoded", description="Show one record.")
    _add_key(show)
    show.add_argument("--json", action="store_true", help="as JSON")

    resolve = actions.add_parser(
        "resolve",
        help="settle an in-doubt call",
        description="Settle an in-doubt call: record its result, or let the next replay run it again. A call "
        "whose owner is still alive is refused unless --force.",
    )
    _add_key(resolve)
    how = resolve.add_mutually_exclusive_group(required=True)
    how.add_argument("--result", metavar="JSON", help="the call's result, as JSON (what the provider did)")
    how.add_argument("--rerun", action="store_true", help="remove the record so the next replay runs the tool")
    resolve.add_argument(
        "--force",
        action="store_true",
        help="settle a call even though its owner is alive (a stuck call); the owner, if it finishes, reports a "
        "duplicate execution",
    )
    resolve.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    purge = actions.add_parser("purge", help="delete records in bounded batches", description="Delete records.")
    which = purge.add_mutually_exclusive_group(required=True)
    which.add_argument("--thread", help="every record of this thread")
    which.add_argument("--expired", action="store_true", help="records whose ttl has passed")
    which.add_argument("--older-than", type=age, metavar="AGE", help="finished records not updated for AGE (30d)")
    purge.add_argument("--batch-size", type=int, default=1000, help="records deleted per batch (default 1000)")
    purge.add_argument("--dry-run", action="store_true", help="only count what would be deleted")

    actions.add_parser(
        "stats",
        help="counts per status and tool; the oldest in-doubt call; running calls past their lease",
        description="Stats.",
    )


def _add_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("thread_id", metavar="THREAD")
    parser.add_argument("message_id", metavar="MESSAGE")
    parser.add_argument("tool_call_id", metavar="CALL")


def run(args: argparse.Namespace, out: TextIO = sys.stdout, stdin: TextIO = sys.stdin) -> int:
    try:
        ledger = _open(args.ledger or os.environ.get(LEDGER_URL_ENV), _signing_keys(args.signing_key_file))
        with ledger:
            return {"list": _list, "show": _show, "resolve": _resolve, "purge": _purge, "stats": _stats}[args.action](
                ledger, args, out, stdin
            )
    except CommandError as exc:
        print(f"replaysafe ledger: {printable(str(exc))}", file=sys.stderr)
        return exc.code


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


def _open(url: str | None, signing_keys: list[str] | None = None) -> Ledger:
    if not url:
        raise CommandError(f"no ledger: pass --ledger URL or set {LEDGER_URL_ENV}", EXIT_USAGE)
    scheme = url.partition(":")[0].lower().partition("+")[0]
    options: dict[str, Any] = {}
    if scheme == "memory":
        raise CommandError("a memory:// ledger lives inside one process: there is nothing to inspect", EXIT_USAGE)
    if scheme == "sqlite":
        path = Path(url.partition("?")[0].split(":///", 1)[-1])
        if not path.is_file():
            raise CommandError(f"no ledger file at {path}", EXIT_LEDGER)
    if scheme in ("sqlite", "postgres", "postgresql"):
        options["create_schema"] = False  # an operator's typo must not create an empty ledger
    if signing_keys is not None:
        options["signing_key"] = signing_keys
    try:
        ledger = open_ledger(url, **options)
        ledger.get(CallKey("replaysafe-cli-probe", "-", "-"))
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    except Exception as exc:
        cause = getattr(exc, "orig", None) or exc
        text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        if re.search(r"no such table|does not exist|UndefinedTable", f"{type(cause).__name__} {text}"):
            raise CommandError(
                f"the ledger's table is missing ({text}). The first protected call creates it, or apply the DDL "
                "in docs/ledgers.md.",
                EXIT_LEDGER,
            ) from exc
        raise CommandError(f"cannot reach the ledger ({type(cause).__name__}: {text})", EXIT_LEDGER) from exc
    return ledger


def _state(record: Record, now: dt.datetime) -> str:
    """The status an operator cares about: a running record whose owner died is in doubt."""
    if record.status in (Status.RUNNING, Status.IN_DOUBT) and judge(record, now) is Verdict.IN_DOUBT:
        return "in-doubt"
    return record.status.value


def _ago(moment: dt.datetime, now: dt.datetime) -> str:
    seconds = max(0, int((now - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _short(text: str, width: int = 24) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _list(ledger: Ledger, args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    now = utcnow()
    records = [
        r
        for r in ledger.records(thread_id=args.thread)
        if (args.status is None or _state(r, now) == args.status)
        and (args.tool is None or r.tool_name == args.tool)
        and (args.since is None or r.updated_at >= now - args.since)
    ]
    records.sort(key=lambda r: r.updated_at, reverse=True)
    limit, page = max(1, args.limit), max(1, args.page)
    shown = records[(page - 1) * limit : page * limit]
    if args.json:
        json.dump({"total": len(records), "page": page, "records": [_summary(r, now) for r in shown]}, out, indent=2)
        out.write("\n")
        return EXIT_OK
    columns = ("THREAD", "MESSAGE", "CALL", "TOOL", "STATUS", "ATTEMPTS", "AGE", "OWNER")
    rows = [
        (
            _short(printable(r.key.thread_id)),
            _short(printable(r.key.message_id)),
            _short(printable(r.key.tool_call_id)),
            printable(r.tool_name),
            _state(r, now),
            str(r.attempt),
            _ago(r.updated_at, now),
            printable(r.owner),
        )
        for r in shown
    ]
    _table(out, columns, rows)
    pages = max(1, -(-len(records) // limit))
    print(f"{len(records)} record(s); page {page} of {pages}", file=out)
    return EXIT_OK


def _table(out: TextIO, columns: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> None:
    rows = list(rows)
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    for row in (columns, *rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(), file=out)


def _summary(record: Record, now: dt.datetime) -> dict[str, Any]:
    return {
        "thread_id": record.key.thread_id,
        "message_id": record.key.message_id,
        "tool_call_id": record.key.tool_call_id,
        "tool_name": record.tool_name,
        "status": _state(record, now),
        "stored_status": record.status.value,
        "attempt": record.attempt,
        "owner": record.owner,
        "created_at": record.created_at.isoformat(),
        "updated_at": record.updated_at.isoformat(),
        "lease_expires_at": record.lease_expires_at.isoformat(),
        "expires_at": record.expires_at.isoformat() if record.expires_at else None,
    }


def _record(ledger: Ledger, args: argparse.Namespace) -> Record:
    key = CallKey(args.thread_id, args.message_id, args.tool_call_id)
    record = ledger.get(key)
    if record is None:
        raise CommandError(f"no record for {key}", EXIT_NOT_FOUND)
    return record


#: What ``show`` says of each ``result_check``, for a human.
_CHECKS = {
    "ok": "the seal checks with the signing key",
    "tampered": "the seal does not check (or is missing): a replay refuses this record with TamperedRecordError",
    "unverified": f"sealed, but no signing key was given to check it: set ${SIGNING_KEY_ENV} or pass "
    "--signing-key-file",
    "unsealed": "no seal and no signing key given: nothing to check (a replay with a signing key refuses it)",
    "undecodable": "the stored text is not a result this command can decode",
    "none": "no result: the call has not finished",
}


def _decoded(ledger: Ledger, record: Record) -> tuple[str, Any]:
    """(a key of ``_CHECKS``, value) of a record's result: only a seal checked with the key is "ok"."""
    if record.result is None and record.status not in FINISHED:
        return "none", None
    if ledger.sealer is not None:
        try:
            text = ledger.sealer.open(record)
        except TamperedRecordError:
            return "tampered", None
        check = "ok"
    else:
        text = unsealed(record.result)
        check = "unverified" if is_sealed(record.result) else "unsealed"
    if text is None:
        return check, None
    try:
        return check, json.loads(JsonSerializer().dumps(JsonSerializer().loads(text)))
    except Exception:
        return "undecodable", text


def _show(ledger: Ledger, args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    record = _record(ledger, args)
    summary = _summary(record, utcnow())
    check, value = _decoded(ledger, record)
    summary["result_check"] = check
    summary["result"] = value
    if args.json:
        json.dump(summary, out, indent=2)
        out.write("\n")
        return EXIT_OK
    for name, field in summary.items():
        if name == "result_check":
            print(f"{name:>16}: {check} ({_CHECKS[check]})", file=out)
        elif name != "result":
            print(f"{name:>16}: {printable(str(field))}", file=out)
    # json.dumps escapes control characters itself; undecodable text is shown as stored, escaped.
    shown = printable(str(value)) if check == "undecodable" else json.dumps(value, indent=2)
    print(f"{'result':>16}: {shown}", file=out)
    return EXIT_OK


def _ledger_seals(ledger: Ledger, record: Record) -> bool | None:
    """Whether the ledger seals its records, told without the key: by the record's own seal, else by
    the first finished record of its thread, else of the ledger (a ledger that signs refuses every
    unsealed finished record, so one tells for all); ``None`` when no finished record exists."""
    if is_sealed(record.result):
        return True
    for thread_id in (record.key.thread_id, None):
        for other in ledger.records(thread_id=thread_id):
            if other.status in FINISHED:
                return is_sealed(other.result)
    return None


def _resolve(ledger: Ledger, args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    record = _record(ledger, args)
    if args.rerun:
        what = "remove its record, so the next replay runs the tool again"
        result: Any = None
    else:
        try:
            result = json.loads(args.result)
        except ValueError as exc:
            raise CommandError(f"--result must be JSON ({exc})", EXIT_USAGE) from exc
        what = f"record {json.dumps(result)} as its result"
    seals = None if args.rerun or ledger.sealer is not None else _ledger_seals(ledger, record)
    if seals:
        # Written unsealed, the result would make every replay raise TamperedRecordError.
        raise CommandError(
            f"the ledger seals its records and no signing key was given, so the result of {record.key} cannot be "
            f"sealed and would be refused on replay. Pass the key: set ${SIGNING_KEY_ENV} or use "
            "--signing-key-file PATH. Nothing was changed.",
            EXIT_NO_KEY,
        )
    now = utcnow()
    live_owner = judge(record, now) is Verdict.WAIT  # only a running record with a live owner waits
    if live_owner and not args.force:
        raise CommandError(
            f"{record.tool_name} ({record.key}) is still running in {record.owner}, which is alive (lease until "
            f"{record.lease_expires_at.isoformat()}). Wait for it; if you know it is stuck, pass --force. "
            "Nothing was changed.",
            EXIT_NOT_FOUND,
        )
    state = _state(record, now)
    print(
        f"{printable(record.tool_name)} ({record.key}) is {state}, attempt {record.attempt}, owner "
        f"{printable(record.owner)}.",
        file=out,
    )
    if seals is None and not args.rerun and ledger.sealer is None:
        print(
            f"Note: no finished record shows whether this ledger seals its records. If your application signs "
            f"them, set ${SIGNING_KEY_ENV} or pass --signing-key-file, or a replay will refuse this result.",
            file=out,
        )
    if live_owner:
        print(
            "Its owner is alive: forcing it, the owner will find its claim gone when it finishes and report a "
            "duplicate execution.",
            file=out,
        )
    if not args.yes:
        print(f"Settle it: {what}? [y/N] ", end="", file=out, flush=True)
        if stdin.readline().strip().lower() not in ("y", "yes"):
            print("not settled", file=out)
            return EXIT_DECLINED
    try:
        if args.rerun:
            ledger.resolve(record.key, rerun=True, force=args.force)
        else:
            ledger.resolve(record.key, result=result, force=args.force)
    except (ValueError, LookupError, RuntimeError) as exc:
        raise CommandError(str(exc), EXIT_NOT_FOUND) from exc
    print(f"settled: {what}", file=out)
    return EXIT_OK


def _purge(ledger: Ledger, args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    verb = "would delete" if args.dry_run else "deleted"
    if args.expired:
        purge_expired = getattr(ledger, "purge_expired", None)
        if purge_expired is None:
            print("this ledger expires records by itself (a Redis TTL): nothing to purge", file=out)
            return EXIT_OK
        count = purge_expired(batch_size=max(1, args.batch_size), dry_run=args.dry_run)
        print(f"{verb} {count} expired record(s)", file=out)
        return EXIT_OK
    if args.thread is not None:
        doomed = [r.key for r in ledger.records(thread_id=args.thread)]
        if not args.dry_run:
            ledger.purge_thread(args.thread)
        print(f"{verb} {len(doomed)} record(s) of thread {args.thread!r}", file=out)
        return EXIT_OK
    cutoff = utcnow() - args.older_than
    doomed = [
        r.key for r in ledger.records() if r.status in (Status.COMPLETED, Status.FAILED) and r.updated_at < cutoff
    ]
    total = 0
    batch = max(1, args.batch_size)
    for start in range(0, len(doomed), batch):
        chunk = doomed[start : start + batch]
        total += len(chunk) if args.dry_run else sum(ledger.delete(key) for key in chunk)
        print(f"{verb} {total} of {len(doomed)}", file=out)
    print(f"{verb} {total} finished record(s) not updated since {cutoff.isoformat()}", file=out)
    return EXIT_OK


def _stats(ledger: Ledger, args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    now = utcnow()
    records = list(ledger.records())
    states = Counter(_state(r, now) for r in records)
    tools = Counter((r.tool_name, _state(r, now)) for r in records)
    print(f"{len(records)} record(s)", file=out)
    for state in STATUSES:
        print(f"  {state:<10} {states.get(state, 0)}", file=out)
    if tools:
        print("per tool:", file=out)
        for (tool, state), count in sorted(tools.items()):
            print(f"  {printable(tool):<24} {state:<10} {count}", file=out)
    in_doubt = [r for r in records if _state(r, now) == "in-doubt"]
    if in_doubt:
        oldest = min(in_doubt, key=lambda r: r.updated_at)
        print(
            f"oldest in-doubt call: {printable(oldest.tool_name)} ({oldest.key}), {_ago(oldest.updated_at, now)} "
            f"old, attempt {oldest.attempt}, owner {printable(oldest.owner)}",
            file=out,
        )
    else:
        print("no call is in doubt", file=out)
    # Owner alive, lease over: the call may be stuck under a live process, which nothing takes over.
    overdue = [r for r in records if _state(r, now) == "running" and r.lease_expires_at <= now]
    print(f"running past their lease: {len(overdue)}", file=out)
    if overdue:
        late = min(overdue, key=lambda r: r.lease_expires_at)
        print(
            f"longest past its lease: {printable(late.tool_name)} ({late.key}), lease ended "
            f"{_ago(late.lease_expires_at, now)} ago, attempt {late.attempt}, owner {printable(late.owner)} (alive). "
            "If it is stuck, settle it with `replaysafe ledger resolve ... --force`.",
            file=out,
        )
    return EXIT_OK
