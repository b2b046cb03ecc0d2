"""`replaysafe ledger` with the long ids real frameworks make (Pydantic AI's ``<uuid>@<timestamp>`` message ids,
the MCP server's keys), on SQLite, PostgreSQL and Redis: `list` shortens them and
`--wide` prints them whole; `show`, `resolve` and `delete` take an id as `list` prints it (a prefix ending in
``…``, or in ``*``) when it names one record, and refuse an ambiguous one naming the candidates, ids only; `list
--status in_doubt` prints a `resolve` command to paste for each call, which bash runs as pasted.

The commands run in this process as a new one would run them (tests/cli.py); a pasted command runs for real,
in bash, with this environment's `replaysafe` command."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path

from replaysafe import CallKey, Ledger, Status, replay_safe, tool_call

from .cli import cli
from .test_ledger_cli import SIGNING_KEY, _no_args_digest, _write, assert_replays_the_settled_result

SECRET = "4111-1111-SECRET-CARD"  # an argument and a result: never in a message about ids
BIN = str(Path(sys.executable).parent)  # where this environment's `replaysafe` command is


def conversation() -> str:
    return f"conv-{uuid.uuid4()}"


def pydantic_ai_message() -> str:
    """A Pydantic AI message id: the response's uuid, ``@``, its timestamp."""
    return f"{uuid.uuid4()}@2026-12-04T10:15:42.123456+00:00"


def mcp_key() -> str:
    """An idempotency key an MCP client sends, which the server's calls are recorded under."""
    return f"rs-{uuid.uuid4().hex}{uuid.uuid4().hex}"


def rows(listing: str) -> list[list[str]]:
    """The THREAD, MESSAGE and CALL cells of each row of `list`'s table (ids without spaces)."""
    lines = listing.splitlines()
    assert lines[0].split()[:3] == ["THREAD", "MESSAGE", "CALL"], listing
    end = next(i for i, line in enumerate(lines) if re.match(r"\d+ record\(s\); page", line))
    return [line.split()[:3] for line in lines[1:end]]


def refund(ledger: Ledger, key: CallKey) -> None:
    """A real, finished call of ``refund`` holding ``SECRET`` in its argument and its result."""
    with tool_call(*key):
        replay_safe(ledger=ledger, name="refund")(lambda card: {"card": card})(SECRET)


def test_list_shortens_long_ids_and_wide_prints_them_whole(durable_ledger: Ledger, durable_ledger_url: str) -> None:
    """The table shortens an id past 24 characters with "…" and says that --wide prints them whole; --wide does;
    `list --thread` and `--message` take a shortened id as the table prints it."""
    key = CallKey(conversation(), pydantic_ai_message(), f"pyd_ai_{uuid.uuid4().hex}")
    refund(durable_ledger, key)
    url = ("--ledger", durable_ledger_url)
    short = cli("ledger", *url, "list", "--thread", key.thread_id)
    assert short.returncode == 0, short.stderr
    ((thread, message, call),) = rows(short.stdout)
    for cell, full in zip((thread, message, call), key, strict=True):
        assert len(cell) == 24 and cell.endswith("…") and full.startswith(cell[:-1])
    assert "--wide" in short.stdout
    wide = cli("ledger", *url, "list", "--wide", "--thread", key.thread_id)
    assert wide.returncode == 0, wide.stderr
    assert rows(wide.stdout) == [list(key)]
    assert "…" not in wide.stdout
    for option, cell in (("--thread", thread), ("--message", message)):
        copied = cli("ledger", *url, "list", "--wide", option, cell)
        assert copied.returncode == 0, copied.stderr
        assert rows(copied.stdout) == [list(key)], (option, copied.stdout)


