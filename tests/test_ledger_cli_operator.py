"""The operator's `replaysafe ledger` command as an operator types it: options anywhere, --json on every
action, a command for every step a message names, filters, export, and clear words for an empty or
wrong ledger. Run on SQLite, PostgreSQL and Redis, in this process as a new one would run them (tests/cli.py)."""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from replaysafe import CallInDoubtError, CallKey, Ledger, RecordedToolError, Status, open_ledger, replay_safe, tool_call
from replaysafe._identity import call_idempotency_key

from .cli import cli
from .servers import libpq_url
from .test_ledger_cli import _no_args_digest, _stuck, _write, incident, live_owner

__all__ = ["incident", "live_owner"]


def _json(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> dict[str, object]:
    done = cli(*args, stdin=stdin, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    document: dict[str, object] = json.loads(done.stdout)  # stdout is exactly one JSON document
    return document


def test_options_go_before_or_after_the_action(durable_ledger_url: str, incident: tuple[CallKey, CallKey]) -> None:
    """`ledger list --ledger URL --json` is `ledger --ledger URL list --json`, for every action."""
    in_doubt, _ = incident
    before = cli("ledger", "--ledger", durable_ledger_url, "--json", "list", "--thread", in_doubt.thread_id)
    after = cli("ledger", "list", "--thread", in_doubt.thread_id, "--ledger", durable_ledger_url, "--json")
    assert (before.returncode, after.returncode) == (0, 0), before.stderr + after.stderr
    assert json.loads(before.stdout)["total"] == 2
    assert json.loads(after.stdout) == json.loads(before.stdout)
    for action in (["stats"], ["show", *in_doubt]):
        assert cli("ledger", *action, "--ledger", durable_ledger_url).returncode == 0
    no_url = cli("ledger", "stats", env={"REPLAYSAFE_LEDGER_URL": ""})
    assert no_url.returncode == 2 and "--ledger URL" in no_url.stderr


def test_every_action_speaks_json(
    durable_ledger: Ledger, durable_ledger_url: str, incident: tuple[CallKey, CallKey]
) -> None:
    """stats, purge, resolve and delete print one JSON document with --json; questions go to stderr."""
    in_doubt, done = incident
    url = ("--ledger", durable_ledger_url)
    stats = _json("ledger", "stats", *url, "--json")
    assert stats["total"] == 2
    assert stats["by_status"] == {"running": 0, "completed": 1, "failed": 0, "in_doubt": 1, "paused": 0}
    assert stats["by_tool"] == {"refund_order": {"in_doubt": 1}, "send_email": {"completed": 1}}
    oldest = stats["oldest_in_doubt"]
    assert isinstance(oldest, dict) and oldest["tool_call_id"] == in_doubt.tool_call_id
    assert stats["running_past_lease"] == 0
    dry = _json("ledger", "purge", *url, "--thread", in_doubt.thread_id, "--dry-run", "--json")
    assert dry == {"dry_run": True, "which": "thread", "count": 2}
    asked = cli("ledger", "resolve", *url, *in_doubt, "--result", '"re_1"', "--json", stdin="y\n")
    assert asked.returncode == 0, asked.stderr
    assert "[y/N]" in asked.stderr and "[y/N]" not in asked.stdout
    settled = json.loads(asked.stdout)
    assert (settled["settled"], settled["how"]) == (True, "result")
    record = settled["record"]
    assert isinstance(record, dict) and record["status"] == "completed"
    deleted = _json("ledger", "delete", *url, *done, "--yes", "--json")
    assert deleted["deleted"] == 1
    purged = _json("ledger", "purge", *url, "--thread", in_doubt.thread_id, "--yes", "--json")
    assert purged == {"dry_run": False, "which": "thread", "count": 1}
    assert list(durable_ledger.records(thread_id=in_doubt.thread_id)) == []


def test_version() -> None:
    done = cli("--version")
    assert done.returncode == 0
    assert done.stdout.startswith("replaysafe 0.") or done.stdout.startswith("replaysafe (not installed")


def test_show_prints_the_idempotency_key_an_in_doubt_error_names(
    durable_ledger: Ledger, durable_ledger_url: str, incident: tuple[CallKey, CallKey]
) -> None:
    """The key to look the effect up by at the provider: in `show`, `list --json` and CallInDoubtError alike."""
    in_doubt, _ = incident
    expected = call_idempotency_key(*in_doubt, "refund_order")
    shown = cli("ledger", "show", *in_doubt, "--ledger", durable_ledger_url)
    assert f"idempotency_key: {expected}" in shown.stdout
    listed = _json("ledger", "list", "--ledger", durable_ledger_url, "--json", "--thread", in_doubt.thread_id)
    assert expected in [r["idempotency_key"] for r in listed["records"]]  # type: ignore[attr-defined]

    @replay_safe(ledger=durable_ledger, in_doubt="raise")
    def refund_order(order_id: str, amount: float) -> str:
        return "ran again"

    with tool_call(*in_doubt), pytest.raises(CallInDoubtError) as raised:
        refund_order("1042", 59.0)
    assert raised.value.idempotency_key == expected and expected in str(raised.value)


def test_delete_lets_a_recorded_failure_run_again(durable_ledger: Ledger, durable_ledger_url: str) -> None:
    """The command RecordedToolError names: asks first, then deletes, and the next call runs the tool."""
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c")
    runs: list[int] = []

    @replay_safe(ledger=durable_ledger, record_errors=True)
    def send_invoice() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise ConnectionError("mail server down")
        return "sent"

    for _ in range(2):
        with tool_call(*key), pytest.raises((ConnectionError, RecordedToolError)) as raised:
            send_invoice()
    assert isinstance(raised.value, RecordedToolError)
    command = str(raised.value).rpartition("delete its record: ")[2]
    assert command.startswith("replaysafe ledger delete --ledger <url> ")
    argv = command.replace("<url>", durable_ledger_url).split()[1:]
    assert json.loads(argv[-3]) == key.thread_id
    ids = [json.loads(part) for part in argv[-3:]]
    declined = cli(*argv[:-3], *ids, stdin="n\n")
    assert declined.returncode == 4 and "not deleted" in declined.stdout
    assert "Delete its record" in declined.stdout
    done = cli(*argv[:-3], *ids, stdin="y\n")
    assert done.returncode == 0, done.stderr
    assert "deleted the record of send_invoice" in done.stdout
    with tool_call(*key):
        assert send_invoice() == "sent"
    assert runs == [1, 1]
    gone = cli("ledger", "delete", "--ledger", durable_ledger_url, "nope", "nope", "nope", "--yes")
    assert gone.returncode == 1 and "no record" in gone.stderr


def test_delete_refuses_a_live_owner_without_force(
    durable_ledger: Ledger, durable_ledger_url: str, live_owner: str
) -> None:
    key = _stuck(durable_ledger, live_owner)
    refused = cli("ledger", "delete", "--ledger", durable_ledger_url, *key, "--yes")
    assert refused.returncode == 1 and "alive" in refused.stderr and "--force" in refused.stderr
    assert durable_ledger.get(key) is not None
    forced = cli("ledger", "delete", "--ledger", durable_ledger_url, *key, "--yes", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "Its owner is alive" in forced.stdout
    assert durable_ledger.get(key) is None


def test_resolve_force_settles_a_finished_call(durable_ledger: Ledger, durable_ledger_url: str) -> None:
    """A finished call is refused with the command to run instead (--force), never `force=True`."""
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c")
    digest = _no_args_digest(durable_ledger)
    _write(durable_ledger, key, Status.COMPLETED, '"old"', digest=digest)
    refused = cli("ledger", "resolve", "--ledger", durable_ledger_url, *key, "--result", '"new"', "--yes")
    assert refused.returncode == 1
    assert "--force" in refused.stderr and "replaysafe ledger delete" in refused.stderr
    assert "force=True" not in refused.stderr and "delete(key)" not in refused.stderr
    forced = cli("ledger", "resolve", "--ledger", durable_ledger_url, *key, "--result", '"new"', "--yes", "--force")
    assert forced.returncode == 0, forced.stderr
    with tool_call(*key):
        assert replay_safe(ledger=durable_ledger, name="refund_order")(lambda: "ran")() == "new"


def test_status_names_filters_and_export(durable_ledger: Ledger, durable_ledger_url: str) -> None:
    """--status takes the API's names (in_doubt, and in-doubt); --message, --until and ISO times filter;
    --jsonl exports every match, one object per line; a page past the end says so and exits 1."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    for message in ("m1", "m2", "m3"):
        _write(durable_ledger, CallKey(thread, message, "c"), Status.COMPLETED, '"ok"')
    _write(durable_ledger, CallKey(thread, "m4", "c"), Status.IN_DOUBT, None)
    url = ("--ledger", durable_ledger_url, "--thread", thread)

    def listed(*options: str) -> list[str]:
        document = _json("ledger", "list", *url, "--json", *options)
        return sorted(r["message_id"] for r in document["records"])  # type: ignore[attr-defined]

    assert listed("--status", "in_doubt") == listed("--status", "in-doubt") == ["m4"]
    assert listed("--status", "completed") == ["m1", "m2", "m3"]
    bad = cli("ledger", "list", *url, "--status", "doubtful")
    assert bad.returncode == 2 and "in_doubt" in bad.stderr
    assert listed("--message", "m2") == ["m2"]
    now = dt.datetime.now(dt.timezone.utc)
    hour_ago = (now - dt.timedelta(hours=1)).isoformat()
    later = (now + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert listed("--since", hour_ago, "--until", later) == ["m1", "m2", "m3", "m4"]
    assert listed("--until", hour_ago) == [] and listed("--until", "1h") == []
    assert listed("--since", "2020-01-01", "--until", "2020-01-02") == []
    when = cli("ledger", "list", *url, "--since", "yesterday")
    assert when.returncode == 2 and "ISO time" in when.stderr
    export = cli("ledger", "list", *url, "--jsonl", "--status", "completed")
    assert export.returncode == 0, export.stderr
    lines = export.stdout.splitlines()
    assert sorted(json.loads(line)["message_id"] for line in lines) == ["m1", "m2", "m3"]
    page = _json("ledger", "list", *url, "--json", "--limit", "3", "--page", "2")
    assert (page["total"], page["page"], page["pages"], len(page["records"])) == (4, 2, 2, 1)  # type: ignore[arg-type]
    past = cli("ledger", "list", *url, "--limit", "3", "--page", "3")
    assert past.returncode == 1
    assert "page 3 is past the end: 4 matching record(s) make 2 page(s) of 3" in past.stderr
    assert past.stdout == ""


def test_a_mistyped_ledger_says_no_records_here(durable_ledger_url: str, incident: tuple[CallKey, CallKey]) -> None:
    """A Redis prefix, a PostgreSQL schema or a SQLite file that holds nothing says so, naming what was
    looked at (the prefix, the schema and table, the file); nothing is created."""
    parts = urllib.parse.urlsplit(durable_ledger_url)
    if durable_ledger_url.startswith("sqlite"):
        wrong = durable_ledger_url.replace(".db", "-typo.db")
        done = cli("ledger", "stats", "--ledger", wrong)
        assert done.returncode == 3 and "no replaysafe records here: no ledger file at" in done.stderr
        assert not Path(parts.path.replace(".db", "-typo.db")).exists()
        return
    typo = f"typo_{uuid.uuid4().hex[:8]}"
    option = "prefix" if parts.scheme.startswith("redis") else "schema"
    query = urllib.parse.urlencode({**dict(urllib.parse.parse_qsl(parts.query)), option: typo})
    wrong = urllib.parse.urlunsplit(parts._replace(query=query))
    actions = (["stats"], ["list"], ["list", "--json"], ["show", "t", "m", "c"], ["purge", "--thread", "t", "--yes"])
    for action in actions:
        done = cli("ledger", *action, "--ledger", wrong)
        assert "no replaysafe records here" in done.stderr, (action, done.stderr)
        assert typo in done.stderr
        assert "Traceback" not in done.stderr
        if option == "prefix":
            assert done.returncode == 1 and f"prefix='{typo}'" in done.stderr
        else:
            assert done.returncode == 3 and f"has no table {typo}.tool_executions" in done.stderr


def test_a_bad_ledger_url_variable_is_named(durable_ledger_url: str) -> None:
    for url, code in (("mysql://agent:hunter2@db/app", 2), ("memory://", 2)):
        done = cli("ledger", "stats", env={"REPLAYSAFE_LEDGER_URL": url})
        assert done.returncode == code
        assert "$REPLAYSAFE_LEDGER_URL names no usable ledger" in done.stderr
        assert "hunter2" not in done.stderr
    given = cli("ledger", "stats", "--ledger", "mysql://agent:hunter2@db/app")
    assert given.returncode == 2 and "REPLAYSAFE_LEDGER_URL" not in given.stderr


# --- PostgreSQL: a missing database, a role without privileges ------------------------------------------


def test_a_missing_database_is_not_reported_as_a_missing_table(postgres_server_url: str) -> None:
    parts = urllib.parse.urlsplit(postgres_server_url)
    missing = f"rs_missing_{uuid.uuid4().hex[:8]}"
    done = cli("ledger", "stats", "--ledger", urllib.parse.urlunsplit(parts._replace(path=f"/{missing}")))
    assert done.returncode == 3
    assert f'database "{missing}" does not exist' in done.stderr
    assert "The database in the URL does not exist" in done.stderr
    assert "no table" not in done.stderr and "no replaysafe records" not in done.stderr


@pytest.fixture
def role_without_privileges(postgres_url: str) -> Iterator[tuple[str, str, str]]:
    """A ledger made by its owner, and a throwaway login role with no privilege on it: (its URL, the role,
    the schema). The role is dropped afterwards; the fixture drops the schema."""
    with open_ledger(postgres_url) as owner:
        owner.check()  # creates the schema and table
    parts = urllib.parse.urlsplit(postgres_url)
    schema = dict(urllib.parse.parse_qsl(parts.query))["schema"]
    server = urllib.parse.urlunsplit(parts._replace(query=""))
    role = f"rs_nopriv_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq_url(server), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN NOCREATEDB NOCREATEROLE")  # our own generated identifier
    host = parts.netloc.rpartition("@")[2]
    try:
        yield urllib.parse.urlunsplit(parts._replace(netloc=f"{role}@{host}")), role, schema
    finally:
        with psycopg.connect(libpq_url(server), autocommit=True) as conn:
            conn.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {role}")
            conn.execute(f"REVOKE ALL ON SCHEMA {schema} FROM {role}")
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_permission_errors_name_the_privilege(role_without_privileges: tuple[str, str, str], postgres_url: str) -> None:
    """Through the CLI, a role without USAGE on the schema, then without SELECT on the table, is told the
    grant to run (and create_schema=False); with the grants the command works."""
    url, role, schema = role_without_privileges
    no_usage = cli("ledger", "stats", "--ledger", url)
    assert no_usage.returncode == 3, no_usage.stderr
    assert f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}" in no_usage.stderr
    assert "create_schema=False" in no_usage.stderr and "no replaysafe records" not in no_usage.stderr
    server = urllib.parse.urlunsplit(urllib.parse.urlsplit(postgres_url)._replace(query=""))
    with psycopg.connect(libpq_url(server), autocommit=True) as conn:
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")  # generated identifiers only
    no_select = cli("ledger", "stats", "--ledger", url)
    assert no_select.returncode == 3, no_select.stderr
    assert f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE tool_executions TO {role}" in no_select.stderr
    with psycopg.connect(libpq_url(server), autocommit=True) as conn:
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.tool_executions TO {role}")
    with open_ledger(postgres_url) as owner, tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c"):
        replay_safe(ledger=owner, name="send_email")(lambda: "sent")()
    allowed = cli("ledger", "stats", "--ledger", url)
    assert allowed.returncode == 0, allowed.stderr
    assert "completed  1" in allowed.stdout
