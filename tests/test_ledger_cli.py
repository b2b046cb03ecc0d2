"""The operator's `replaysafe ledger` commands on every durable ledger.

The commands run in this process as a new one would run them (tests/cli.py), but for one `list` and one
`resolve` test, which run ``python -m replaysafe`` for real: the entry point an operator runs stays proven."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replaysafe import CallKey, Ledger, Status, open_ledger, replay_safe, tool_call
from replaysafe.testing import SteppedClock

from .cli import cli, subprocess_cli

CHILD = str(Path(__file__).with_name("child.py"))


@pytest.fixture
def incident(durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path) -> tuple[CallKey, CallKey]:
    """A ledger after an incident: one completed call and one in doubt (its process was SIGKILLed)."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    crashed = subprocess.run(
        [sys.executable, CHILD, "matrix", durable_ledger_url, str(tmp_path / "fx"), thread, "after-effect"],
        capture_output=True,
        text=True,
    )
    assert crashed.returncode == -9, crashed.stderr
    done = CallKey(thread, "msg_8", "call_1")
    with tool_call(*done):
        replay_safe(ledger=durable_ledger, name="send_email")(lambda to: {"sent": to})("ana@example.com")
    return CallKey(thread, "msg_7", "call_1"), done


def test_list_shows_the_incident(durable_ledger_url: str, incident: tuple[CallKey, CallKey]) -> None:
    """list prints a table, newest first, with the dead owner's call in doubt; --json for scripts.

    Run as ``python -m replaysafe`` in a subprocess, not in this process: the smoke test of the real entry point
    (its import, argument parsing, output and exit status through a pipe) for `list`."""
    in_doubt, done = incident
    table = subprocess_cli("ledger", "--ledger", durable_ledger_url, "list", "--thread", in_doubt.thread_id)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["THREAD", "MESSAGE", "CALL", "TOOL", "STATUS", "ATTEMPTS", "AGE", "OWNER"]
    assert "send_email" in lines[1] and "completed" in lines[1]
    assert "refund_order" in lines[2] and "in_doubt" in lines[2]
    assert "2 record(s); page 1 of 1" in lines[-1]
    data = json.loads(
        subprocess_cli("ledger", "--ledger", durable_ledger_url, "list", "--json", "--status", "in-doubt").stdout
    )
    found = [r for r in data["records"] if r["thread_id"] == in_doubt.thread_id]
    assert [(r["tool_name"], r["status"], r["stored_status"]) for r in found] == [
        ("refund_order", "in_doubt", "running")
    ]
    by_tool = json.loads(
        subprocess_cli(
            "ledger", "--ledger", durable_ledger_url, "list", "--json", "--tool", "send_email", "--since", "1h"
        ).stdout
    )
    assert {r["tool_call_id"] for r in by_tool["records"] if r["thread_id"] == done.thread_id} == {"call_1"}


def test_show_decodes_the_result(durable_ledger_url: str, incident: tuple[CallKey, CallKey]) -> None:
    """show prints one record with its result decoded; a missing one exits 1."""
    _, done = incident
    shown = cli("ledger", "--ledger", durable_ledger_url, "show", *done, "--json")
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    assert record["result"] == {"sent": "ana@example.com"}
    assert record["result_check"] == "unsealed"  # a ledger without signing: nothing was checked
    missing = cli("ledger", "--ledger", durable_ledger_url, "show", done.thread_id, "nope", "nope")
    assert missing.returncode == 1
    assert "no record" in missing.stderr