def test_show_resolve_and_delete_take_ids_as_list_prints_them(durable_ledger: Ledger, durable_ledger_url: str) -> None:
    """Ids copied from `list`'s table (shortened with "…") name their record in `show`, `resolve` and `delete`;
    a prefix may end in "*" too. An id that exists as given is that id, even one that ends in "…"."""
    thread = conversation()
    in_doubt = CallKey(thread, pydantic_ai_message(), f"pyd_ai_{uuid.uuid4().hex}")
    done = CallKey(thread, pydantic_ai_message(), f"pyd_ai_{uuid.uuid4().hex}")
    _write(durable_ledger, in_doubt, Status.IN_DOUBT, None, digest=_no_args_digest(durable_ledger))
    refund(durable_ledger, done)
    url = ("--ledger", durable_ledger_url)
    listed = cli("ledger", *url, "list", "--thread", thread)
    assert listed.returncode == 0, listed.stderr
    cells = {tuple(row) for row in rows(listed.stdout)}
    assert all(cell.endswith("…") for row in cells for cell in row)
    by_key = {key: next(row for row in cells if key.message_id.startswith(row[1][:-1])) for key in (in_doubt, done)}

    for key, row in by_key.items():
        shown = cli("ledger", *url, "show", *row, "--json")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        record = json.loads(shown.stdout)
        assert CallKey(record["thread_id"], record["message_id"], record["tool_call_id"]) == key
        human = cli("ledger", *url, "show", *row)
        assert human.returncode == 0 and f"tool_call_id: {key.tool_call_id}" in human.stdout

    settled = cli("ledger", *url, "resolve", *by_key[in_doubt], "--result", '"re_1"', "--yes")
    assert settled.returncode == 0, settled.stdout + settled.stderr
    assert str(in_doubt) in settled.stdout  # the confirmation names the whole ids of the record it settles
    assert_replays_the_settled_result(durable_ledger, in_doubt)

    starred = (thread[:12] + "*", done.message_id[:9] + "*", "*")
    deleted = cli("ledger", *url, "delete", *starred, "--yes")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert durable_ledger.get(done) is None
    assert durable_ledger.get(in_doubt) is not None

    literal, longer = CallKey(thread, "m", "call…"), CallKey(thread, "m", "call…2")
    refund(durable_ledger, literal)
    refund(durable_ledger, longer)
    exact = json.loads(cli("ledger", *url, "show", *literal, "--json").stdout)
    assert exact["tool_call_id"] == "call…"


def test_an_ambiguous_prefix_is_refused_naming_the_candidates(durable_ledger: Ledger, durable_ledger_url: str) -> None:
    """A prefix that names several records is refused (exit 2, nothing changed), listing ten of them by their whole
    ids and counting the rest; never an argument or a result. An id given without "…" or "*" is never taken as a
    prefix: it names no record (exit 1), and the message says how to give a prefix."""
    server = f"mcp-server:payments-{uuid.uuid4().hex[:8]}"
    keys = [CallKey(server, "refund", mcp_key()) for _ in range(13)]
    for key in keys:
        refund(durable_ledger, key)
    url = ("--ledger", durable_ledger_url)
    attempts = {
        "show": cli("ledger", *url, "show", server, "refund", "rs-…"),
        "show --json": cli("ledger", *url, "show", server, "refund", "rs-*", "--json"),
        "delete": cli("ledger", *url, "delete", server, "refund", "rs-…", "--yes"),
        "resolve": cli("ledger", *url, "resolve", server, "refund", "rs-…", "--rerun", "--yes", "--force"),
    }
    for name, done in attempts.items():
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert done.stdout == "", name
        assert SECRET not in done.stderr and "card" not in done.stderr, name
        assert "13 records" in done.stderr and "Nothing was changed" in done.stderr, (name, done.stderr)
        named = [key for key in keys if key.tool_call_id in done.stderr]
        assert len(named) == 10, (name, done.stderr)
        assert "and 3 more" in done.stderr, name
    assert all(durable_ledger.get(key) is not None for key in keys)

    bare = cli("ledger", *url, "show", server, "refund", keys[0].tool_call_id[:20])
    assert bare.returncode == 1, bare.stdout + bare.stderr
    assert "no record for" in bare.stderr and "…" in bare.stderr and "*" in bare.stderr
    assert SECRET not in bare.stderr

    unique = cli("ledger", *url, "show", server, "refund", keys[0].tool_call_id[:40] + "…", "--json")
    assert unique.returncode == 0, unique.stderr
    assert json.loads(unique.stdout)["tool_call_id"] == keys[0].tool_call_id


def commands(listing: str) -> list[str]:
    return [line for line in listing.splitlines() if line.startswith("replaysafe ledger ")]


def pasted(line: str, result: str = '"re_1"') -> subprocess.CompletedProcess[str]:
    """``line`` run by bash as an operator pastes it, ``<json>`` replaced by ``result``, confirmed (``--yes`` before
    the ids: those of a call with an id starting with "-" follow ``--``)."""
    command = line.replace("'<json>'", shlex.quote(result)).replace(" resolve ", " resolve --yes ", 1)
    return subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
    )


