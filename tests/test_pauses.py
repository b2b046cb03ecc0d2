"""Pauses: a tool that stops for a human is kept paused with its completed steps, on every ledger."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from replaysafe import (
    CallKey,
    Event,
    EventKind,
    Ledger,
    ReplayMismatchError,
    Status,
    _config,
    register_pause,
    replay_safe,
    tool_call,
)


class NeedsApproval(Exception):
    """What a framework raises to stop a tool until a human answers."""


class GraphInterrupt(BaseException):
    """A pause that is a BaseException, as some frameworks' are."""


@pytest.fixture
def no_registered_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_config, "pauses", ())


def new_ids() -> tuple[str, str, str]:
    return (f"thread-{uuid.uuid4().hex[:10]}", "msg_1", "call_1")


def test_a_refund_then_a_pause_refunds_once_on_resume(ledger: Ledger, events: list[Event]) -> None:
    """The trial's case: refund (a step), then ask for approval (a pause), then resume: one refund."""
    refunds: list[str] = []
    approvals = iter([None, "yes"])

    @replay_safe(ledger=ledger)
    def refund(order_id: str) -> str:
        refunds.append(order_id)
        return f"re_{order_id}"

    @replay_safe(ledger=ledger, pause_on=NeedsApproval)
    def refund_and_confirm(order_id: str) -> str:
        receipt = refund(order_id)
        answer = next(approvals)
        if answer is None:
            raise NeedsApproval("waiting for a human")
        return f"{receipt} approved {answer}"

    ids = new_ids()
    with tool_call(*ids), pytest.raises(NeedsApproval):
        refund_and_confirm("o1")
    paused = ledger.get(CallKey(*ids))
    assert paused is not None and paused.status is Status.PAUSED
    assert paused.result == 'rs-steps-1:["refund"]'  # no result: the name of each step made, in order
    step = ledger.get(CallKey(ids[0], ids[1], f"{ids[2]}>refund#1"))
    assert step is not None and step.status is Status.COMPLETED
    assert [e.kind for e in events if e.key == CallKey(*ids)] == [EventKind.STARTED, EventKind.PAUSED]
    with tool_call(*ids):
        assert refund_and_confirm("o1") == "re_o1 approved yes"
    assert refunds == ["o1"]
    done = ledger.get(CallKey(*ids))
    assert done is not None and done.status is Status.COMPLETED and done.attempt == 2
    with tool_call(*ids):
        assert refund_and_confirm("o1") == "re_o1 approved yes"  # a replay, not a third run


def test_register_pause_applies_to_every_tool(ledger: Ledger, no_registered_pauses: None) -> None:
    runs: list[int] = []

    @replay_safe(ledger=ledger, record_errors=True)
    def approve() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise GraphInterrupt("waiting")
        return "approved"

    register_pause(GraphInterrupt)
    register_pause(GraphInterrupt)  # twice: no effect
    assert _config.pauses == (GraphInterrupt,)
    ids = new_ids()
    with tool_call(*ids), pytest.raises(GraphInterrupt):
        approve()
    record = ledger.get(CallKey(*ids))
    assert record is not None and record.status is Status.PAUSED  # neither failed nor in doubt
    with tool_call(*ids):
        assert approve() == "approved"
    assert runs == [1, 1]


def test_register_pause_refuses_what_is_not_an_exception_class(no_registered_pauses: None) -> None:
    with pytest.raises(TypeError, match="exception classes"):
        register_pause("GraphInterrupt")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pause_on takes exception classes"):
        replay_safe(pause_on=(int,))(lambda: None)  # type: ignore[arg-type]


def test_a_pause_inside_a_step_pauses_the_step_and_its_parent(ledger: Ledger) -> None:
    """The step that paused runs again from its top on resume; the step before it replays."""
    effects: list[str] = []
    answers = iter([None, "ok"])

    @replay_safe(ledger=ledger)
    def reserve() -> str:
        effects.append("reserve")
        return "r1"

    @replay_safe(ledger=ledger)
    def ask() -> str:
        effects.append("ask")
        answer = next(answers)
        if answer is None:
            raise NeedsApproval("waiting")
        return answer

    @replay_safe(ledger=ledger, pause_on=(NeedsApproval,))
    def book() -> str:
        return reserve() + ask()

    ids = new_ids()
    with tool_call(*ids), pytest.raises(NeedsApproval):
        book()
    for key, status in ((CallKey(*ids), Status.PAUSED), (CallKey(ids[0], ids[1], f"{ids[2]}>ask#1"), Status.PAUSED)):
        record = ledger.get(key)
        assert record is not None and record.status is status
    with tool_call(*ids):
        assert book() == "r1ok"
    assert effects == ["reserve", "ask", "ask"]


