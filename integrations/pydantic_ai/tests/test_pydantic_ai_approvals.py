"""Pydantic AI deferred-tool approvals recorded as bound, one-use approvals (docs/approvals.md, issue #32 §2).

A real ``Agent`` on the adapter's scripted model asks for ``refund_order`` (``requires_approval=True``); the run
ends with ``DeferredToolRequests``, and the answer (``True``, ``ToolApproved(override_args=...)``, ``ToolDenied``)
is handed to the next run with ``deferred_tool_results``, as Pydantic AI documents. The message history is saved
as JSON (``ModelMessagesTypeAdapter``) and every resume reads it back. Each case has its control: the same agent
without ``ReplaySafe`` (which, as pydantic/pydantic-ai#5536 reports, runs an approved call again on a retry).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, ModelMessagesTypeAdapter, RunContext, Tool
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied

import replaysafe
from replaysafe import (
    ApprovalExpiredError,
    ApprovalMismatchError,
    ApprovalRequiredError,
    Ledger,
    SqliteLedger,
    approvals,
    replay_safe,
)
from replaysafe.testing import Script, ScriptedCall, SteppedClock, kill_point, run_in_child
from replaysafe_pydantic_ai import ReplaySafe
from replaysafe_pydantic_ai.testing import scripted_model

CONVERSATION = "order-A1"
SCRIPT = Script(((ScriptedCall("refund_order", {"order_id": "A1", "amount": 30}),), "Refunded."), name="refund")
Answer = dict[str, Any]  # {"approve": True} | {"edit": {...}} | {"deny": "reason"}


def lines(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines() if Path(path).exists() else []


class FailOnce(AbstractCapability[Any]):
    """Fails the run once, right before the first tool call would run: an approval recorded, not yet spent."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def _first(self) -> bool:
        flag = Path(self.flag)
        if flag.exists():
            flag.unlink()
            return True
        return False

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
        if await asyncio.to_thread(self._first):
            raise RuntimeError("the run failed before the tool ran")
        return await handler(args)


def build(
    ledger: Ledger, effects: str, *, protect: bool, fail_once: str | None = None, decorated: bool = False
) -> Agent[None, Any]:
    def refund_order(ctx: RunContext[None], order_id: str, amount: int) -> str:
        """Refund an order."""
        with open(effects, "a", encoding="utf-8") as file:
            file.write(f"refund {order_id} {amount}\n")
        kill_point("after-refund")
        return f"refunded {amount}"

    function: Any = replay_safe(exclude_args=("ctx",))(refund_order) if decorated else refund_order

    capabilities: list[AbstractCapability[Any]] = [] if fail_once is None else [FailOnce(fail_once)]
    if protect:
        capabilities.append(ReplaySafe(ledger, approver="ana@example.com"))
    return Agent(
        scripted_model(SCRIPT),
        tools=[Tool(function, name="refund_order", requires_approval=True)],
        capabilities=capabilities,
        output_type=[str, DeferredToolRequests],
    )


def results(answer: Answer, call_id: str) -> DeferredToolResults:
    if "edit" in answer:
        return DeferredToolResults(approvals={call_id: ToolApproved(override_args=answer["edit"])})
    if "deny" in answer:
        return DeferredToolResults(approvals={call_id: ToolDenied(answer["deny"])})
    return DeferredToolResults(approvals={call_id: True})


async def ask(ledger: Ledger, history: str, effects: str, *, protect: bool, decorated: bool = False) -> str:
    """The first run: the model asks for the refund, held back for approval; the history saved. Its call id."""
    agent = build(ledger, effects, protect=protect, decorated=decorated)
    result = await agent.run("Refund order A1", conversation_id=CONVERSATION)
    assert isinstance(result.output, DeferredToolRequests)
    await asyncio.to_thread(Path(history).write_bytes, ModelMessagesTypeAdapter.dump_json(result.all_messages()))
    [call] = result.output.approvals
    return call.tool_call_id


