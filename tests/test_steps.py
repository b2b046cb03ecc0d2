"""Steps: a protected call made inside another is claimed, recorded and replayed on its own, on every ledger."""

from __future__ import annotations

import asyncio
import concurrent.futures
import pickle
import uuid
from typing import Any

import pytest

from replaysafe import (
    CallInfo,
    CallKey,
    Ledger,
    ReplayMismatchError,
    Status,
    current_call,
    replay_safe,
    tool_call,
)


def new_ids() -> tuple[str, str, str]:
    return (f"thread-{uuid.uuid4().hex[:10]}", "msg_1", "call_1")


def step_key(parent: tuple[str, str, str], *path: str) -> CallKey:
    """The key of a step (``"charge#1"``), or of a step of a step (``"charge#1", "notify#2"``)."""
    return CallKey(parent[0], parent[1], parent[2] + "".join(f">{step}" for step in path))


def test_each_step_is_recorded_under_its_parent_and_replays_with_it(ledger: Ledger) -> None:
    """Two steps and a second call of one of them: three records keyed by name and ordinal."""
    effects: list[str] = []

    @replay_safe(ledger=ledger)
    def charge(order_id: str, amount: int) -> str:
        effects.append(f"charge {order_id} {amount}")
        return f"ch_{order_id}_{amount}"

    @replay_safe(ledger=ledger)
    def notify(order_id: str) -> str:
        effects.append(f"notify {order_id}")
        return "sent"

    @replay_safe(ledger=ledger)
    def checkout(order_id: str) -> list[str]:
        return [charge(order_id, 10), charge(order_id, 5), notify(order_id)]

    ids = new_ids()
    for _ in range(2):
        with tool_call(*ids):
            assert checkout("o1") == ["ch_o1_10", "ch_o1_5", "sent"]
    assert effects == ["charge o1 10", "charge o1 5", "notify o1"]
    for path, tool in (("charge#1",), "charge"), (("charge#2",), "charge"), (("notify#1",), "notify"):
        record = ledger.get(step_key(ids, *path))
        assert record is not None and record.status is Status.COMPLETED and record.tool_name == tool


def test_a_parent_in_doubt_runs_again_and_only_its_unfinished_step_runs(ledger: Ledger) -> None:
    """The parent is interrupted inside its second step: both are in doubt. On the rerun, the
    first step replays and only the second runs again."""
    effects: list[str] = []
    interrupt = [True]

    @replay_safe(ledger=ledger)
    def charge(order_id: str) -> str:
        effects.append(f"charge {order_id}")
        return "ch_1"

    @replay_safe(ledger=ledger)
    def ship(order_id: str) -> str:
        effects.append(f"ship {order_id}")
        if interrupt[0]:
            interrupt[0] = False
            raise KeyboardInterrupt  # the process stops mid-step: whether it shipped is unknown
        return "shipped"

    @replay_safe(ledger=ledger)
    def fulfil(order_id: str) -> str:
        return f"{charge(order_id)} {ship(order_id)}"

    ids = new_ids()
    with tool_call(*ids), pytest.raises(KeyboardInterrupt):
        fulfil("o1")
    parent, first, second = (ledger.get(k) for k in (CallKey(*ids), step_key(ids, "charge#1"), step_key(ids, "ship#1")))
    assert parent is not None and parent.status is Status.IN_DOUBT
    assert first is not None and first.status is Status.COMPLETED
    assert second is not None and second.status is Status.IN_DOUBT
    with tool_call(*ids):
        assert fulfil("o1") == "ch_1 shipped"
    assert effects == ["charge o1", "ship o1", "ship o1"]
    resumed = ledger.get(CallKey(*ids))
    assert resumed is not None and resumed.status is Status.COMPLETED and resumed.attempt == 2


def test_a_step_with_other_arguments_at_a_recorded_position_is_a_mismatch(ledger: Ledger) -> None:
    """A parent that calls its first step with other arguments on its rerun is not deterministic."""
    effects: list[int] = []
    amounts = iter([10, 11])

    @replay_safe(ledger=ledger)
    def charge(amount: int) -> int:
        effects.append(amount)
        return amount

    @replay_safe(ledger=ledger)
    def pay() -> int:
        charge(next(amounts))
        raise RuntimeError("fails after the charge, so the parent is released and runs again")

    ids = new_ids()
    with tool_call(*ids), pytest.raises(RuntimeError):
        pay()
    with tool_call(*ids), pytest.raises(ReplayMismatchError) as raised:
        pay()
    assert effects == [10]
    assert "not deterministic" in str(raised.value)
    assert "11" not in str(raised.value).replace(ids[0], "")


