"""Approvals through Strands' own flow: a ``BeforeToolCallEvent`` hook holds a refund for a human
(``event.interrupt``), the human answers with an ``interruptResponse``, and ``ReplaySafeHooks`` records the answer
as a bound approval (docs/approvals.md) that the call then spends. Each case runs the same agent without the hooks
(the control), which breaks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from strands import Agent, tool
from strands.hooks import BeforeToolCallEvent, HookOrder, HookRegistry
from strands.session import FileSessionManager

from replaysafe import (
    ApprovalExpiredError,
    ApprovalMismatchError,
    ApprovalRequiredError,
    CallKey,
    Event,
    EventKind,
    Ledger,
    ReplayMismatchError,
    SqliteLedger,
    Status,
)
from replaysafe.testing import Script, ScriptedCall, SteppedClock, kill_point, run_in_child
from replaysafe_strands import ReplaySafeHooks
from replaysafe_strands.testing import ScriptedModel, tracking_id

SESSION = "order-A1"
THREAD = f"{SESSION}/default"
REFUND = Script(((ScriptedCall("refund_order", {"order_id": "A1"}),), "Done."), name="approve-refund")


class Approvals:
    """The app's approval hook: a refund waits for a human. The answer is ``"yes"``, ``{"order_id": ...}`` (approve
    that order instead: an edit the hook applies to the call) or anything else (a refusal, which cancels it)."""

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self.ask)

    def ask(self, event: BeforeToolCallEvent) -> None:
        if event.tool_use["name"] != "refund_order":
            return
        answer = event.interrupt("approve-refund", reason="refund order?")
        if isinstance(answer, dict):
            event.tool_use = {**event.tool_use, "input": answer}
        elif answer != "yes":
            event.cancel_tool = f"the refund was refused: {answer}"


class After:
    """A hook that runs after every other, ReplaySafeHooks' included: ``change`` sees the call about to run."""

    def __init__(self, change: Any) -> None:
        self.change = change

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self.change, order=HookOrder.SDK_LAST)


def refund_tool(effects: list[str]) -> Any:
    @tool
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        effects.append(order_id)
        return f"refunded {order_id}"

    return refund_order


def agent(
    folder: Path, tools: Sequence[Any], ledger: Ledger | None, *, script: Script = REFUND, extra: Sequence[Any] = ()
) -> Agent:
    """A new agent restored from the file session in ``folder``; ``ledger=None``: the control, without the hooks."""
    model = ScriptedModel(script)
    hooks: list[Any] = [model, Approvals()]
    if ledger is not None:
        hooks.append(ReplaySafeHooks(ledger))
    hooks.extend(extra)
    session = FileSessionManager(session_id=SESSION, storage_dir=str(folder / "sessions"))
    return Agent(model=model, tools=list(tools), hooks=hooks, session_manager=session, callback_handler=None)


def answer(interrupt_id: str, response: Any) -> list[Any]:
    return [{"interruptResponse": {"interruptId": interrupt_id, "response": response}}]


def ask(folder: Path, tools: Sequence[Any], ledger: Ledger | None, script: Script = REFUND) -> str:
    """Run the prompt: the refund is held for a human. Returns the interrupt's id."""
    paused = agent(folder, tools, ledger, script=script)("Refund A1")
    assert paused.stop_reason == "interrupt"
    assert paused.interrupts is not None
    (interrupt,) = paused.interrupts
    return interrupt.id


def refund_key(script: Script = REFUND, turn: int = 0) -> CallKey:
    _, (call_id,) = script.ids("bedrock", turn)
    return CallKey(THREAD, tracking_id(script, turn), call_id)


@pytest.fixture
def events(replaysafe_events: list[Event]) -> list[Event]:
    return replaysafe_events


def kinds(events: list[Event]) -> list[str]:
    approval_kinds = (EventKind.APPROVAL_REQUESTED, EventKind.APPROVED, EventKind.REJECTED, EventKind.APPROVAL_REFUSED)
    return [str(e.kind.value) for e in events if e.kind in approval_kinds]


@pytest.mark.parametrize("protect", [True, False], ids=["with-hooks", "control"])
def test_the_answer_is_a_bound_approval_spent_once(
    tmp_path: Path, sql_ledger: Ledger, events: list[Event], protect: bool
) -> None:
    """Held: the call is paused for a decision. Answered yes: approved (by the hooks' approver) and spent by the run.
    Resumed again from the toolUse message, it replays."""
    effects: list[str] = []
    tools = [refund_tool(effects)]
    interrupt_id = ask(tmp_path, tools, sql_ledger if protect else None)
    agent(tmp_path, tools, sql_ledger if protect else None)(answer(interrupt_id, "yes"))
    assert effects == ["A1"]
    if not protect:
        assert kinds(events) == []
        return
    assert kinds(events) == ["approval_requested", "approved"]
    assert [e.approver for e in events if e.kind is EventKind.APPROVED] == ["strands-interrupt"]
    record = sql_ledger.get(refund_key())
    assert record is not None
    assert record.status is Status.COMPLETED