def test_resolve_settles_an_in_doubt_call_end_to_end(
    durable_ledger: Ledger, durable_ledger_url: str, incident: tuple[CallKey, CallKey]
) -> None:
    """Declined, nothing changes (exit 4); confirmed, the result is recorded and a replay returns it.

    Run as ``python -m replaysafe`` in a subprocess, not in this process: the smoke test of the real entry point
    for `resolve`, its question answered through a real stdin pipe."""
    in_doubt, _ = incident
    declined = subprocess_cli(
        "ledger", "--ledger", durable_ledger_url, "resolve", *in_doubt, "--result", '"re_1"', stdin="n\n"
    )
    assert declined.returncode == 4
    assert "not settled" in declined.stdout
    settled = subprocess_cli(
        "ledger", "--ledger", durable_ledger_url, "resolve", *in_doubt, "--result", '"re_1"', stdin="y\n"
    )
    assert settled.returncode == 0, settled.stderr
    assert "settled" in settled.stdout
    runs: list[int] = []

    @replay_safe(ledger=durable_ledger, in_doubt="raise")
    def refund_order(order_id: str, amount: float) -> str:
        runs.append(1)
        return "ran again"

    with tool_call(*in_doubt):
        assert refund_order("1042", 59.0) == "re_1"
    assert runs == []


def test_resolve_rerun(durable_ledger: Ledger, durable_ledger_url: str, incident: tuple[CallKey, CallKey]) -> None:
    """--rerun --yes removes the record, so the next replay runs the tool."""
    in_doubt, _ = incident
    assert cli("ledger", "--ledger", durable_ledger_url, "resolve", *in_doubt, "--rerun", "--yes").returncode == 0
    assert durable_ledger.get(in_doubt) is None


def test_stats(durable_ledger_url: str, incident: tuple[CallKey, CallKey]) -> None:
    """stats counts per status and tool and names the oldest in-doubt call."""
    in_doubt, _ = incident
    stats = cli("ledger", "--ledger", durable_ledger_url, "stats")
    assert stats.returncode == 0, stats.stderr
    assert "in_doubt" in stats.stdout
    assert "oldest in_doubt call: refund_order" in stats.stdout
    assert in_doubt.thread_id in stats.stdout


def test_purge(durable_ledger: Ledger, durable_ledger_url: str, incident: tuple[CallKey, CallKey]) -> None:
    """purge --dry-run counts in one line; purge asks first (declined: nothing deleted, exit 4), deletes
    when confirmed or with --yes, and says how many."""
    in_doubt, _ = incident
    old = cli("ledger", "--ledger", durable_ledger_url, "purge", "--older-than", "0s", "--dry-run")
    assert old.returncode == 0, old.stderr
    assert old.stdout.count("\n") == 1 and old.stdout.startswith("would delete 1 finished record(s) not updated")
    dry = cli("ledger", "--ledger", durable_ledger_url, "purge", "--thread", in_doubt.thread_id, "--dry-run")
    assert dry.stdout == f"would delete 2 record(s) of thread {in_doubt.thread_id!r} (dry run: nothing was deleted)\n"
    declined = cli("ledger", "--ledger", durable_ledger_url, "purge", "--thread", in_doubt.thread_id, stdin="n\n")
    assert declined.returncode == 4, declined.stderr
    assert f"Delete 2 record(s) of thread {in_doubt.thread_id!r}? [y/N]" in declined.stdout
    assert "nothing deleted" in declined.stdout
    unanswered = cli("ledger", "--ledger", durable_ledger_url, "purge", "--thread", in_doubt.thread_id)
    assert unanswered.returncode == 4  # no terminal, no answer: nothing is deleted
    assert len(list(durable_ledger.records(thread_id=in_doubt.thread_id))) == 2
    real = cli("ledger", "--ledger", durable_ledger_url, "purge", "--thread", in_doubt.thread_id, stdin="y\n")
    assert real.returncode == 0, real.stderr
    assert f"deleted 2 record(s) of thread {in_doubt.thread_id!r}" in real.stdout
    assert list(durable_ledger.records(thread_id=in_doubt.thread_id)) == []
    expired = cli("ledger", "--ledger", durable_ledger_url, "purge", "--expired")
    assert expired.returncode == 0, expired.stderr


