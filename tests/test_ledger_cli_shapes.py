"""`replaysafe ledger resolve` writes a result in the shape the call's replay reads, on SQLite, PostgreSQL and Redis.

An adapter states the shape it records results in through the ``replaysafe.result_shapes`` entry point; here a
real one, installed for the test (a distribution's metadata and module on ``PYTHONPATH``: the same discovery as
an installed package), with a serializer of the same shape on the replaying side. Before this change, a
``--result`` the call's replay could not read was written and said "settled": every replay then raised
``RecordUnreadableError``. The commands run in this process as a new one would run them, the test adapter's
directory on ``PYTHONPATH`` importable for them only (tests/cli.py); no message repeats a result or text given.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from replaysafe import (
    CallInDoubtError,
    CallKey,
    Ledger,
    MemoryLedger,
    Record,
    RecordUnreadableError,
    Status,
    replay_safe,
    tool_call,
)

from .cli import cli
from .installed import installed_package
from .test_ledger_cli import _write, incident

__all__ = ["incident"]

SECRET = "re-SECRET-4417"  # a result value: never in any message or confirmation

PLUGIN = '''\
"""A test adapter's result shape: it records a tool's text as {"receipt": text}."""
from replaysafe import ResultShape


def _text(text, recorded):
    return {"receipt": text}


def _problem(value, recorded):
    if not isinstance(value, dict) or set(value) != {"receipt"} or not isinstance(value["receipt"], str):
        return "it is not an object holding one receipt string"
    return None


def _recognizes(value):
    return isinstance(value, dict) and set(value) == {"receipt"}


SHAPE = ResultShape(
    name="receipt",
    who="receipt calls (the test adapter)",
    expects='an object {"receipt": "..."}',
    text=_text,
    problem=_problem,
    recognizes=_recognizes,
    threads=("receipts:",),
)
NOT_A_SHAPE = 42
'''
ENTRY_POINTS = """\
[replaysafe.result_shapes]
receipt = replaysafe_test_receipts:SHAPE
wrong = replaysafe_test_receipts:NOT_A_SHAPE
missing = replaysafe_test_no_such_module:SHAPE
"""


class ReceiptSerializer:
    """The test adapter's serializer: it reads only {"receipt": "..."} (as an MCP call reads only a CallToolResult)."""

    def dumps(self, value: Any, /) -> str:
        return json.dumps({"receipt": value})

    def loads(self, text: str, /) -> str:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("receipt"), str):
            raise ValueError("not a receipt")
        receipt: str = data["receipt"]
        return receipt


@dataclasses.dataclass
class Refund:
    """A class a tool returns: recorded by the JSON codec as a tagged dataclass."""

    refund_id: str
    amount: float


@pytest.fixture
def plugin(tmp_path: Path) -> dict[str, str]:
    """The environment of a CLI that has the test adapter installed."""
    return installed_package(
        tmp_path / "site", "replaysafe-test-receipts", "replaysafe_test_receipts", PLUGIN, ENTRY_POINTS
    )


def no_argument_digest() -> str:
    """The argument digest of a call without arguments (the same on every ledger)."""
    probe = MemoryLedger()
    with tool_call("probe", "m", "c"):
        replay_safe(ledger=probe, name="probe")(lambda: None)()
    (record,) = probe.records()
    return record.args_digest


def in_doubt(ledger: Ledger, thread: str, tool: str = "issue_receipt") -> CallKey:
    """A call whose owner on another machine died: in doubt, no result."""
    key = CallKey(thread, "msg_1", "call_1")
    _write(ledger, key, Status.RUNNING, None, tool=tool, digest=no_argument_digest())
    return key


def replay_receipt(ledger: Ledger, key: CallKey) -> str:
    """A replay of the call by the test adapter's tool, which would refund again if it ran."""

    @replay_safe(ledger=ledger, name="issue_receipt", serializer=ReceiptSerializer(), in_doubt="raise")
    def issue_receipt() -> str:
        raise AssertionError("the settled call ran again")

    with tool_call(*key):
        return issue_receipt()