async def answer_run(
    ledger: Ledger,
    history: str,
    effects: str,
    answer: Answer,
    *,
    protect: bool,
    fail_once: str | None = None,
    decorated: bool = False,
) -> dict[str, Any]:
    """Resume the saved history with ``answer``: what the run ended with."""
    messages = ModelMessagesTypeAdapter.validate_json(await asyncio.to_thread(Path(history).read_bytes))
    call_id = next(
        part.tool_call_id
        for message in messages
        if isinstance(message, ModelResponse)
        for part in message.parts
        if isinstance(part, ToolCallPart)
    )
    agent = build(ledger, effects, protect=protect, fail_once=fail_once, decorated=decorated)
    result = await agent.run(None, message_history=messages, deferred_tool_results=results(answer, call_id))
    if isinstance(result.output, DeferredToolRequests):
        return {"asks": [call.tool_call_id for call in result.output.approvals]}
    returns = [
        (part.content, part.outcome)
        for message in result.new_messages()
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    return {"output": result.output, "returns": returns}


async def child_run(history: str, ledger_path: str, effects: str, mode: str, protect: bool) -> dict[str, Any]:
    """In a child process: ``ask``, or ``approve`` the saved history; an ApprovalRequiredError as data."""
    with SqliteLedger(ledger_path) as ledger:
        if mode == "ask":
            return {"call_id": await ask(ledger, history, effects, protect=protect)}
        try:
            return await answer_run(ledger, history, effects, {"approve": True}, protect=protect)
        except ApprovalRequiredError as asked:
            return {"error": "ApprovalRequiredError", "may_have_run": asked.may_have_run}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    return {"history": str(tmp_path / "history.json"), "effects": str(tmp_path / "effects.log")}


@pytest.fixture
def events(replaysafe_events: list[replaysafe.Event]) -> list[replaysafe.Event]:
    return replaysafe_events


@pytest.mark.parametrize(("protect", "refunds"), [(True, 1), (False, 2)])
def test_approved_then_killed_inside_the_tool_resume_asks_for_a_new_decision(
    protect: bool, refunds: int, files: dict[str, str], ledger_path: Path
) -> None:
    """(a) Approved, SIGKILLed after the refund; a new process resumes with the same history and answer."""
    history, effects, path = files["history"], files["effects"], str(ledger_path)
    assert run_in_child(child_run, history, path, effects, "ask", protect).value is not None
    killed = run_in_child(child_run, history, path, effects, "approve", protect, kill_at="after-refund")
    assert killed.killed
    assert lines(effects) == ["refund A1 30"]
    resumed = run_in_child(child_run, history, path, effects, "approve", protect)
    assert lines(effects) == ["refund A1 30"] * refunds
    if protect:
        assert resumed.value == {"error": "ApprovalRequiredError", "may_have_run": True}
        again = run_in_child(child_run, history, path, effects, "approve", protect)  # a second retry: still asks
        assert again.value == resumed.value
        assert lines(effects) == ["refund A1 30"]
        # The operator looked the refund up at the provider, found none, and approves a second attempt.
        with SqliteLedger(path) as ledger:
            [paused] = [record for record in ledger.records() if record.tool_name == "refund_order"]
            approvals.approve(paused.key, by="ops@example.com", ledger=ledger)
        rerun = run_in_child(child_run, history, path, effects, "approve", protect)
        assert rerun.value == {"output": "Refunded.", "returns": [["refunded 30", "success"]]}
        assert run_in_child(child_run, history, path, effects, "approve", protect).value == rerun.value  # replayed
        assert lines(effects) == ["refund A1 30"] * 2
    else:
        assert resumed.value["output"] == "Refunded."


@pytest.mark.parametrize("protect", [True, False])
async def test_approved_then_asked_with_other_arguments_is_refused(
    protect: bool, files: dict[str, str], ledger: SqliteLedger, tmp_path: Path
) -> None:
    """(b) Approved as asked; the run failed before the tool ran; the retry asks with other arguments."""
    flag = tmp_path / "fail"
    flag.touch()
    await ask(ledger, files["history"], files["effects"], protect=protect)
    with pytest.raises(RuntimeError, match="before the tool ran"):
        await answer_run(
            ledger, files["history"], files["effects"], {"approve": True}, protect=protect, fail_once=str(flag)
        )
    other = {"edit": {"order_id": "A1", "amount": 82000}}
    if protect:
        with pytest.raises(ApprovalMismatchError):
            await answer_run(ledger, files["history"], files["effects"], other, protect=protect)
        assert lines(files["effects"]) == []
        # The approval it was given still holds for what was approved: the call runs as approved, once.
        done = await answer_run(ledger, files["history"], files["effects"], {"approve": True}, protect=protect)
        assert done["output"] == "Refunded."
        assert lines(files["effects"]) == ["refund A1 30"]
    else:
        await answer_run(ledger, files["history"], files["effects"], other, protect=protect)
        assert lines(files["effects"]) == ["refund A1 82000"]


def _postgres() -> Iterator[Ledger]:
    schema = f"rs_pai_{uuid.uuid4().hex[:10]}"
    with replaysafe.PostgresLedger("postgresql://root@127.0.0.1:5432/test", schema=schema) as opened:
        try:
            yield opened
        finally:
            with opened.engine.begin() as connection:
                connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgres"])
def any_ledger(request: pytest.FixtureRequest, ledger: SqliteLedger) -> Iterator[Ledger]:
    if request.param == "sqlite":
        yield ledger
    else:
        yield from _postgres()


async def test_approved_with_an_edit_runs_the_edit_once(
    files: dict[str, str], any_ledger: Ledger, events: list[replaysafe.Event]
) -> None:
    """(c) ToolApproved(override_args=...): the edit runs, once, on an approval recorded by the answer's approver."""
    await ask(any_ledger, files["history"], files["effects"], protect=True)
    edit: Answer = {"edit": {"order_id": "A1", "amount": 25}}
    done = await answer_run(any_ledger, files["history"], files["effects"], edit, protect=True)
    assert done == {"output": "Refunded.", "returns": [("refunded 25", "success")]}
    again = await answer_run(any_ledger, files["history"], files["effects"], edit, protect=True)  # a retry
    assert again == done
    assert lines(files["effects"]) == ["refund A1 25"]
    approved = [event for event in events if event.kind is replaysafe.EventKind.APPROVED]
    assert [(event.tool_name, event.approver) for event in approved] == [("refund_order", "ana@example.com")]


async def test_an_edit_of_a_decorated_tool_runs_once(
    files: dict[str, str], ledger: SqliteLedger, events: list[replaysafe.Event]
) -> None:
    """(c) on a ``@replay_safe`` tool that takes a RunContext (left out of its digest): the edit runs, once."""
    await ask(ledger, files["history"], files["effects"], protect=True, decorated=True)
    edit: Answer = {"edit": {"order_id": "A1", "amount": 25}}
    for _ in range(2):
        done = await answer_run(ledger, files["history"], files["effects"], edit, protect=True, decorated=True)
        assert done == {"output": "Refunded.", "returns": [("refunded 25", "success")]}
    assert lines(files["effects"]) == ["refund A1 25"]
    approved = [event for event in events if event.kind is replaysafe.EventKind.APPROVED]
    assert [event.approver for event in approved] == ["ana@example.com"]  # the edit ran on a recorded approval


@pytest.mark.parametrize("protect", [True, False])
async def test_an_expired_approval_is_refused(
    protect: bool, files: dict[str, str], ledger: SqliteLedger, tmp_path: Path
) -> None:
    """(d) Approved, the run failed before the tool ran, retried 16 minutes later: the approval has expired."""
    flag = tmp_path / "fail"
    flag.touch()
    with SteppedClock() as clock:
        await ask(ledger, files["history"], files["effects"], protect=protect)
        with pytest.raises(RuntimeError, match="before the tool ran"):
            await answer_run(
                ledger, files["history"], files["effects"], {"approve": True}, protect=protect, fail_once=str(flag)
            )
        clock.advance(timedelta(minutes=16))
        if protect:
            with pytest.raises(ApprovalExpiredError):
                await answer_run(ledger, files["history"], files["effects"], {"approve": True}, protect=protect)
            assert lines(files["effects"]) == []
        else:
            await answer_run(ledger, files["history"], files["effects"], {"approve": True}, protect=protect)
            assert lines(files["effects"]) == ["refund A1 30"]


@pytest.mark.parametrize("protect", [True, False])
async def test_a_rejected_call_never_runs(protect: bool, files: dict[str, str], ledger: SqliteLedger) -> None:
    """(e) ToolDenied: the model is told; the same history handed an approval afterwards still never runs it."""
    await ask(ledger, files["history"], files["effects"], protect=protect)
    denied = await answer_run(ledger, files["history"], files["effects"], {"deny": "not this one"}, protect=protect)
    assert denied == {"output": "Refunded.", "returns": [("not this one", "denied")]}
    retried = await answer_run(ledger, files["history"], files["effects"], {"approve": True}, protect=protect)
    if protect:
        assert retried == denied  # the recorded rejection, as Pydantic AI's own denial
        assert lines(files["effects"]) == []
    else:
        assert lines(files["effects"]) == ["refund A1 30"]


async def test_a_denial_handed_to_a_retry_is_recorded_once(
    files: dict[str, str], ledger: SqliteLedger, events: list[replaysafe.Event]
) -> None:
    await ask(ledger, files["history"], files["effects"], protect=True)
    for _ in range(2):  # the same deferred_tool_results handed to a retry
        denied = await answer_run(ledger, files["history"], files["effects"], {"deny": "not this one"}, protect=True)
        assert denied["returns"] == [("not this one", "denied")]
    assert [event.kind for event in events].count(replaysafe.EventKind.REJECTED) == 1
    assert lines(files["effects"]) == []


@pytest.mark.parametrize("protect", [True, False])
async def test_an_approval_handed_to_a_second_call_with_the_same_arguments_asks_again(
    protect: bool, files: dict[str, str], ledger: SqliteLedger
) -> None:
    """(f) The answer for call_x (approved, ran) handed to the same call in another model response."""
    await ask(ledger, files["history"], files["effects"], protect=protect)
    await answer_run(ledger, files["history"], files["effects"], {"approve": True}, protect=protect)
    assert lines(files["effects"]) == ["refund A1 30"]
    history = Path(files["history"])
    messages = ModelMessagesTypeAdapter.validate_json(await asyncio.to_thread(history.read_bytes))
    replanned = [
        ModelResponse(parts=message.parts, provider_response_id="chatcmpl-replanned", provider_name="openai")
        if isinstance(message, ModelResponse)
        else message
        for message in messages
    ]
    await asyncio.to_thread(history.write_bytes, ModelMessagesTypeAdapter.dump_json(replanned))
    second = await answer_run(ledger, files["history"], files["effects"], {"approve": True}, protect=protect)
    if protect:
        asked = [part.tool_call_id for m in replanned if isinstance(m, ModelResponse) for part in m.tool_calls]
        assert second == {"asks": asked}  # Pydantic AI asks the human again, for this call
        assert lines(files["effects"]) == ["refund A1 30"]
    else:
        assert lines(files["effects"]) == ["refund A1 30"] * 2


async def killed_once_decided(history: str, ledger_path: str, effects: str) -> None:
    """In a child process: the saved history handed an approval, SIGKILLed once the approval is written (the
    answer's marker left in doubt, the tool not run)."""

    def kill_when_approved(event: replaysafe.Event) -> None:
        if event.kind is replaysafe.EventKind.APPROVED:
            kill_point("decided")

    replaysafe.on_event(kill_when_approved)
    with SqliteLedger(ledger_path) as ledger:
        await answer_run(ledger, history, effects, {"approve": True}, protect=True)


async def test_an_answer_recorded_before_a_crash_is_not_recorded_again(
    files: dict[str, str], ledger: SqliteLedger, ledger_path: Path
) -> None:
    """Killed once the answer was written, resumed 16 minutes later with the same answer: the marker's rerun
    does not record it again (which would renew the approval's expiry); the approval has expired."""
    await ask(ledger, files["history"], files["effects"], protect=True)
    killed = await asyncio.to_thread(
        run_in_child, killed_once_decided, files["history"], str(ledger_path), files["effects"], kill_at="decided"
    )
    assert killed.killed
    with SteppedClock(datetime.now(timezone.utc) + timedelta(minutes=16)), pytest.raises(ApprovalExpiredError):
        await answer_run(ledger, files["history"], files["effects"], {"approve": True}, protect=True)
    assert lines(files["effects"]) == []
    [record] = [record for record in ledger.records() if record.tool_name == "refund_order"]
    state = approvals.state(record.key, ledger=ledger)
    assert state is not None
    assert state.decision is not None
    assert state.decision.by == "ana@example.com"  # the answer recorded before the crash, still on record


async def test_a_denial_after_a_crash_revokes_the_approval_recorded_before_it(
    files: dict[str, str], ledger: SqliteLedger, ledger_path: Path
) -> None:
    """Approved, killed once the approval was written (not yet spent); the human then denies the call, and the
    model is told so. A stale retry of the history with the earlier approval runs nothing: the denial replaced
    the approval in the call's record."""
    await ask(ledger, files["history"], files["effects"], protect=True)
    killed = await asyncio.to_thread(
        run_in_child, killed_once_decided, files["history"], str(ledger_path), files["effects"], kill_at="decided"
    )
    assert killed.killed
    denied = await answer_run(ledger, files["history"], files["effects"], {"deny": "a manager must"}, protect=True)
    assert denied["returns"] == [("a manager must", "denied")]
    stale = await answer_run(ledger, files["history"], files["effects"], {"approve": True}, protect=True)
    assert lines(files["effects"]) == []
    assert stale["returns"] == [("a manager must", "denied")]


async def test_a_call_the_model_asks_for_again_after_it_ran_is_deferred_then_replayed(
    files: dict[str, str], ledger: SqliteLedger
) -> None:
    """A resume that asks the model again (the history saved before its response) gets the call it approved and
    ran under the same ids: deferred again (nothing to record), and once handed the answer, replayed."""
    await ask(ledger, files["history"], files["effects"], protect=True)
    history = Path(files["history"])
    saved = await asyncio.to_thread(history.read_bytes)
    done = await answer_run(ledger, files["history"], files["effects"], {"approve": True}, protect=True)
    assert done["output"] == "Refunded."
    before_response = ModelMessagesTypeAdapter.validate_json(saved)[:1]  # the prompt: the model is asked again
    agent = build(ledger, files["effects"], protect=True)
    again = await agent.run(None, message_history=before_response, conversation_id=CONVERSATION)
    assert isinstance(again.output, DeferredToolRequests)  # asked again, not a ValueError out of the capability
    await asyncio.to_thread(history.write_bytes, ModelMessagesTypeAdapter.dump_json(again.all_messages()))
    assert await answer_run(ledger, files["history"], files["effects"], {"approve": True}, protect=True) == done
    assert lines(files["effects"]) == ["refund A1 30"]


async def test_a_call_the_model_asks_for_again_with_other_arguments_is_refused(
    files: dict[str, str], ledger: SqliteLedger, tmp_path: Path
) -> None:
    """Approved, the run failed before the tool ran; a resume asks the model again, which asks for the same call
    (same ids) with other arguments: deferred again (not a ReplayMismatchError out of the capability), and once
    handed the answer, refused (ApprovalMismatchError); nothing runs."""
    flag = tmp_path / "fail"
    flag.touch()
    await ask(ledger, files["history"], files["effects"], protect=True)
    history = Path(files["history"])
    messages = ModelMessagesTypeAdapter.validate_json(await asyncio.to_thread(history.read_bytes))
    with pytest.raises(RuntimeError, match="before the tool ran"):
        await answer_run(
            ledger, files["history"], files["effects"], {"approve": True}, protect=True, fail_once=str(flag)
        )
    replanned = [
        ModelResponse(
            parts=[
                ToolCallPart(part.tool_name, {"order_id": "A1", "amount": 82000}, part.tool_call_id)
                for part in message.tool_calls
            ],
            provider_response_id=message.provider_response_id,
            provider_name=message.provider_name,
        )
        if isinstance(message, ModelResponse)
        else message
        for message in messages
    ]
    agent = build(ledger, files["effects"], protect=True)
    again = await agent.run(None, message_history=replanned, conversation_id=CONVERSATION)
    assert isinstance(again.output, DeferredToolRequests)
    await asyncio.to_thread(history.write_bytes, ModelMessagesTypeAdapter.dump_json(again.all_messages()))
    with pytest.raises(ApprovalMismatchError):
        await answer_run(ledger, files["history"], files["effects"], {"approve": True}, protect=True)
    assert lines(files["effects"]) == []