def test_a_pause_of_a_step_alone_pauses_its_parent_not_fails_it(ledger: Ledger) -> None:
    """pause_on= on the step only, record_errors=True on the parent: the step's pause still pauses the parent (not
    its recorded failure, which would make the approved resume raise forever), and the refund made before the
    pause runs once across the pause and the resume."""
    effects: list[str] = []
    answers = iter([None, "approved"])

    @replay_safe(ledger=ledger)
    def refund() -> str:
        effects.append("refund")
        return "refunded"

    @replay_safe(ledger=ledger, pause_on=NeedsApproval)
    def ask() -> str:
        answer = next(answers)
        if answer is None:
            raise NeedsApproval("waiting")
        return answer

    @replay_safe(ledger=ledger, record_errors=True)
    def refund_with_approval() -> str:
        return refund() + " " + ask()

    ids = new_ids()
    with tool_call(*ids), pytest.raises(NeedsApproval):
        refund_with_approval()
    parent = ledger.get(CallKey(*ids))
    assert parent is not None
    assert parent.status is Status.PAUSED
    with tool_call(*ids):
        assert refund_with_approval() == "refunded approved"
    assert effects == ["refund"]


async def test_an_async_tool_pauses_and_resumes(ledger: Ledger) -> None:
    effects: list[str] = []
    answers = iter([None, "ok"])

    @replay_safe(ledger=ledger)
    async def charge() -> str:
        effects.append("charge")
        return "c"

    @replay_safe(ledger=ledger)
    async def flow() -> str:
        receipt = await charge()
        answer = next(answers)
        if answer is None:
            raise GraphInterrupt("waiting")
        return receipt + answer

    ids = new_ids()
    async with tool_call(*ids, pauses=(GraphInterrupt,)):
        with pytest.raises(GraphInterrupt):
            await flow()
    record = ledger.get(CallKey(*ids))
    assert record is not None and record.status is Status.PAUSED
    async with tool_call(*ids, pauses=(GraphInterrupt,)):
        assert await flow() == "cok"
    assert effects == ["charge"]


def test_a_paused_call_can_be_settled_by_hand(ledger: Ledger) -> None:
    """resolve() accepts a paused call: record what a human decided, or let it run again."""

    @replay_safe(ledger=ledger, pause_on=NeedsApproval)
    def wait_for_human() -> str:
        raise NeedsApproval("waiting")

    ids = new_ids()
    with tool_call(*ids), pytest.raises(NeedsApproval):
        wait_for_human()
    settled = ledger.resolve(CallKey(*ids), result="declined by hand")
    assert settled is not None and settled.status is Status.COMPLETED
    with tool_call(*ids):
        assert wait_for_human() == "declined by hand"


def refund_then_approval(
    ledger: Ledger, effects: list[str], answer: str | None, *, step: str = "refund", amount: int = 10
) -> Callable[[str], str]:
    """The docs' pause example as a deploy would ship it: the refund step's name (``step``) and argument
    (``amount``) are what the deployed code says; ``answer`` is the human's (``None``: not yet)."""

    @replay_safe(ledger=ledger, name=step)
    def refund(order_id: str, amount: int) -> str:
        effects.append(f"{step} {order_id} {amount}")
        return f"re_{order_id}"

    @replay_safe(ledger=ledger, pause_on=NeedsApproval)
    def refund_then_confirm(order_id: str) -> str:
        receipt = refund(order_id, amount)  # recorded before the pause: replays on resume
        if answer is None:
            raise NeedsApproval("ask a human")
        return f"{receipt}, approved: {answer}"

    return refund_then_confirm