def test_steps_nest_and_current_call_names_each_with_its_parent(ledger: Ledger) -> None:
    """A step of a step; current_call() in each describes it, with .parent, and a stable idempotency key."""
    seen: dict[str, CallInfo] = {}

    @replay_safe(ledger=ledger)
    def leaf() -> str:
        info = current_call()
        assert info is not None
        seen["leaf"] = info
        return info.idempotency_key

    @replay_safe(ledger=ledger)
    def middle() -> str:
        info = current_call()
        assert info is not None
        seen["middle"] = info
        return leaf()

    @replay_safe(ledger=ledger)
    def top() -> str:
        info = current_call()
        assert info is not None
        seen["top"] = info
        return middle()

    ids = new_ids()
    with tool_call(*ids):
        first = top()
    leaf_info, middle_info, top_info = seen["leaf"], seen["middle"], seen["top"]
    assert top_info.parent is None
    assert middle_info.parent == top_info and leaf_info.parent == middle_info
    assert leaf_info.key == step_key(ids, "middle#1", "leaf#1")
    assert leaf_info.tool_name == "leaf" and leaf_info.attempt == 1
    assert len({top_info.idempotency_key, middle_info.idempotency_key, leaf_info.idempotency_key}) == 3
    record = ledger.get(step_key(ids, "middle#1", "leaf#1"))
    assert record is not None and record.status is Status.COMPLETED
    # A new execution of the same call computes the same step key, hence the same idempotency key.
    ledger.delete(CallKey(*ids))
    ledger.delete(step_key(ids, "middle#1"))
    ledger.delete(step_key(ids, "middle#1", "leaf#1"))
    with tool_call(*ids):
        assert top() == first == leaf_info.idempotency_key


async def test_async_steps_gathered_are_numbered_in_call_order_and_replay(ledger: Ledger) -> None:
    """Async steps started together get their ordinals in the order they were called; all replay."""
    effects: list[int] = []

    @replay_safe(ledger=ledger)
    async def send(n: int) -> int:
        await asyncio.sleep(0.01 * (3 - n))  # finish in reverse order
        effects.append(n)
        return n * 10

    @replay_safe(ledger=ledger)
    async def broadcast() -> list[int]:
        return list(await asyncio.gather(send(0), send(1), send(2)))

    ids = new_ids()
    for _ in range(2):
        async with tool_call(*ids):
            assert await broadcast() == [0, 10, 20]
    assert sorted(effects) == [0, 1, 2]
    for n in range(3):
        record = ledger.get(step_key(ids, f"send#{n + 1}"))
        assert record is not None and record.result is not None and str(n * 10) in record.result


async def test_a_sync_step_inside_an_async_parent(ledger: Ledger) -> None:
    effects: list[str] = []

    @replay_safe(ledger=ledger)
    def write(line: str) -> str:
        effects.append(line)
        return line

    @replay_safe(ledger=ledger)
    async def report() -> str:
        return write("a") + write("b")

    ids = new_ids()
    for _ in range(2):
        async with tool_call(*ids):
            assert await report() == "ab"
    assert effects == ["a", "b"]


def test_steps_inside_a_tool_an_adapter_protects_without_a_decorator(ledger: Ledger) -> None:
    """An adapter wraps a plain tool with replay_safe(...) at call time: a decorated helper inside it is a step."""
    effects: list[str] = []

    @replay_safe(ledger=ledger)
    def refund(order_id: str) -> str:
        effects.append(order_id)
        return f"re_{order_id}"

    def plain_tool(order_id: str) -> str:  # what a framework hands the adapter
        return refund(order_id) + "!"

    def adapter_runs(ids: tuple[str, str, str], order_id: str) -> Any:
        with tool_call(*ids, ledger=ledger):
            return replay_safe(name="plain_tool")(plain_tool)(order_id)

    ids = new_ids()
    assert adapter_runs(ids, "o9") == adapter_runs(ids, "o9") == "re_o9!"
    assert effects == ["o9"]
    record = ledger.get(step_key(ids, "refund#1"))
    assert record is not None and record.status is Status.COMPLETED


