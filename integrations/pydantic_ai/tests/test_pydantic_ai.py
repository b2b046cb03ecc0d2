"""The Pydantic AI adapter against real Pydantic AI runs, resumes and SIGKILLed processes."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults

from replaysafe import CallKey, SqliteLedger, Status
from replaysafe.testing._forkserver import run_python
from replaysafe_pydantic_ai import message_id

from pydantic_ai_child import first, resume
from pydantic_ai_scenario import Variant, build_agent, effects

CHILD = Path(__file__).with_name("pydantic_ai_child.py")
REFUND = "refund A1"
EMAIL = "email bob@example.com"
RETURNS = {"call_1": {"order_id": "A1", "refunded": True}, "call_2": "sent to bob@example.com"}


def run_child(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_python([str(CHILD), *map(str, args)], timeout=300)


def first_response(history: Path) -> ModelResponse:
    response = ModelMessagesTypeAdapter.validate_json(history.read_bytes())[-1]
    assert isinstance(response, ModelResponse)
    return response


@pytest.mark.parametrize("variant", ["capability", "decorated"])
def test_sigkill_in_second_tool_then_resume_runs_the_first_tool_once(
    variant: Variant, tmp_path: Path, ledger_path: Path, effects_path: Path
) -> None:
    """A process killed inside send_email after refund_order returned; a new process re-runs the history."""
    history = tmp_path / "history.json"

    crashed = run_child("first", history, ledger_path, effects_path, variant)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert effects(effects_path) == [REFUND, EMAIL]

    resumed = run_child("resume", history, ledger_path, effects_path, variant)
    assert resumed.returncode == 0, resumed.stderr
    assert effects(effects_path) == [REFUND, EMAIL, EMAIL]  # the email ran to completion once more
    assert json.loads(resumed.stdout) == {"output": "done", "returns": RETURNS}

    response = first_response(history)
    assert response.provider_response_id == "resp_1"
    with SqliteLedger(ledger_path) as ledger:
        records = {record.key: record for record in ledger.records()}
    thread = response.conversation_id or ""
    assert set(records) == {CallKey(thread, "resp_1", "call_1"), CallKey(thread, "resp_1", "call_2")}
    assert all(record.status is Status.COMPLETED for record in records.values())
    assert records[CallKey(thread, "resp_1", "call_2")].attempt == 2
    prefix = "decorated_" if variant == "decorated" else ""
    assert records[CallKey(thread, "resp_1", "call_1")].tool_name == f"{prefix}refund_order"


def test_sigkill_without_the_adapter_runs_the_first_tool_twice(
    tmp_path: Path, ledger_path: Path, effects_path: Path
) -> None:
    """The control: the same crash and resume without replaysafe repeats the refund."""
    history = tmp_path / "history.json"
    assert run_child("first", history, ledger_path, effects_path, "unprotected").returncode == -signal.SIGKILL
    resumed = run_child("resume", history, ledger_path, effects_path, "unprotected")
    assert resumed.returncode == 0, resumed.stderr
    assert effects(effects_path) == [REFUND, EMAIL, REFUND, EMAIL]


@pytest.mark.parametrize(("variant", "runs"), [("capability", 1), ("decorated", 1), ("unprotected", 2)])
async def test_resume_from_persisted_history_does_not_rerun_finished_tools(
    variant: Variant, runs: int, tmp_path: Path, ledger: SqliteLedger, effects_path: Path
) -> None:
    """History persisted before the tools ran is run again after they finished: each tool ran once."""
    history = tmp_path / "history.json"
    agent = build_agent(ledger, effects_path, variant)
    await first(agent, history)
    assert effects(effects_path) == [REFUND, EMAIL]

    assert await resume(agent, history) == {"output": "done", "returns": RETURNS}
    assert effects(effects_path) == [REFUND, EMAIL] * runs


async def test_a_new_turn_with_the_same_tool_call_ids_runs_the_tools(ledger: SqliteLedger, effects_path: Path) -> None:
    """A new model response reusing call_1 and call_2 is a new call: its tools run."""
    agent = build_agent(ledger, effects_path)
    turn_1 = await agent.run("Refund order A1 and tell bob")
    turn_2 = await agent.run("Do it again", message_history=turn_1.all_messages())
    assert turn_2.output == "done"
    assert effects(effects_path) == [REFUND, EMAIL, REFUND, EMAIL]
    keys = {(record.key.message_id, record.key.tool_call_id) for record in ledger.records()}
    assert keys == {("resp_1", "call_1"), ("resp_1", "call_2"), ("resp_3", "call_1"), ("resp_3", "call_2")}


async def test_without_a_provider_response_id_the_key_falls_back_to_run_id_and_timestamp(
    tmp_path: Path, ledger: SqliteLedger, effects_path: Path
) -> None:
    """With no provider_response_id the message id is run_id@timestamp, stable through persisted JSON."""
    history = tmp_path / "history.json"
    agent = build_agent(ledger, effects_path, provider_ids=False)
    await first(agent, history)
    assert await resume(agent, history) == {"output": "done", "returns": RETURNS}
    assert effects(effects_path) == [REFUND, EMAIL]

    response = first_response(history)
    assert response.provider_response_id is None
    expected = f"{response.run_id}@{response.timestamp.isoformat()}"
    assert message_id([response], "call_1") == expected
    assert {record.key.message_id for record in ledger.records()} == {expected}


async def test_an_approval_pause_keeps_the_call_paused_and_the_approved_call_runs_once(
    ledger: SqliteLedger, effects_path: Path
) -> None:
    """ApprovalRequired raised inside a tool keeps the call paused; once approved, it runs and is recorded."""
    agent = build_agent(ledger, effects_path, email_needs_approval=True)
    paused = await agent.run("Refund order A1 and tell bob")
    assert isinstance(paused.output, DeferredToolRequests)
    assert [call.tool_call_id for call in paused.output.approvals] == ["call_2"]
    assert effects(effects_path) == [REFUND]
    paused_statuses = {record.key.tool_call_id: record.status for record in ledger.records()}
    assert paused_statuses == {"call_1": Status.COMPLETED, "call_2": Status.PAUSED}

    approved = DeferredToolResults(approvals={"call_2": True})
    done = await agent.run(message_history=paused.all_messages(), deferred_tool_results=approved)
    assert done.output == "done"
    assert effects(effects_path) == [REFUND, EMAIL]
    statuses: dict[str, Any] = {record.key.tool_call_id: record.status for record in ledger.records()}
    assert statuses == {"call_1": Status.COMPLETED, "call_2": Status.COMPLETED}


async def test_ledger_list_shows_the_call_an_approval_pause_left_paused(
    ledger: SqliteLedger, ledger_path: Path, effects_path: Path
) -> None:
    """What an operator sees of a pending approval: `replaysafe ledger list` lists the call as paused."""
    agent = build_agent(ledger, effects_path, email_needs_approval=True)
    # Awaited on the test's own loop, as the other tests run the agent: run_sync would leave a loop of
    # its own unclosed, reported as an unraisable warning in whichever test the collector runs next.
    paused = await agent.run("Refund order A1 and tell bob")
    assert isinstance(paused.output, DeferredToolRequests)
    listed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "replaysafe", "ledger", "list", "--ledger", f"sqlite:///{ledger_path}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = {line.split()[2]: line.split() for line in listed.stdout.splitlines() if line.split()[2:3]}
    assert rows["call_1"][4] == "completed", listed.stdout
    assert rows["call_2"][4] == "paused", listed.stdout
    assert rows["call_2"][3] == "send_email", listed.stdout


@pytest.mark.parametrize("variant", ["capability", "decorated"])
async def test_under_record_errors_an_approval_pause_is_kept_paused_not_recorded_as_a_failure(
    ledger: SqliteLedger, effects_path: Path, variant: Variant
) -> None:
    """A pause is not an outcome, even when errors are recorded: the approved call then runs once."""
    agent = build_agent(ledger, effects_path, variant, email_needs_approval=True, record_errors=True)
    paused = await agent.run("Refund order A1 and tell bob")
    assert isinstance(paused.output, DeferredToolRequests)
    assert {record.status for record in ledger.records()} == {Status.COMPLETED, Status.PAUSED}  # no failure
    approved = DeferredToolResults(approvals={"call_2": True})
    done = await agent.run(message_history=paused.all_messages(), deferred_tool_results=approved)
    assert done.output == "done"
    assert effects(effects_path) == [REFUND, EMAIL]
    calls = [record for record in ledger.records() if record.tool_name != "pydantic_ai_approval_answer"]
    assert sorted(record.status for record in calls) == [Status.COMPLETED, Status.COMPLETED]
    # the answer's marker (what the adapter recorded of it: once, a retry of the run records nothing more)
    assert len(list(ledger.records())) == 3


@pytest.mark.parametrize("variant", ["capability", "decorated"])
async def test_under_record_errors_a_deferred_call_is_kept_paused_not_recorded_as_a_failure(
    ledger: SqliteLedger, effects_path: Path, variant: Variant
) -> None:
    agent = build_agent(ledger, effects_path, variant, email_deferred=True, record_errors=True)
    paused = await agent.run("Refund order A1 and tell bob")
    assert isinstance(paused.output, DeferredToolRequests)
    assert [call.tool_call_id for call in paused.output.calls] == ["call_2"]
    statuses = sorted(record.status for record in ledger.records())
    assert statuses == [Status.COMPLETED, Status.PAUSED]  # no FAILED email record