def test_clear_errors_and_exit_codes(tmp_path: Path) -> None:
    """No URL, a wrong URL, a missing file, a missing table, an unreachable server: each says so."""
    no_url = cli("ledger", "list", env={"REPLAYSAFE_LEDGER_URL": ""})
    assert (no_url.returncode, "--ledger URL" in no_url.stderr) == (2, True)
    wrong = cli("ledger", "--ledger", "mysql://db/x", "list")
    assert (wrong.returncode, "registered: memory://" in wrong.stderr) == (2, True)
    missing = cli("ledger", "--ledger", f"sqlite:///{tmp_path}/none.db", "list")
    assert (missing.returncode, "no ledger file" in missing.stderr) == (3, True)
    assert not (tmp_path / "none.db").exists()
    sqlite3.connect(tmp_path / "empty.db").close()
    no_table = cli("ledger", "--ledger", f"sqlite:///{tmp_path}/empty.db", "stats")
    assert no_table.returncode == 3
    assert f"no replaysafe records here: SqliteLedger('{tmp_path}/empty.db') has no table tool_executions" in (
        no_table.stderr
    )
    for url in ("postgresql://root@127.0.0.1:1/test", "redis://127.0.0.1:1/0"):
        down = cli("ledger", "--ledger", url, "stats")
        assert down.returncode == 3, (url, down.stderr)
        assert "cannot reach the ledger" in down.stderr
        assert "Traceback" not in down.stderr


@pytest.mark.parametrize(
    "command",
    [[], ["ledger"], *(["ledger", action] for action in ("list", "show", "resolve", "delete", "purge", "stats"))],
)
def test_help_everywhere(command: list[str]) -> None:
    """Every command and action answers --help."""
    done = cli(*command, "--help")
    assert done.returncode == 0
    assert "usage: replaysafe" in done.stdout


def test_purge_expired(durable_ledger_url: str) -> None:
    """Records past their ttl are counted by --dry-run and deleted by purge --expired (Redis expires its own).

    The record is written on a clock started two minutes ago: with a ttl of one minute, it expired a minute
    ago for the CLI, which reads the machine's clock. (Redis sets the key's expiry by its own clock, from
    when it is written: the CLI only says Redis expires records itself.)"""
    url = f"{durable_ledger_url}{'&' if '?' in durable_ledger_url else '?'}ttl=60"
    written = SteppedClock(start=_now() - dt.timedelta(minutes=2))
    with written, open_ledger(url) as ledger, tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c"):
        replay_safe(ledger=ledger, name="short_lived")(lambda: 1)()
    dry = cli("ledger", "--ledger", durable_ledger_url, "purge", "--expired", "--dry-run")
    real = cli("ledger", "--ledger", durable_ledger_url, "purge", "--expired", "--yes")
    assert (dry.returncode, real.returncode) == (0, 0), dry.stderr + real.stderr
    if durable_ledger_url.startswith("redis"):
        assert "expires records by itself" in real.stdout
    else:
        assert dry.stdout == "would delete 1 expired record(s) (dry run: nothing was deleted)\n"
        assert "deleted 1 expired record(s)" in real.stdout
        again = cli("ledger", "--ledger", durable_ledger_url, "purge", "--expired", "--dry-run")
        assert "would delete 0 expired record(s)" in again.stdout


# --- the CLI never vouches for what it cannot verify ------------------------------------------------------

SIGNING_KEY = "a-signing-key-of-32-bytes-000000"
NO_KEY = {"REPLAYSAFE_SIGNING_KEY": ""}
WITH_KEY = {"REPLAYSAFE_SIGNING_KEY": SIGNING_KEY}
DEAD = "gone-host:1:1#1"  # an owner on another machine whose lease has ended: in doubt


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _write(
    ledger: Ledger, key: CallKey, status: Status, result: str | None, tool: str = "refund_order", digest: str = "d"
) -> None:
    """Write a record straight into the store through the ledger's own operations, unsealed, as anyone
    with write access to the store could (``complete`` stores the text it is given)."""
    now = _now()
    ledger.claim(key, tool_name=tool, args_digest=digest, owner=DEAD, now=now, lease_expires_at=now)
    if status is not Status.RUNNING:
        assert ledger.complete(key, owner=DEAD, status=status, result=result, now=now)