def unchanged(ledger: Ledger, key: CallKey, before: Record) -> None:
    after = ledger.get(key)
    assert after is not None
    assert (after.status, after.result, after.attempt, after.owner, after.updated_at) == (
        before.status,
        before.result,
        before.attempt,
        before.owner,
        before.updated_at,
    )


def got(ledger: Ledger, key: CallKey) -> Record:
    record = ledger.get(key)
    assert record is not None
    return record


def test_a_result_the_replay_cannot_read_is_refused_by_the_shape_finished_calls_show(
    durable_ledger: Ledger, durable_ledger_url: str, plugin: dict[str, str]
) -> None:
    """A finished issue_receipt shows the call records {"receipt": ...}: `--result '"..."'` is refused, nothing is
    written and the call is still in doubt (before: "settled", then RecordUnreadableError on every replay); a
    --shape the ledger contradicts is refused; `--text` writes the text in the receipt shape, which replays."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    with tool_call(thread, "msg_0", "call_0"):
        replay_safe(ledger=durable_ledger, name="issue_receipt", serializer=ReceiptSerializer())(lambda: "r0")()
    key = in_doubt(durable_ledger, thread)
    before = got(durable_ledger, key)
    url = ("ledger", "--ledger", durable_ledger_url)

    refused = cli(*url, "resolve", *key, "--result", json.dumps(SECRET), "--yes", env=plugin)
    with pytest.raises(CallInDoubtError):  # before this change: RecordUnreadableError, the call settled unreadable
        replay_receipt(durable_ledger, key)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr == (
        f"replaysafe ledger resolve: issue_receipt ({key}) records its result in the receipt shape (1 of the 1 "
        "finished record(s) of issue_receipt read here are receipt-shaped), and a replay could not read this "
        "--result: it is not an object holding one receipt string. A replay reads an object "
        '{"receipt": "..."}. Settle it with --text TEXT (the provider\'s answer as text, written in that shape), '
        "or with --result in that shape. Nothing was changed.\n"
    )
    assert refused.stdout == ""
    unchanged(durable_ledger, key, before)

    contradicted = cli(*url, "resolve", *key, "--result", json.dumps(SECRET), "--shape", "json", "--yes", env=plugin)
    assert contradicted.returncode == 2, contradicted.stdout + contradicted.stderr
    assert "--shape json contradicts the ledger: 1 of the 1 finished record(s)" in contradicted.stderr
    assert "with --shape receipt, or without --shape" in contradicted.stderr
    unchanged(durable_ledger, key, before)

    settled = cli(*url, "resolve", *key, "--text", SECRET, "--yes", env=plugin)
    assert settled.returncode == 0, settled.stdout + settled.stderr
    assert "Shape: receipt, what receipt calls (the test adapter) record" in settled.stdout
    assert "settled: record the text given as its result, in the receipt shape" in settled.stdout
    for output in (refused, contradicted, settled):
        assert SECRET not in output.stdout + output.stderr
    assert json.loads(got(durable_ledger, key).result or "") == {"receipt": SECRET}
    assert replay_receipt(durable_ledger, key) == SECRET


def test_the_key_space_an_adapter_declares_tells_the_shape_of_a_first_call(
    durable_ledger: Ledger, durable_ledger_url: str, plugin: dict[str, str]
) -> None:
    """No finished call of the tool, but its thread id is in the adapter's key space: the same refusal, and --text
    settles it. Entry points that do not load are named, and the command goes on without them."""
    key = in_doubt(durable_ledger, f"receipts:{uuid.uuid4().hex[:8]}")
    before = got(durable_ledger, key)
    url = ("ledger", "--ledger", durable_ledger_url)

    refused = cli(*url, "resolve", *key, "--result", json.dumps({"id": SECRET}), "--yes", env=plugin)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "its thread id is in the key space 'receipts:', where only receipt calls (the test adapter)" in (
        refused.stderr
    )
    assert "a replay could not read this --result" in refused.stderr
    unchanged(durable_ledger, key, before)

    settled = cli(*url, "resolve", *key, "--text", SECRET, "--yes", "--json", env=plugin)
    assert settled.returncode == 0, settled.stdout + settled.stderr
    document = json.loads(settled.stdout)
    assert (document["settled"], document["how"], document["shape"]) == (True, "text", "receipt")
    assert "the result shape 'missing' of replaysafe-test-receipts does not load (ModuleNotFoundError)" in (
        settled.stderr
    )
    assert "the entry point 'wrong' of replaysafe-test-receipts is not a ResultShape named 'wrong'" in settled.stderr
    assert SECRET not in refused.stderr + settled.stderr
    assert replay_receipt(durable_ledger, key) == SECRET


def test_a_finished_call_settled_unreadable_is_settled_again_only_with_force(
    durable_ledger: Ledger, durable_ledger_url: str, plugin: dict[str, str]
) -> None:
    """A call settled before the check in a shape its replay cannot read is finished: `resolve` still refuses it
    without --force (exit 1, as for any finished call), and with --force writes the text in its shape."""
    key = CallKey(f"receipts:{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
    _write(
        durable_ledger, key, Status.COMPLETED, json.dumps("refunded"), tool="issue_receipt", digest=no_argument_digest()
    )
    with pytest.raises(RecordUnreadableError):
        replay_receipt(durable_ledger, key)
    url = ("ledger", "--ledger", durable_ledger_url, "resolve", *key, "--text", SECRET, "--yes")
    finished = cli(*url, env=plugin)
    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert "is already completed" in finished.stderr
    assert "--force" in finished.stderr
    forced = cli(*url, "--force", env=plugin)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert SECRET not in finished.stderr + forced.stdout + forced.stderr
    assert replay_receipt(durable_ledger, key) == SECRET


def test_text_settles_a_call_of_replaysafes_json_codec(
    durable_ledger: Ledger, durable_ledger_url: str, incident: tuple[CallKey, CallKey]
) -> None:
    """`--text --shape json` records the text as a JSON string: what @replay_safe's replay (and the LangGraph,
    Pydantic AI, OpenAI Agents SDK, sdk_loops and 10xGraph adapters) reads. The confirmation never repeats it."""
    key, _ = incident
    url = ("ledger", "--ledger", durable_ledger_url)
    settled = cli(*url, "resolve", *key, "--text", SECRET, "--shape", "json", "--yes")
    assert settled.returncode == 0, settled.stdout + settled.stderr
    assert "settled: record the text given as its result, in the json shape" in settled.stdout
    assert SECRET not in settled.stdout + settled.stderr
    assert got(durable_ledger, key).result == json.dumps(SECRET)

    @replay_safe(ledger=durable_ledger, in_doubt="raise")
    def refund_order(order_id: str, amount: float) -> str:
        raise AssertionError("the settled call ran again")

    with tool_call(*key):
        assert refund_order("1042", 59.0) == SECRET


def test_text_is_refused_when_nothing_tells_the_shape_and_nothing_is_written(
    durable_ledger: Ledger, durable_ledger_url: str, incident: tuple[CallKey, CallKey], plugin: dict[str, str]
) -> None:
    """The in-doubt refund_order holds no result, names no adapter, and no refund_order ever finished: `--text`
    cannot know the shape to write, so it asks for --shape (exit 2). `--result` goes on, saying it cannot check."""
    key, _ = incident
    before = got(durable_ledger, key)
    url = ("ledger", "--ledger", durable_ledger_url)
    refused = cli(*url, "resolve", *key, "--text", SECRET, "--yes", env=plugin)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"refund_order ({key}): --text writes the text in the shape the call's adapter records" in refused.stderr
    assert "no finished record of refund_order was found" in refused.stderr
    assert "Name the shape: --shape json for replaysafe's JSON codec" in refused.stderr
    assert "Nothing was changed" in refused.stderr
    unchanged(durable_ledger, key, before)

    asked = cli(*url, "resolve", *key, "--result", json.dumps(SECRET), stdin="n\n", env=plugin)
    assert asked.returncode == 4, asked.stdout + asked.stderr
    assert "Shape unknown: what a replay of refund_order reads cannot be told here" in asked.stdout
    assert "Careful: receipt calls (the test adapter) read only an object" in asked.stdout
    assert "answer no and settle it with --text TEXT --shape receipt" in asked.stdout
    assert "Settle it: record the JSON given (a JSON string) as its result? [y/N]" in asked.stdout
    fits = cli(*url, "resolve", *key, "--result", json.dumps({"receipt": SECRET}), stdin="n\n", env=plugin)
    assert fits.returncode == 4, fits.stdout + fits.stderr
    assert "Careful: receipt calls" not in fits.stdout  # the value is readable in that shape too
    for output in (refused, asked, fits):
        assert SECRET not in output.stdout + output.stderr
    unchanged(durable_ledger, key, before)


def test_a_class_the_finished_calls_hold_is_named_and_a_replay_rebuilds_it(
    durable_ledger: Ledger, durable_ledger_url: str
) -> None:
    """issue_refund returns a Refund (a tagged dataclass in its record): the codec's tag tells the json shape, and
    the confirmation says what a replay makes of the JSON given, by the class and its fields, never a value."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    with tool_call(thread, "msg_0", "call_0"):
        replay_safe(ledger=durable_ledger, name="issue_refund")(lambda: Refund("re_0", 1.0))()
    key = in_doubt(durable_ledger, thread, tool="issue_refund")
    url = ("ledger", "--ledger", durable_ledger_url)
    holds = "hold a tests.test_ledger_cli_shapes.Refund (dataclass; fields refund_id, amount)"

    string = cli(*url, "resolve", *key, "--result", json.dumps(SECRET), stdin="n\n")
    assert string.returncode == 4, string.stdout + string.stderr
    assert "Shape: json, what tools recorded by replaysafe's JSON codec" in string.stdout
    assert "(1 of the 1 finished record(s) of issue_refund read here are json-shaped)" in string.stdout
    assert f"Careful: the 1 finished record(s) of issue_refund read here all {holds}, and this result is a JSON " in (
        string.stdout
    )
    answer = json.dumps({"refund_id": SECRET, "amount": 59.0})
    settled = cli(*url, "resolve", *key, "--result", answer, "--yes")
    assert settled.returncode == 0, settled.stdout + settled.stderr
    assert f"The 1 finished record(s) of issue_refund read here {holds}. A replay rebuilds one" in settled.stdout
    assert SECRET not in string.stdout + settled.stdout

    @replay_safe(ledger=durable_ledger, in_doubt="raise")
    def issue_refund() -> Refund:
        raise AssertionError("the settled call ran again")

    with tool_call(*key):
        assert issue_refund() == Refund(SECRET, 59.0)


