"""Approvals at their edges: races, streams, cancellations, steps, business keys, edits, messages."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from replaysafe import (
    ApprovalMismatchError,
    ApprovalRequiredError,
    CallKey,
    Event,
    Ledger,
    ReplayMismatchError,
    ReplaySafeError,
    Status,
    approvals,
    replay_safe,
    tool_call,
)


def new_key() -> CallKey:
    return CallKey(f"thread-{uuid.uuid4().hex[:10]}", "msg_1", "call_1")


SECRET = 987654321


def _race_a_rejection_with_a_spend(ledger: Ledger) -> None:
    made: list[int] = []

    @replay_safe(ledger=ledger, needs_approval=True, name="refund_order")
    def refund_order(amount: int) -> str:
        made.append(amount)
        return "ok"

    key = new_key()
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order(30)
    approvals.approve(key, by="ana", ledger=ledger)
    outcomes: dict[str, Any] = {}
    go = threading.Barrier(2)

    def spend() -> None:
        go.wait()
        try:
            with tool_call(*key):
                outcomes["spend"] = refund_order(30)
        except Exception as exc:
            outcomes["spend"] = type(exc).__name__

    def reject() -> None:
        go.wait()
        try:
            approvals.reject(key, by="bo", reason="no", ledger=ledger)
            outcomes["reject"] = "landed"
        except Exception as exc:
            outcomes["reject"] = type(exc).__name__

    threads = [threading.Thread(target=spend), threading.Thread(target=reject)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    if outcomes["reject"] == "landed":
        assert made == [], outcomes
        assert outcomes["spend"] == "ApprovalRejectedError", outcomes
    else:
        assert made == [30], outcomes


def test_reject_racing_the_spend_never_runs_on_a_replaced_decision(ledger: Ledger) -> None:
    """A spender and a rejecter race on one approved record, many times: the tool runs only if the spend won,
    and never after the rejection landed."""
    for _ in range(15):
        _race_a_rejection_with_a_spend(ledger)


def test_many_threads_on_one_approval_run_once(ledger: Ledger) -> None:
    made: list[int] = []

    @replay_safe(ledger=ledger, needs_approval=True, wait_timeout=20)
    def refund_order(amount: int) -> str:
        made.append(amount)
        return "ok"

    key = new_key()
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order(30)
    approvals.approve(key, by="ana", ledger=ledger)
    go = threading.Barrier(6)
    answers: list[Any] = []

    def call() -> None:
        go.wait()
        try:
            with tool_call(*key):
                answers.append(refund_order(30))
        except Exception as exc:
            answers.append(type(exc).__name__)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert made == [30]


def test_a_streaming_tool_closed_early_is_not_rerun_on_its_approval(ledger: Ledger) -> None:
    made: list[int] = []

    @replay_safe(ledger=ledger, needs_approval=True)
    def refunds(amount: int) -> Iterator[int]:
        made.append(amount)
        yield 1
        yield 2

    key = new_key()
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        list(refunds(30))
    approvals.approve(key, by="ana", ledger=ledger)
    with tool_call(*key):
        stream = refunds(30)
        next(stream)
        stream.close()
    with tool_call(*key), pytest.raises(ApprovalRequiredError) as again:
        list(refunds(30))
    assert again.value.may_have_run
    assert made == [30]


def test_an_async_tool_cancelled_mid_run_is_not_rerun_on_its_approval(ledger: Ledger) -> None:
    made: list[int] = []
    key = new_key()

    async def flow() -> None:
        started, never = asyncio.Event(), asyncio.Event()

        @replay_safe(ledger=ledger, needs_approval=True)
        async def refund_order(amount: int) -> str:
            made.append(amount)
            started.set()
            await never.wait()
            return "ok"

        with tool_call(*key):
            with pytest.raises(ApprovalRequiredError):
                await refund_order(30)
            await approvals.aapprove(key, by="ana", ledger=ledger)
            task = asyncio.ensure_future(refund_order(30))
            await asyncio.wait_for(started.wait(), 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(ApprovalRequiredError) as again:
                await refund_order(30)
            assert again.value.may_have_run

    asyncio.run(flow())
    assert made == [30]


def test_a_needs_approval_step_in_a_plain_parent_runs_once_on_its_approval(ledger: Ledger) -> None:
    made: list[int] = []

    class Interrupted(BaseException):
        pass

    @replay_safe(ledger=ledger, needs_approval=True)
    def refund_order(amount: int) -> str:
        made.append(amount)
        return "ok"

    crash = [False]

    @replay_safe(ledger=ledger)
    def agent_turn(amount: int) -> str:
        result = refund_order(amount)
        if crash[0]:
            crash[0] = False
            raise Interrupted()
        return result

    key = new_key()
    with tool_call(*key), pytest.raises(ApprovalRequiredError) as asked:
        agent_turn(30)
    approvals.approve(asked.value, by="ana", ledger=ledger)
    crash[0] = True
    with tool_call(*key), pytest.raises(Interrupted):
        agent_turn(30)
    with tool_call(*key):
        assert agent_turn(30) == "ok"
    assert made == [30]


def test_business_key_other_amount_is_refused(ledger: Ledger) -> None:
    made: list[int] = []

    @replay_safe(ledger=ledger, needs_approval=True, key=lambda order_id, amount: order_id)
    def refund_order(order_id: str, amount: int) -> str:
        made.append(amount)
        return "ok"

    with tool_call("t1", "m1", "c1"), pytest.raises(ApprovalRequiredError) as asked:
        refund_order("A1", 30)
    approvals.approve(asked.value, by="ana", ledger=ledger)
    with tool_call("t2", "m2", "c2"), pytest.raises(ApprovalMismatchError):
        refund_order("A1", 82000)
    with tool_call("t3", "m3", "c3"):
        assert refund_order("A1", 30) == "ok"
    with tool_call("t4", "m4", "c4"), pytest.raises(ReplayMismatchError):
        refund_order("A1", 82000)
    assert made == [30]


def test_an_edit_runs_once_and_then_neither_form_reruns(ledger: Ledger) -> None:
    made: list[Any] = []

    @replay_safe(ledger=ledger, needs_approval=True)
    def refund_order(order_id: str, amount: int) -> str:
        made.append(amount)
        return f"re_{amount}"

    key = new_key()
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order("A1", 82000)
    approvals.approve(key, by="ana", args={"order_id": "A1", "amount": 10.0}, ledger=ledger)
    with tool_call(*key):
        assert refund_order("A1", 82000) == "re_10.0"
    with tool_call(*key):
        assert refund_order("A1", 82000) == "re_10.0"
    with tool_call(*key), pytest.raises(ReplayMismatchError):
        refund_order("A1", 10)
    assert made == [10.0]


def test_messages_and_events_never_quote_argument_values(ledger: Ledger, events: list[Event]) -> None:
    @replay_safe(ledger=ledger, needs_approval=True)
    def refund_order(order_id: str, amount: int) -> str:
        return f"secret-result-{SECRET}"

    key = new_key()
    texts: list[str] = []

    def collect(call: Any) -> None:
        try:
            call()
        except ReplaySafeError as exc:
            texts.append(str(exc))

    def ask(amount: int) -> Any:
        def go() -> None:
            with tool_call(*key):
                refund_order(f"order-{SECRET}", amount)

        return go

    collect(ask(SECRET))
    collect(ask(SECRET + 1))
    approvals.reject(key, by="ana", reason="no", ledger=ledger)
    collect(ask(SECRET))
    approvals.approve(key, by="ana", args={"order_id": f"order-{SECRET}", "amount": SECRET + 2}, ledger=ledger)
    collect(ask(SECRET + 5))
    collect(ask(SECRET))
    collect(ask(SECRET))
    collect(ask(SECRET + 1))
    assert texts
    for text in texts + [event.message for event in events]:
        assert str(SECRET) not in text, text
        assert str(SECRET + 2) not in text, text
    record = ledger.get(key)
    assert record is not None and record.status is Status.COMPLETED