def _no_args_digest(ledger: Ledger) -> str:
    """The argument digest of a call without arguments, read from a real call's record."""
    probe = CallKey(f"probe-{uuid.uuid4().hex[:8]}", "m", "c")
    with tool_call(*probe):
        replay_safe(ledger=ledger, name="refund_order")(lambda: None)()
    return ledger.get(probe).args_digest  # type: ignore[union-attr]


def _show(url: str, key: CallKey, env: dict[str, str], *extra: str, human: bool = False) -> tuple[dict[str, Any], str]:
    """``show --json`` of a record and, if asked, its human output."""
    as_json = cli("ledger", "--ledger", url, *extra, "show", *key, "--json", env=env)
    assert as_json.returncode == 0, as_json.stderr
    if not human:
        return json.loads(as_json.stdout), ""
    text = cli("ledger", "--ledger", url, *extra, "show", *key, env=env)
    assert text.returncode == 0, text.stderr
    return json.loads(as_json.stdout), text.stdout


def assert_replays_the_settled_result(ledger: Ledger, in_doubt: CallKey) -> None:
    """The call settled with ``"re_1"`` replays it under ``in_doubt="raise"``: the tool does not run."""
    runs: list[int] = []

    @replay_safe(ledger=ledger, in_doubt="raise")
    def refund_order() -> str:
        runs.append(1)
        return "ran again"

    with tool_call(*in_doubt):
        assert refund_order() == "re_1"
    assert runs == []


