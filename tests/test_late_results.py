"""Late results: a run that ends after its call was settled elsewhere is kept beside the settlement, never in
its place, and never dropped; a ``late_result`` event and the tool's ``on_late_result`` hook say so."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from replaysafe import (
    CallKey,
    Event,
    EventKind,
    LateResult,
    Ledger,
    Status,
    replay_safe,
    tool_call,
)
from replaysafe._keys import late_key, late_result_of, reserved_id

from .cli import cli

CHILD = str(Path(__file__).with_name("late_child.py"))


def new_key() -> CallKey:
    return CallKey(f"thread-{uuid.uuid4().hex[:10]}", "msg_1", "call_1")


def test_the_late_key_is_the_calls_own_and_reserved() -> None:
    key = new_key()
    late = late_key(key, 2)
    assert late_result_of(late) == (key, 2)
    assert late_result_of(key) is None
    assert reserved_id(late) is not None and reserved_id(late)[0] == "tool_call_id"  # type: ignore[index]
    assert reserved_id(key) is None


def test_a_run_that_ends_after_an_operator_settled_its_call_is_kept_beside_it(
    ledger: Ledger, events: list[Event]
) -> None:
    """An operator settles the call (resolve --force) while its tool still runs: the tool's caller gets its
    own result, the settlement stands for every replay, and the late result is kept under its own key."""
    key, told = new_key(), []

    @replay_safe(ledger=ledger, on_late_result=told.append)
    def refund_order(order_id: str) -> str:
        ledger.resolve(key, result="re_by_operator", force=True)  # meanwhile, by hand
        return f"re_late_{order_id}"

    with tool_call(*key):
        assert refund_order("A1") == "re_late_A1"
    with tool_call(*key):
        assert refund_order("A1") == "re_by_operator"  # the settlement stands
    record = ledger.get(key)
    assert record is not None and record.result == '"re_by_operator"'
    late = ledger.get(late_key(key, 1))
    assert late is not None
    assert (late.status, late.result, late.tool_name) == (Status.COMPLETED, '"re_late_A1"', "refund_order")
    [told_late] = told
    assert isinstance(told_late, LateResult)
    assert told_late.call.key == key and told_late.call.attempt == 1
    assert (told_late.status, told_late.result) == (Status.COMPLETED, "re_late_A1")
    assert told_late.settled is not None and told_late.settled.status is Status.COMPLETED
    [event] = [e for e in events if e.kind is EventKind.LATE_RESULT]
    assert event.key == key and event.attempt == 1
    assert "completed in attempt" in event.message and "settlement stands" in event.message
    assert "re_late" not in event.message and "A1" not in event.message.replace(str(key), "")


def test_a_run_that_ends_after_its_call_was_removed_to_run_again_is_kept(ledger: Ledger) -> None:
    key, told = new_key(), []

    @replay_safe(ledger=ledger, on_late_result=told.append)
    def refund_order(order_id: str) -> str:
        ledger.resolve(key, rerun=True, force=True)
        return "re_late"

    with tool_call(*key):
        assert refund_order("A1") == "re_late"
    assert ledger.get(key) is None  # removed: the next call runs it again, as the operator asked
    late = ledger.get(late_key(key, 1))
    assert late is not None and late.result == '"re_late"'
    assert told[0].settled is None


def test_a_failure_that_ends_late_is_kept_as_a_failure(ledger: Ledger) -> None:
    key, told = new_key(), []

    @replay_safe(ledger=ledger, record_errors=ValueError, on_late_result=told.append)
    def refund_order(order_id: str) -> str:
        ledger.resolve(key, result="re_by_operator", force=True)
        raise ValueError("declined")

    with tool_call(*key), pytest.raises(ValueError, match="declined"):
        refund_order("A1")
    late = ledger.get(late_key(key, 1))
    assert late is not None and late.status is Status.FAILED
    assert (told[0].status, told[0].result) == (Status.FAILED, None)


def test_a_hook_that_raises_is_logged_and_the_call_returns(ledger: Ledger, caplog: pytest.LogCaptureFixture) -> None:
    key = new_key()

    def broken(late: LateResult) -> None:
        raise RuntimeError("the hook broke")

    @replay_safe(ledger=ledger, on_late_result=broken)
    def refund_order(order_id: str) -> str:
        ledger.resolve(key, result="x", force=True)
        return "re_late"

    with tool_call(*key):
        assert refund_order("A1") == "re_late"
    assert any("on_late_result hook" in r.getMessage() for r in caplog.records)
    assert ledger.get(late_key(key, 1)) is not None


def test_an_async_tool_hands_its_late_result_to_an_async_hook(ledger: Ledger) -> None:
    key, told = new_key(), []

    async def hook(late: LateResult) -> None:
        await asyncio.sleep(0)
        told.append(late.result)

    @replay_safe(ledger=ledger, on_late_result=hook)
    async def refund_order(order_id: str) -> str:
        ledger.resolve(key, result="x", force=True)
        return "re_late"

    async def call() -> str:
        with tool_call(*key):
            result: str = await refund_order("A1")
            return result

    assert asyncio.run(call()) == "re_late"
    assert told == ["re_late"]


def test_a_worker_whose_call_an_operator_settled_keeps_its_late_result_across_processes(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path
) -> None:
    """A real worker process runs the tool; the operator settles the call from the CLI meanwhile; the
    worker's result arrives after: kept beside the record, shown by `replaysafe ledger show`."""
    thread = f"t-{uuid.uuid4().hex[:10]}"
    key = CallKey(thread, "msg_1", "call_1")
    worker = subprocess.Popen(
        [sys.executable, CHILD, durable_ledger_url, thread, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the worker never started its tool"
            time.sleep(0.02)
        settled = cli(
            "ledger",
            "--ledger",
            durable_ledger_url,
            "resolve",
            *key,
            "--result",
            '"re_by_operator"',
            "--force",
            "--yes",
        )
        assert settled.returncode == 0, settled.stderr
        (tmp_path / "go").write_text("1")
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, err
    answer: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    assert answer == {
        "result": "re_late_A1",
        "late": {"status": "completed", "result": "re_late_A1", "settled": "completed"},
    }
    record = durable_ledger.get(key)
    assert record is not None and record.result is not None and record.result.endswith('"re_by_operator"')
    shown = cli("ledger", "--ledger", durable_ledger_url, "show", *key)
    assert shown.returncode == 0, shown.stderr
    assert "late_result: attempt 1 completed" in shown.stdout and '"re_late_A1"' in shown.stdout
    as_json = json.loads(cli("ledger", "--ledger", durable_ledger_url, "show", *key, "--json").stdout)
    assert [late["result"] for late in as_json["late_results"]] == ["re_late_A1"]