#: Where the second process of the crash test dies: inside the approved refund, after its side effect.
REFUNDED = "refund-made"


def crash_child(ledger_path: str, folder: str, effects_path: str, protect: bool, step: str) -> str:
    """One process of the crash test: ``ask`` (hold the refund, note the interrupt's id), ``approve`` (answer yes:
    the refund runs, appends to ``effects_path`` and is SIGKILLed) or ``resume`` (restore the session and hand the
    same answer again, as an app retrying the human's answer does)."""
    root, effects = Path(folder), Path(effects_path)

    @tool
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        with effects.open("a") as file:
            file.write(f"{order_id}\n")
        kill_point(REFUNDED)
        return f"refunded {order_id}"

    with SqliteLedger(ledger_path) as ledger:
        if step == "ask":
            (root / "interrupt-id.txt").write_text(ask(root, [refund_order], ledger if protect else None))
            return "asked"
        interrupt_id = (root / "interrupt-id.txt").read_text()
        try:
            result = agent(root, [refund_order], ledger if protect else None)(answer(interrupt_id, "yes"))
        except ApprovalRequiredError as asked:
            return f"asked again, may_have_run={asked.may_have_run}"
        return str(result).strip()


@pytest.mark.parametrize("protect", [True, False], ids=["with-hooks", "control"])
def test_a_kill_inside_the_approved_tool_asks_again_instead_of_running(tmp_path: Path, protect: bool) -> None:
    """Approved, the refund runs and its process is SIGKILLed. A new process restores the session (Strands saved
    the interrupt unanswered) and the app hands the same answer again: the approval was spent, so the call asks for a
    new decision (ApprovalRequiredError, may_have_run) instead of running. The control refunds twice."""
    ledger_path, effects = tmp_path / "ledger.db", tmp_path / "effects.txt"
    args = (str(ledger_path), str(tmp_path), str(effects), protect)
    assert run_in_child(crash_child, *args, "ask", timeout=60).value == "asked"
    killed = run_in_child(crash_child, *args, "approve", kill_at=REFUNDED, timeout=60)
    assert killed.killed
    assert effects.read_text().split() == ["A1"]
    if protect:
        resumed = run_in_child(crash_child, *args, "resume", timeout=60)
        assert resumed.value == "asked again, may_have_run=True"
        assert effects.read_text().split() == ["A1"]
        with SqliteLedger(ledger_path) as ledger:
            record = ledger.get(refund_key())
        assert record is not None
        assert record.status is Status.PAUSED
    else:
        resumed = run_in_child(crash_child, *args, "resume", kill_at=REFUNDED, timeout=60)
        assert effects.read_text().split() == ["A1", "A1"]


@pytest.mark.parametrize("protect", [True, False], ids=["with-hooks", "control"])
def test_a_call_asked_with_other_arguments_than_approved_is_refused(
    tmp_path: Path, ledger: Ledger, events: list[Event], protect: bool
) -> None:
    """Approved for A1, the call is then asked for Z9 (a hook after the approval changes it): refused, nothing runs.
    The control refunds Z9, which nobody approved."""
    effects: list[str] = []
    tools = [refund_tool(effects)]

    def retarget(event: BeforeToolCallEvent) -> None:
        event.tool_use = {**event.tool_use, "input": {"order_id": "Z9"}}

    interrupt_id = ask(tmp_path, tools, ledger if protect else None)
    resumed = agent(tmp_path, tools, ledger if protect else None, extra=[After(retarget)])
    if not protect:
        resumed(answer(interrupt_id, "yes"))
        assert effects == ["Z9"]
        return
    with pytest.raises(ApprovalMismatchError):
        resumed(answer(interrupt_id, "yes"))
    assert effects == []
    assert [e.reason for e in events if e.kind is EventKind.APPROVAL_REFUSED] == ["mismatch"]


@pytest.mark.parametrize("protect", [True, False], ids=["with-hooks", "control"])
def test_an_edit_in_the_answer_runs_the_edit_once(
    tmp_path: Path, ledger: Ledger, events: list[Event], protect: bool
) -> None:
    """The human answers with another order (B2), which the app's hook applies to the call: approved as an edit,
    it runs B2 once; resumed again from the model's toolUse message (A1) with no approval hook to apply the edit, it is
    refused: the unedited A1 never runs. The control runs both."""
    effects: list[str] = []
    tools = [refund_tool(effects)]
    interrupt_id = ask(tmp_path, tools, ledger if protect else None)
    first = agent(tmp_path, tools, ledger if protect else None)
    first(answer(interrupt_id, {"order_id": "B2"}))
    assert effects == ["B2"]
    pending = [m for m in first.messages if m["role"] == "assistant"][:1]
    model = ScriptedModel(REFUND)
    hooks: list[Any] = [model, *([ReplaySafeHooks(ledger, thread_id=THREAD)] if protect else [])]
    again = Agent(
        model=model, tools=tools, hooks=hooks, messages=[*first.messages[:1], *pending], callback_handler=None
    )
    if not protect:
        again()  # the model's A1, under the same ids, with no approval hook in the way
        assert effects == ["B2", "A1"]
        return
    with pytest.raises(ReplayMismatchError):
        again()
    assert effects == ["B2"]
    assert kinds(events) == ["approval_requested", "approved"]