def test_show_never_vouches_for_a_seal_it_cannot_check(durable_ledger_url: str, tmp_path: Path) -> None:
    """Without the key a sealed record is `unverified` (never `ok`), even when altered; with the key
    (environment or --signing-key-file) a genuine record is `ok` and an altered or unsealed one `tampered`."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    genuine, altered, unsealed = (CallKey(thread, "m", c) for c in ("genuine", "altered", "unsealed"))
    with open_ledger(durable_ledger_url, signing_key=SIGNING_KEY) as signed, tool_call(*genuine):
        replay_safe(ledger=signed, name="refund_order")(lambda: "refunded 1")()
    with open_ledger(durable_ledger_url) as raw:
        sealed_text = raw.get(genuine).result  # type: ignore[union-attr]
        assert sealed_text is not None and sealed_text.startswith("rs-seal-1:")
        _write(raw, altered, Status.COMPLETED, sealed_text.replace("refunded 1", "refunded 9"))
        _write(raw, unsealed, Status.COMPLETED, '"refunded 9"')
    key_file = tmp_path / "signing.key"
    key_file.write_text(f"{SIGNING_KEY}\n")

    record, human = _show(durable_ledger_url, altered, NO_KEY, human=True)
    assert record["result_check"] == "unverified"
    assert "result_check: unverified (sealed, but no signing key" in human
    assert "result_check: ok" not in human
    assert _show(durable_ledger_url, genuine, NO_KEY)[0]["result_check"] == "unverified"
    assert _show(durable_ledger_url, unsealed, NO_KEY)[0]["result_check"] == "unsealed"

    by_file = ("--signing-key-file", str(key_file))
    record = _show(durable_ledger_url, genuine, NO_KEY, *by_file)[0]
    assert (record["result_check"], record["result"]) == ("ok", "refunded 1")
    record = _show(durable_ledger_url, genuine, WITH_KEY)[0]
    assert (record["result_check"], record["result"]) == ("ok", "refunded 1")
    record, human = _show(durable_ledger_url, altered, WITH_KEY, human=True)
    assert (record["result_check"], record["result"]) == ("tampered", None)
    assert "result_check: tampered" in human and "refunded 9" not in human
    record = _show(durable_ledger_url, unsealed, NO_KEY, *by_file)[0]
    assert (record["result_check"], record["result"]) == ("tampered", None)


def test_resolve_refuses_to_write_an_unsealed_result_into_a_sealed_ledger(
    durable_ledger_url: str, tmp_path: Path
) -> None:
    """Without the key, `resolve --result` on a ledger that seals exits 5 naming the fix and changes
    nothing (before, it exited 0 and the next replay raised TamperedRecordError); with the key it seals
    the result, and a replay returns it without running the tool."""
    in_doubt = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_7", "call_1")
    other_thread = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
    with open_ledger(durable_ledger_url, signing_key=SIGNING_KEY) as signed:
        # The only finished record is in another thread: the CLI looks ledger-wide for a seal.
        with tool_call(*other_thread):
            replay_safe(ledger=signed, name="send_email")(lambda: "sent")()
        _write(signed, in_doubt, Status.IN_DOUBT, None, digest=_no_args_digest(signed))
        refused = cli(
            "ledger", "--ledger", durable_ledger_url, "resolve", *in_doubt, "--result", '"re_1"', "--yes", env=NO_KEY
        )
        assert refused.returncode == 5, refused.stdout + refused.stderr
        assert "REPLAYSAFE_SIGNING_KEY" in refused.stderr and "--signing-key-file" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert signed.get(in_doubt).status is Status.IN_DOUBT  # type: ignore[union-attr]
        missing = cli("ledger", "--ledger", durable_ledger_url, "--signing-key-file", str(tmp_path / "none"), "stats")
        assert missing.returncode == 2 and "signing key file" in missing.stderr
        key_file = tmp_path / "signing.key"
        key_file.write_text(SIGNING_KEY)
        settled = cli(
            "ledger", "--ledger", durable_ledger_url, "--signing-key-file", str(key_file),
            "resolve", *in_doubt, "--result", '"re_1"', "--yes", env=NO_KEY,
        )  # fmt: skip
        assert settled.returncode == 0, settled.stderr

        assert_replays_the_settled_result(signed, in_doubt)


WRONG_KEY = "b-signing-key-of-32-bytes-111111"


def test_a_key_that_checks_no_seal_is_refused_and_nothing_is_written(durable_ledger_url: str, tmp_path: Path) -> None:
    """A wrong key made `resolve --result` seal with it and say "settled", so the application's next replay raised
    TamperedRecordError: it is refused (exit 6) before anything is written. `show` answers (a store whose seals
    were forged must stay open to inspection), reports the intact record tampered and warns of the key; the right
    key, or a rotation list that starts with it, still works (tests/test_ledger_cli_keys.py: the rest)."""
    genuine = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
    in_doubt = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_7", "call_1")
    with open_ledger(durable_ledger_url, signing_key=SIGNING_KEY) as signed:
        with tool_call(*genuine):
            replay_safe(ledger=signed, name="refund_order")(lambda: "refunded 1")()
        _write(signed, in_doubt, Status.IN_DOUBT, None, digest=_no_args_digest(signed))
        wrong = {"REPLAYSAFE_SIGNING_KEY": WRONG_KEY}
        shown = cli("ledger", "--ledger", durable_ledger_url, "show", *genuine, env=wrong)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "warning: the signing key given checks none of the" in shown.stderr
        assert "result_check: tampered" in shown.stdout and "refunded 1" not in shown.stdout
        key_file = tmp_path / "wrong.key"
        key_file.write_text(WRONG_KEY)
        resolved = cli(
            "ledger", "--ledger", durable_ledger_url, "--signing-key-file", str(key_file),
            "resolve", *in_doubt, "--result", '"re_1"', "--yes", env=NO_KEY,
        )  # fmt: skip
        assert resolved.returncode == 6, resolved.stdout + resolved.stderr
        assert "the signing key given checks none of the" in resolved.stderr
        assert "settled" not in resolved.stdout
        assert signed.get(in_doubt).status is Status.IN_DOUBT  # type: ignore[union-attr]
        # A rotation list that holds the ledger's key passes the check, and seals with its first key.
        rotation = {"REPLAYSAFE_SIGNING_KEY": f"{SIGNING_KEY},{WRONG_KEY}"}
        assert _show(durable_ledger_url, genuine, rotation)[0]["result_check"] == "ok"
        settled = cli(
            "ledger", "--ledger", durable_ledger_url, "resolve", *in_doubt, "--result", '"re_1"', "--yes", env=WITH_KEY
        )
        assert settled.returncode == 0, settled.stderr

        assert_replays_the_settled_result(signed, in_doubt)


def test_resolve_without_a_key_in_a_ledger_that_does_not_seal(durable_ledger_url: str) -> None:
    """A ledger whose finished records carry no seal is settled without a key, as before."""
    in_doubt = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_7", "call_1")
    with open_ledger(durable_ledger_url) as plain:
        with tool_call(in_doubt.thread_id, "msg_1", "call_1"):
            replay_safe(ledger=plain, name="send_email")(lambda: "sent")()
        _write(plain, in_doubt, Status.IN_DOUBT, None, digest=_no_args_digest(plain))
        settled = cli(
            "ledger", "--ledger", durable_ledger_url, "resolve", *in_doubt, "--result", "7", "--yes", env=NO_KEY
        )
        assert settled.returncode == 0, settled.stderr
        assert "Note:" not in settled.stdout  # the thread's finished record told: not sealed
        with tool_call(*in_doubt):
            assert replay_safe(ledger=plain, name="refund_order")(lambda: 0)() == 7


# --- control characters in ids ----------------------------------------------------------------------------

EVIL = CallKey("t\n0 fake-row  completed", "m\x1b[2J\x1b[31m", "c\r\u202eevil\x07")
EVIL_TOOL = "tool\x1b]0;pwned\x07"


def test_control_characters_in_ids_are_escaped_in_every_human_output(
    durable_ledger: Ledger, durable_ledger_url: str
) -> None:
    """Ids and tool names holding newlines, terminal escape sequences, bidi overrides or bells are printed
    escaped by list, show, stats, resolve and purge; --json keeps them exact."""
    _write(durable_ledger, EVIL, Status.IN_DOUBT, None, tool=EVIL_TOOL)
    url = ["ledger", "--ledger", durable_ledger_url]
    outputs = {
        "list": cli(*url, "list"),
        "show": cli(*url, "show", *EVIL),
        "stats": cli(*url, "stats"),
        "resolve-declined": cli(*url, "resolve", *EVIL, "--rerun", stdin="n\n"),
        "purge-dry": cli(*url, "purge", "--thread", EVIL.thread_id, "--dry-run"),
    }
    for name, done in outputs.items():
        assert done.returncode in (0, 4), (name, done.stderr)
        text = done.stdout + done.stderr
        for raw in ("\x1b", "\r", "\u202e", "\x07", "\n0 fake-row"):
            assert raw not in text, (name, raw)
        # purge names only the thread, which holds a newline and no escape sequence.
        assert ("\\n0 fake-row" if name == "purge-dry" else "\\x1b") in text, (name, text)
    assert "t\\n0 fake-row  completed" in outputs["list"].stdout
    assert "tool\\x1b]0;pwned\\x07" in outputs["list"].stdout
    assert "c\\r\\u202eevil\\x07" in outputs["show"].stdout
    assert len(outputs["list"].stdout.splitlines()) == 3  # header, one row, the count
    listed = json.loads(cli(*url, "list", "--json").stdout)
    assert [(r["thread_id"], r["message_id"], r["tool_call_id"], r["tool_name"]) for r in listed["records"]] == [
        (*EVIL, EVIL_TOOL)
    ]
    shown = json.loads(cli(*url, "show", *EVIL, "--json").stdout)
    assert (shown["thread_id"], shown["message_id"], shown["tool_call_id"]) == EVIL
    settled = cli(*url, "resolve", *EVIL, "--rerun", "--yes")
    assert settled.returncode == 0, settled.stderr
    assert "\x1b" not in settled.stdout and "\\x1b" in settled.stdout
    assert durable_ledger.get(EVIL) is None


# --- nothing stays running under a live owner ---------------------------------------------------------------


@pytest.fixture
def live_owner() -> Iterator[str]:
    """The owner token of a real, live process (a sleeping child), killed afterwards."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from replaysafe._owners import owner_token; print(owner_token(), flush=True); "
            "time.sleep(300)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        yield child.stdout.readline().strip()
    finally:
        child.kill()
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()