def test_shape_is_checked_before_anything_is_read_or_written(sqlite_url: str, plugin: dict[str, str]) -> None:
    """--shape with --rerun, an unknown shape, and --text with --result are usage errors (exit 2)."""
    from replaysafe import open_ledger

    with open_ledger(sqlite_url) as ledger:
        key = in_doubt(ledger, "t-usage")
        before = got(ledger, key)
    url = ("ledger", "--ledger", sqlite_url, "resolve", *key)
    rerun = cli(*url, "--rerun", "--shape", "json", "--yes")
    assert (rerun.returncode, rerun.stderr) == (
        2,
        "replaysafe ledger resolve: --shape goes with --result or --text: --rerun records no result\n",
    )
    unknown = cli(*url, "--text", SECRET, "--shape", "nope", "--yes", env=plugin)
    assert unknown.returncode == 2
    assert "no installed package declares the result shape 'nope' (known here: json, " in unknown.stderr
    assert "receipt" in unknown.stderr
    both = cli(*url, "--text", SECRET, "--result", '"x"', "--yes")
    assert both.returncode == 2
    assert "not allowed with argument" in both.stderr
    with open_ledger(sqlite_url) as ledger:
        unchanged(ledger, key, before)
        with pytest.raises(CallInDoubtError), tool_call(*key):
            replay_safe(ledger=ledger, name="issue_receipt", in_doubt="raise")(lambda: None)()