def test_a_step_uses_its_parents_ledger(ledger: Ledger) -> None:
    """A step whose decorator names no ledger is recorded in its parent's."""
    effects: list[int] = []

    @replay_safe
    def step() -> int:
        effects.append(1)
        return len(effects)

    @replay_safe(ledger=ledger)
    def parent() -> int:
        return step()

    ids = new_ids()
    for _ in range(2):
        with tool_call(*ids):
            assert parent() == 1
    assert effects == [1]
    assert ledger.get(step_key(ids, "step#1")) is not None


def test_a_streaming_parents_steps_are_numbered_across_its_chunks(ledger: Ledger) -> None:
    effects: list[int] = []

    @replay_safe(ledger=ledger)
    def fetch(page: int) -> str:
        effects.append(page)
        return f"page {page}"

    @replay_safe(ledger=ledger)
    def pages(n: int) -> Any:
        for page in range(n):
            yield fetch(page)

    ids = new_ids()
    with tool_call(*ids):
        assert list(pages(3)) == ["page 0", "page 1", "page 2"]
    assert [r.key for r in ledger.records(thread_id=ids[0]) if r.tool_name == "fetch"] == [
        step_key(ids, f"fetch#{n}") for n in (1, 2, 3)
    ]


def test_steps_of_a_parent_running_under_a_deadline_off_the_main_thread(ledger: Ledger) -> None:
    """A parent with an explicit timeout, called off the main thread (where its deadline may move it to a
    worker thread), still numbers and records its steps."""
    effects: list[int] = []

    @replay_safe(ledger=ledger)
    def step(n: int) -> int:
        effects.append(n)
        return n

    @replay_safe(ledger=ledger, timeout=60)
    def parent() -> list[int]:
        return [step(1), step(2)]

    ids = new_ids()

    def call() -> list[int]:
        with tool_call(*ids):
            return parent()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(call).result(timeout=60) == [1, 2]
        assert pool.submit(call).result(timeout=60) == [1, 2]
    assert effects == [1, 2]
    assert [r.key for r in ledger.records(thread_id=ids[0]) if r.tool_name == "step"] == [
        step_key(ids, "step#1"),
        step_key(ids, "step#2"),
    ]


def test_current_call_pickles_as_a_plain_call_info(ledger: Ledger) -> None:
    """A step's CallInfo crosses a process boundary (a task queue) as data, its parent too."""
    seen: list[bytes] = []

    @replay_safe(ledger=ledger)
    def step() -> None:
        seen.append(pickle.dumps(current_call()))

    @replay_safe(ledger=ledger)
    def parent() -> None:
        step()

    ids = new_ids()
    with tool_call(*ids):
        parent()
    info = pickle.loads(seen[0])
    assert type(info) is CallInfo and type(info.parent) is CallInfo
    assert info.key == step_key(ids, "step#1") and info.parent.key == CallKey(*ids)


def test_a_steps_control_error_is_never_recorded_as_its_parents_failure(ledger: Ledger) -> None:
    """record_errors=True records the tool's own errors, not replaysafe's: the parent stays free to run again."""
    amount = [1]
    ran_once: list[bool] = []

    @replay_safe(ledger=ledger)
    def charge(cents: int) -> int:
        return cents

    @replay_safe(ledger=ledger, record_errors=True)
    def checkout() -> int:
        charged = charge(amount[0])
        if amount[0] == 1 and not ran_once:
            ran_once.append(True)
            raise KeyboardInterrupt  # the process is interrupted after the step: the parent is in doubt
        return charged

    key = (f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
    with tool_call(*key), pytest.raises(KeyboardInterrupt):
        checkout()
    amount[0] = 2  # not deterministic: the step at position 1 now gets other arguments
    with tool_call(*key, in_doubt="rerun"), pytest.raises(ReplayMismatchError):
        checkout()
    assert ledger.get(CallKey(*key)) is None  # released for a retry, not recorded as failed
    amount[0] = 1
    with tool_call(*key, in_doubt="rerun"):
        assert checkout() == 1  # runs again: its step replays