def test_a_step_renamed_while_its_call_is_paused_is_refused_and_runs_nothing(
    ledger: Ledger, events: list[Event]
) -> None:
    """Issue #29: the refund step is renamed by a deploy while the call waits for approval. On resume the
    renamed step finds no record under its new key; the record of the paused call says a step named refund
    stood at its place, and refund is recorded: ReplayMismatchError naming both, nothing runs, and the call
    stays paused, so every later resume is refused too until the step runs under its recorded name."""
    effects: list[str] = []
    ids = new_ids()
    with tool_call(*ids), pytest.raises(NeedsApproval):
        refund_then_approval(ledger, effects, None)("o1")
    for _ in range(2):
        with tool_call(*ids), pytest.raises(ReplayMismatchError) as refused:
            refund_then_approval(ledger, effects, "yes", step="issue_refund")("o1")
        message = str(refused.value)
        assert "'refund'" in message and "issue_refund" in message and "did not run" in message
        assert "@replay_safe(name='refund')" in message
        paused = ledger.get(CallKey(*ids))
        assert paused is not None and paused.status is Status.PAUSED
        assert paused.result == 'rs-steps-1:["refund"]'
    assert effects == ["refund o1 10"]
    assert ledger.get(CallKey(ids[0], ids[1], f"{ids[2]}>issue_refund#1")) is None  # never even claimed
    mismatches = [e for e in events if e.kind is EventKind.MISMATCH]
    assert [e.tool_name for e in mismatches] == ["issue_refund", "issue_refund"]
    # Deployed again under the recorded name: the resume replays the refund and finishes.
    with tool_call(*ids):
        assert refund_then_approval(ledger, effects, "yes")("o1") == "re_o1, approved: yes"
    assert effects == ["refund o1 10"]


def test_a_step_with_other_arguments_after_a_pause_is_refused_and_the_call_stays_paused(ledger: Ledger) -> None:
    """The same step at its place, called with other arguments on resume: its own record refuses it, as
    before, and the call is kept paused (not released) so that the next resume is checked again."""
    effects: list[str] = []
    ids = new_ids()
    with tool_call(*ids), pytest.raises(NeedsApproval):
        refund_then_approval(ledger, effects, None)("o1")
    with tool_call(*ids), pytest.raises(ReplayMismatchError, match="other arguments"):
        refund_then_approval(ledger, effects, "yes", amount=11)("o1")
    paused = ledger.get(CallKey(*ids))
    assert paused is not None and paused.status is Status.PAUSED and paused.attempt == 2
    with tool_call(*ids):
        assert refund_then_approval(ledger, effects, "yes")("o1") == "re_o1, approved: yes"
    assert effects == ["refund o1 10"]


def test_an_unchanged_resume_replays_its_steps_and_new_steps_after_them_run(ledger: Ledger) -> None:
    """The check costs a resume nothing it did before: the recorded steps replay in their places, and a
    step past the places the paused execution reached is new work and runs."""
    effects: list[str] = []
    answers = iter([None, None, "yes"])

    @replay_safe(ledger=ledger)
    def charge(n: int) -> int:
        effects.append(f"charge {n}")
        return n

    @replay_safe(ledger=ledger)
    def notify(n: int) -> int:
        effects.append(f"notify {n}")
        return n

    @replay_safe(ledger=ledger, pause_on=NeedsApproval)
    def flow() -> int:
        total = charge(1) + notify(2) + charge(3)
        answer = next(answers)
        if answer is None:
            raise NeedsApproval("ask")
        return total + notify(4)  # after the pause: a fourth place, new on the last resume

    ids = new_ids()
    for _ in range(2):
        with tool_call(*ids), pytest.raises(NeedsApproval):
            flow()
    with tool_call(*ids):
        assert flow() == 10
    with tool_call(*ids):
        assert flow() == 10  # finished: replayed
    assert effects == ["charge 1", "notify 2", "charge 3", "notify 4"]


async def test_an_async_step_renamed_while_its_call_is_paused_is_refused(ledger: Ledger) -> None:
    """The same refusal through the async driver (the earlier step's record read with the async ledger)."""
    effects: list[str] = []

    def build(step: str, answer: str | None) -> Callable[[], Any]:
        @replay_safe(ledger=ledger, name=step)
        async def charge() -> str:
            effects.append(step)
            return "c"

        @replay_safe(ledger=ledger)
        async def flow() -> str:
            receipt = await charge()
            if answer is None:
                raise GraphInterrupt("waiting")
            return receipt + answer

        return flow

    ids = new_ids()
    async with tool_call(*ids, pauses=(GraphInterrupt,)):
        with pytest.raises(GraphInterrupt):
            await build("charge", None)()
    async with tool_call(*ids, pauses=(GraphInterrupt,)):
        with pytest.raises(ReplayMismatchError, match="'charge'"):
            await build("capture", "ok")()
    async with tool_call(*ids, pauses=(GraphInterrupt,)):
        assert await build("charge", "ok")() == "cok"
    assert effects == ["charge"]