def test_list_in_doubt_prints_a_resolve_command_to_paste(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path
) -> None:
    """`list --status in_doubt` ends with one `resolve` command per call: whole ids, shell-quoted, the ledger
    option as it was given, `--result '<json>'` to fill in, and `--rerun` named as the other way. Pasted into
    bash, each settles its call; ids with quotes, spaces, a leading dash or control characters included."""
    digest = _no_args_digest(durable_ledger)
    thread = f"O'Brien's chat {uuid.uuid4().hex[:8]}"
    keys = [
        CallKey(thread, pydantic_ai_message(), f"pyd_ai_{uuid.uuid4().hex}"),
        CallKey(thread, "-starts-with-a-dash", "call 2"),
        CallKey(thread, "m\x1b[2J", "c\n3"),
    ]
    for key in keys:
        _write(durable_ledger, key, Status.IN_DOUBT, None, digest=digest)
    listed = cli("ledger", "list", "--status", "in_doubt", "--thread", thread, "--ledger", durable_ledger_url)
    assert listed.returncode == 0, listed.stderr
    assert "\x1b" not in listed.stdout
    lines = commands(listed.stdout)
    assert len(lines) == 3, listed.stdout
    assert "--rerun" in listed.stdout
    for line in lines:
        assert line.isprintable()
        argv = shlex.split(line)  # a POSIX shell's words (without bash's $'...', which only the third needs)
        assert argv[:5] == ["replaysafe", "ledger", "--ledger", durable_ledger_url, "resolve"], line
        assert "<json>" in argv and "--result" in argv
    (first,) = (line for line in lines if keys[0].message_id in line)
    assert shlex.split(first)[5:] == [*keys[0], "--result", "<json>"]
    (dashed,) = (line for line in lines if "-starts-with-a-dash" in line)  # after --, the options before it
    assert shlex.split(dashed)[5:] == ["--result", "<json>", "--", *keys[1]]
    (escaped,) = (line for line in lines if "$'" in line)  # bash's quoting, with the control characters escaped
    assert "$'m\\x1b[2J' $'c\\n3'" in escaped
    for line in lines:
        done = pasted(line)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
    for key in keys:
        record = durable_ledger.get(key)
        assert record is not None and record.status is Status.COMPLETED, key
    assert_replays_the_settled_result(durable_ledger, keys[0])


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` after its user name."""
    parts = urllib.parse.urlsplit(url)
    user, _, host = parts.netloc.rpartition("@")
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user.partition(':')[0]}:{password}@{host}"))


def test_the_resolve_commands_keep_the_options_as_given(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path
) -> None:
    """The ledger from $REPLAYSAFE_LEDGER_URL: the command names none (the same variable gives it); a signing key
    file: the command names it; a password in the URL is never printed."""
    key = CallKey(conversation(), pydantic_ai_message(), "call_1")
    _write(durable_ledger, key, Status.IN_DOUBT, None, digest=_no_args_digest(durable_ledger))
    wanted = ["--status", "in_doubt", "--thread", key.thread_id]
    from_env = cli("ledger", "list", *wanted, env={"REPLAYSAFE_LEDGER_URL": durable_ledger_url})
    assert from_env.returncode == 0, from_env.stderr
    (line,) = commands(from_env.stdout)
    assert shlex.split(line) == ["replaysafe", "ledger", "resolve", *key, "--result", "<json>"]
    key_file = tmp_path / "signing key"
    key_file.write_text(SIGNING_KEY)
    keyed = cli("ledger", "--ledger", durable_ledger_url, "--signing-key-file", str(key_file), "list", *wanted)
    assert keyed.returncode == 0, keyed.stderr
    (line,) = commands(keyed.stdout)
    assert shlex.split(line)[:7] == [
        "replaysafe", "ledger", "--ledger", durable_ledger_url, "--signing-key-file", str(key_file), "resolve"
    ]  # fmt: skip
    if not durable_ledger_url.startswith("postgresql"):
        return  # of the test servers only PostgreSQL takes a password (its trust authentication ignores it)
    hidden = cli("ledger", "--ledger", with_password(durable_ledger_url, "hunter2"), "list", *wanted)
    assert hidden.returncode == 0, hidden.stderr
    assert "hunter2" not in hidden.stdout + hidden.stderr
    (line,) = commands(hidden.stdout)
    assert shlex.split(line)[3] == with_password(durable_ledger_url, "***")
    assert "password" in hidden.stdout