@pytest.mark.parametrize("protect", [True, False], ids=["with-hooks", "control"])
def test_an_expired_approval_is_refused(tmp_path: Path, ledger: Ledger, events: list[Event], protect: bool) -> None:
    """Approved, the call waits past the approval's expiry (the clock stepped by a later hook) before it is claimed:
    refused, nothing runs. The control runs it."""
    effects: list[str] = []
    tools = [refund_tool(effects)]
    with SteppedClock() as clock:
        interrupt_id = ask(tmp_path, tools, ledger if protect else None)
        resumed = agent(tmp_path, tools, ledger if protect else None, extra=[After(lambda _: clock.advance(901))])
        if protect:
            with pytest.raises(ApprovalExpiredError):
                resumed(answer(interrupt_id, "yes"))
            assert [e.reason for e in events if e.kind is EventKind.APPROVAL_REFUSED] == ["expired"]
        else:
            resumed(answer(interrupt_id, "yes"))
    assert effects == ([] if protect else ["A1"])


@pytest.mark.parametrize("protect", [True, False], ids=["with-hooks", "control"])
def test_a_rejected_call_never_runs(tmp_path: Path, ledger: Ledger, events: list[Event], protect: bool) -> None:
    """Answered no: the hook cancels the call (the model reads the refusal) and the rejection is recorded; a later
    resume of the model's toolUse, with no approval hook in the way, does not run it either. The control does."""
    effects: list[str] = []
    tools = [refund_tool(effects)]
    interrupt_id = ask(tmp_path, tools, ledger if protect else None)
    first = agent(tmp_path, tools, ledger if protect else None)
    first(answer(interrupt_id, "no"))
    assert effects == []
    pending = [m for m in first.messages if m["role"] == "assistant"][:1]
    model = ScriptedModel(REFUND)
    hooks: list[Any] = [model, *([ReplaySafeHooks(ledger, thread_id=THREAD)] if protect else [])]
    again = Agent(
        model=model, tools=tools, hooks=hooks, messages=[*first.messages[:1], *pending], callback_handler=None
    )
    again()
    assert effects == ([] if protect else ["A1"])
    if protect:
        assert kinds(events) == ["approval_requested", "rejected"]
        results = [b["toolResult"] for m in again.messages for b in m["content"] if "toolResult" in b]
        assert results[0]["status"] == "error"
        assert "the refund was refused: no" in results[0]["content"][0]["text"]


TWICE = Script(
    ((ScriptedCall("refund_order", {"order_id": "A1"}),), (ScriptedCall("refund_order", {"order_id": "A1"}),), "Done."),
    name="approve-twice",
)


@pytest.mark.parametrize("protect", [True, False], ids=["with-hooks", "control"])
def test_an_approval_is_not_reused_by_a_second_call_with_the_same_arguments(
    tmp_path: Path, ledger: Ledger, events: list[Event], protect: bool
) -> None:
    """The model asks for the same refund again under new ids: the first call's approval does not let it run; it is
    held and recorded as a call waiting for its own decision."""
    effects: list[str] = []
    tools = [refund_tool(effects)]
    interrupt_id = ask(tmp_path, tools, ledger if protect else None, script=TWICE)
    resumed = agent(tmp_path, tools, ledger if protect else None, script=TWICE)
    second = resumed(answer(interrupt_id, "yes"))
    assert effects == ["A1"]
    assert second.stop_reason == "interrupt"  # Strands asks again for the new call
    # The second call's toolUse run with no approval hook in the way: nothing approved it.
    turn = [m for m in resumed.messages if m["role"] == "assistant"][1]
    model = ScriptedModel(TWICE)
    hooks: list[Any] = [model, *([ReplaySafeHooks(ledger, thread_id=THREAD)] if protect else [])]
    history = [*resumed.messages[: resumed.messages.index(turn) + 1]]
    again = Agent(model=model, tools=tools, hooks=hooks, messages=history, callback_handler=None)
    if not protect:
        again()
        assert effects == ["A1", "A1"]
        return
    with pytest.raises(ApprovalRequiredError):
        again()
    assert effects == ["A1"]
    assert kinds(events) == ["approval_requested", "approved", "approval_requested"]