def _stuck(ledger: Ledger, owner: str, digest: str = "d") -> CallKey:
    """A call left running by a live owner whose lease has ended (as a cancelled claim left it)."""
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
    now = _now()
    lease_ended = now - dt.timedelta(seconds=5)
    assert ledger.claim(
        key, tool_name="refund_order", args_digest=digest, owner=owner, now=lease_ended, lease_expires_at=lease_ended
    ).claimed
    return key


@pytest.mark.parametrize("whose", ["a sleeping child", "this test's process"])
def test_resolve_refuses_a_live_owner_without_force(durable_ledger: Ledger, live_owner: str, whose: str) -> None:
    """`resolve()` does not settle a call whose owner is a live process, even past its lease; `force=True` does."""
    from replaysafe._owners import owner_token

    owner = live_owner if whose == "a sleeping child" else owner_token()
    key = _stuck(durable_ledger, owner)
    for how in ({"result": "x"}, {"rerun": True}):
        with pytest.raises(ValueError, match="alive"):
            durable_ledger.resolve(key, **how)  # type: ignore[arg-type]
    record = durable_ledger.get(key)
    assert record is not None and (record.status, record.owner) == (Status.RUNNING, owner)
    settled = durable_ledger.resolve(key, result="x", force=True)
    assert settled is not None and settled.status is Status.COMPLETED


