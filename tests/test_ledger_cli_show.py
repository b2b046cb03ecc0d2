"""`replaysafe ledger show` prints a record's result as the ledger stores it (pretty-printed JSON, nothing
decoded, imported or run) and tells in words what a marker in its place means: a result not recorded, the steps
a paused or in-doubt call made. Its seal check is as before. Run on SQLite, PostgreSQL and Redis, in this process
as a new one would run them (tests/cli.py)."""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from replaysafe import CallKey, Ledger, Status, open_ledger, replay_safe, tool_call
from replaysafe._unrecorded import PREFIX

from .cli import cli
from .test_ledger_cli import NO_KEY, SIGNING_KEY, WITH_KEY, _show, _write

SECRET = "4111-1111-SECRET-CARD"
STEPS_CHILD = str(Path(__file__).with_name("steps_child.py"))

#: A module of the application's, which the command must never import: each import appends a line to a file.
SHOP = """
import dataclasses, os

with open(os.environ["SHOP_IMPORTS"], "a") as log:
    log.write(f"imported in {os.getpid()}\\n")


@dataclasses.dataclass
class Refund:
    refund_id: str
    amount: float
"""


def _key() -> CallKey:
    return CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")


def test_a_class_the_command_never_imported_is_shown_as_stored(
    durable_ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result holding the application's dataclass was "undecodable" to a command that had not imported its
    module: it is shown as the stored JSON, pretty-printed, with the class named, and its module is not imported
    even where the command could import it. With the signing key its seal still checks."""
    package = f"shop_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{package}.py").write_text(SHOP)
    imports = tmp_path / "imports.log"
    env = {"SHOP_IMPORTS": str(imports), "PYTHONPATH": str(tmp_path)}
    monkeypatch.setenv("SHOP_IMPORTS", str(imports))  # for this process's own import, below
    monkeypatch.syspath_prepend(str(tmp_path))
    key, sealed = _key(), _key()
    try:
        shop = importlib.import_module(package)
        with open_ledger(durable_ledger_url) as ledger, tool_call(*key):
            replay_safe(ledger=ledger, name="refund")(lambda: shop.Refund("re_1", 59.0))()
        with open_ledger(durable_ledger_url, signing_key=SIGNING_KEY) as signed, tool_call(*sealed):
            replay_safe(ledger=signed, name="refund")(lambda: shop.Refund("re_2", 12.5))()
    finally:
        sys.modules.pop(package, None)
    with open_ledger(durable_ledger_url) as ledger:
        stored = json.loads(ledger.get(key).result)
    assert imports.read_text().count("imported") == 1  # this process's import

    record, human = _show(durable_ledger_url, key, {**NO_KEY, **env}, human=True)
    assert "result_check: unsealed" in human and record["result"] == stored  # was undecodable, the raw text
    assert record["result_kind"] == "json"
    assert f"{package}.Refund" in record["result_note"] and "nothing was imported" in record["result_note"]
    assert json.dumps(stored, indent=2) in human  # pretty-printed, as stored
    assert f"{package}.Refund (dataclass; fields refund_id, amount)" in human
    assert "undecodable" not in human

    record = _show(durable_ledger_url, sealed, {**WITH_KEY, **env})[0]
    assert (record["result_check"], record["result_kind"]) == ("ok", "json")
    assert record["result"]["v"][2] == {"refund_id": "re_2", "amount": 12.5}
    assert imports.read_text().count("imported") == 1  # no command imported the application's module


def test_a_result_not_recorded_is_described_in_words(durable_ledger_url: str) -> None:
    """A result over max_result_bytes is recorded as a marker: `show` says the call ran and why its result is not
    recorded (reason, type, size), never the raw marker, nor the value; --json gives the marker's fields."""
    key, sealed = _key(), _key()
    big = SECRET * 20
    with open_ledger(durable_ledger_url) as ledger, tool_call(*key):
        assert replay_safe(ledger=ledger, name="export", max_result_bytes=64)(lambda: big)() == big
    with open_ledger(durable_ledger_url, signing_key=SIGNING_KEY) as signed, tool_call(*sealed):
        replay_safe(ledger=signed, name="export", max_result_bytes=64)(lambda: big)()

    record, human = _show(durable_ledger_url, key, NO_KEY, human=True)
    assert "rs-unrecorded-1" not in human and SECRET not in human
    assert (record["result_check"], record["result_kind"], record["result"]) == ("unsealed", "unrecorded", None)
    with open_ledger(durable_ledger_url) as ledger:
        stored = ledger.get(key).result
    assert stored is not None and stored.startswith(PREFIX)
    marker = json.loads(stored[len(PREFIX) :])
    assert (marker["reason"], marker["type"]) == ("too_large", "str")
    assert record["result_marker"] == marker
    result_line = next(line for line in human.splitlines() if line.strip().startswith("result:"))
    assert "the call ran; its result was not recorded" in result_line
    assert "over max_result_bytes" in result_line and f"a str, {marker['size']} bytes" in result_line

    record, human = _show(durable_ledger_url, sealed, WITH_KEY, human=True)
    assert (record["result_check"], record["result_kind"]) == ("ok", "unrecorded")
    assert "result_check: ok" in human and "its result was not recorded" in human


def test_the_steps_of_a_paused_or_in_doubt_call_are_described_in_words(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path
) -> None:
    """A paused call (a real pause, after its `refund` step) and an in-doubt one keep the steps they made where a
    result goes: `show` names them in order, in words, never the raw marker."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    args = ["pause", durable_ledger_url, str(tmp_path / "fx"), thread, "-"]
    paused = subprocess.run([sys.executable, STEPS_CHILD, *args], capture_output=True, text=True, timeout=120)
    assert paused.returncode == -signal.SIGKILL, paused.stderr
    record, human = _show(durable_ledger_url, CallKey(thread, "msg_1", "call_1"), NO_KEY, human=True)
    assert "the steps this call made, in order: refund" in human
    assert "rs-steps-1" not in human
    assert record["status"] == "paused"
    assert (record["result_kind"], record["result_marker"], record["result"]) == ("steps", ["refund"], None)

    in_doubt = _key()
    _write(durable_ledger, in_doubt, Status.IN_DOUBT, 'rs-steps-1:["refund", "notify"]')
    record, human = _show(durable_ledger_url, in_doubt, NO_KEY, human=True)
    assert "the steps this call made, in order: refund, notify" in human
    assert "rs-steps-1" not in human
    assert record["status"] == "in_doubt" and record["result_marker"] == ["refund", "notify"]
    shown = cli("ledger", "--ledger", durable_ledger_url, "show", *in_doubt, env=NO_KEY)
    assert shown.stdout == human
