"""Error messages point the operator the right way: the command to run, the call's ids, the tool, the
variable; never a Python call as the way to act, never an argument or result value."""

from __future__ import annotations

import ast
import datetime as dt
import logging
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import replaysafe
from replaysafe import (
    CallInDoubtError,
    CallInfo,
    CallInProgressError,
    CallKey,
    Ledger,
    Status,
    replay_safe,
    tool_call,
)
from replaysafe._identity import call_idempotency_key

from .test_in_doubt import attempts_in, crash_inside_the_tool, refund_tool

LIBRARY = Path(replaysafe.__file__).parent
#: Python calls an operator was once told to make; the CLI does each of them.
PYTHON_CALLS = re.compile(r"delete\(key\)|force=True|ledger\.(resolve|delete)\(")


def _message_strings(path: Path) -> list[tuple[int, str]]:
    """The string literals of a module (f-string parts included), docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_message_points_to_a_python_call_as_the_way_to_act() -> None:
    """Every message of the library names a `replaysafe ledger` command, not `delete(key)` or `force=True`.
    (The demo narrates the Python calls it makes itself.)"""
    found = [
        f"{path.relative_to(LIBRARY)}:{line}: {text}"
        for path in sorted(LIBRARY.rglob("*.py"))
        if "_demo" not in path.relative_to(LIBRARY).parts
        for line, text in _message_strings(path)
        if PYTHON_CALLS.search(text)
    ]
    assert found == []


#: An owner token, ``host:pid:process-start#n``.
OWNER_TOKEN = re.compile(r"\S+:\d+:\d+#\d+")


def test_an_in_doubt_error_and_its_log_carry_the_idempotency_key(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """CallInDoubtError's message names the provider lookup key and the command that settles the call; the
    in-doubt log record carries the key as a field and in its text. The dead owner's token is in ``.owner``
    and in the log record, for operators, never in the message: a framework may show it to the model (a
    ToolNode handling tool errors, an interrupt)."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(durable_ledger_url, effects)
    expected = call_idempotency_key(*key, "refund_order")
    record = durable_ledger.get(key)
    assert record is not None and OWNER_TOKEN.fullmatch(record.owner), record
    with (
        caplog.at_level(logging.WARNING, logger="replaysafe"),
        tool_call(*key),
        pytest.raises(CallInDoubtError) as raised,
    ):
        refund_tool(durable_ledger, effects, in_doubt="raise")("1042", 59.0)
    message = str(raised.value)
    assert raised.value.idempotency_key == expected
    assert f"idempotency key {expected}" in message
    assert f'replaysafe ledger resolve --ledger <url> "{key.thread_id}" "{key.message_id}"' in message
    assert "--rerun" in message and "59.0" not in message and "'1042'" not in message
    assert raised.value.owner == record.owner
    assert record.owner not in message and not OWNER_TOKEN.search(message), message
    logged = [r for r in caplog.records if getattr(r, "replaysafe_event", None) == "in_doubt"]
    assert [getattr(r, "replaysafe_idempotency_key", None) for r in logged] == [expected]
    assert [getattr(r, "replaysafe_owner", None) for r in logged] == [record.owner]
    assert expected in logged[0].getMessage() and record.owner in logged[0].getMessage()


def test_a_call_in_progress_error_keeps_its_owner_out_of_its_message(durable_ledger: Ledger) -> None:
    """The live owner another worker waited for is in ``.owner``, never in ``str(error)``; the message names
    the call and what to do."""

    @replay_safe(ledger=durable_ledger, wait_timeout=0.05)
    def charge(order_id: str) -> str:
        return f"charged {order_id}"

    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
    with tool_call(*key):
        charge("1042")
    record = durable_ledger.get(key)
    assert record is not None
    held = CallKey(key.thread_id, "msg_2", "call_1")
    owner = "elsewhere:4242:99#1"  # another machine: only its lease tells, and it runs for minutes yet
    now = dt.datetime.now(dt.timezone.utc)
    durable_ledger.claim(
        held,
        tool_name="charge",
        args_digest=record.args_digest,
        owner=owner,
        now=now,
        lease_expires_at=now + dt.timedelta(minutes=5),
    )
    with tool_call(*held), pytest.raises(CallInProgressError) as raised:
        charge("1042")
    message = str(raised.value)
    assert raised.value.owner == owner
    assert owner not in message and "4242" not in message and not OWNER_TOKEN.search(message), message
    assert f"message_id={held.message_id!r}" in message and "charge" in message
    assert "another worker" in message and "wait_timeout" in message and "'1042'" not in message


def test_a_reconcilers_exception_carries_the_calls_ids(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path
) -> None:
    """The reconciler's own exception propagates, with a note naming the reconciler, the call and the fix."""
    effects = tmp_path / "effects"
    key = crash_inside_the_tool(durable_ledger_url, effects)

    def provider_down(call: CallInfo) -> Any:
        raise ConnectionError("provider unreachable")

    with tool_call(*key), pytest.raises(ConnectionError) as raised:
        refund_tool(durable_ledger, effects, in_doubt=provider_down)("1042", 59.0)
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "reconciler" in notes and "provider_down" in notes
    assert f"thread_id={key.thread_id!r}" in notes and f"tool_call_id={key.tool_call_id!r}" in notes
    assert "refund_order" in notes and "replaysafe ledger resolve" in notes
    assert "59.0" not in notes
    record = durable_ledger.get(key)
    assert record is not None and record.status is Status.IN_DOUBT
    assert attempts_in(effects) == ["1"]


def test_a_missing_argument_names_the_tool(durable_ledger: Ledger) -> None:
    """A protected tool called without an argument says which tool, like a plain call does."""

    @replay_safe(ledger=durable_ledger)
    def refund_order(order_id: str, amount: float) -> str:
        return "refunded"

    with tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c"), pytest.raises(TypeError) as raised:
        refund_order("order-1042")  # type: ignore[call-arg]
    assert str(raised.value) == "refund_order() missing a required argument: 'amount'"
    assert "order-1042" not in str(raised.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("mysql://agent:hunter2@db/app", ["no ledger for the URL", "agent:***@db"]),
        ("sqlite:///ledger.db?shcema=app", ["unknown URL option 'shcema'"]),
    ],
)
def test_a_bad_ledger_url_variable_is_named(url: str, words: list[str]) -> None:
    """A protected call under an unusable $REPLAYSAFE_LEDGER_URL names the variable (the password hidden)."""
    program = (
        "from replaysafe import replay_safe, tool_call\n"
        "@replay_safe\n"
        "def refund_order() -> str:\n"
        "    return 'refunded'\n"
        "with tool_call('t', 'm', 'c'):\n"
        "    refund_order()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "REPLAYSAFE_LEDGER_URL": url},
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: $REPLAYSAFE_LEDGER_URL names no usable ledger:"), done.stderr
    for word in words:
        assert word in last
    assert "hunter2" not in done.stderr