def test_stats_reports_a_call_stuck_under_a_live_owner_and_resolve_force_settles_it(
    durable_ledger: Ledger, durable_ledger_url: str, live_owner: str
) -> None:
    """stats names a running call past its lease whose owner lives; `resolve` refuses it (exit 1) unless
    --force, which asks first; once settled, a replay returns the result without running the tool."""
    key = _stuck(durable_ledger, live_owner, _no_args_digest(durable_ledger))
    url = ["ledger", "--ledger", durable_ledger_url]
    stats = cli(*url, "stats")
    assert stats.returncode == 0, stats.stderr
    assert "running past their lease: 1" in stats.stdout
    assert f"longest past its lease: refund_order ({key})" in stats.stdout
    assert live_owner in stats.stdout and "--force" in stats.stdout
    assert "no call is in doubt" in stats.stdout
    for how in (["--result", '"re_1"'], ["--rerun"]):
        refused = cli(*url, "resolve", *key, *how, "--yes")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "alive" in refused.stderr and "--force" in refused.stderr
    declined = cli(*url, "resolve", *key, "--result", '"re_1"', "--force", stdin="n\n")
    assert declined.returncode == 4, declined.stderr
    assert "Its owner is alive" in declined.stdout
    record = durable_ledger.get(key)
    assert record is not None and (record.status, record.owner) == (Status.RUNNING, live_owner)
    forced = cli(*url, "resolve", *key, "--result", '"re_1"', "--force", stdin="y\n")
    assert forced.returncode == 0, forced.stderr
    runs: list[int] = []

    @replay_safe(ledger=durable_ledger, name="refund_order")
    def refund_order() -> str:
        runs.append(1)
        return "ran again"

    with tool_call(*key):
        assert refund_order() == "re_1"
    assert runs == []
    assert "running past their lease: 0" in cli(*url, "stats").stdout
