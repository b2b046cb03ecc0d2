"""Steps: a protected call made inside another is claimed, recorded and replayed on its own, on every ledger."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import pickle
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
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
    kept = ledger.get(CallKey(*key))  # not recorded as failed: kept in doubt, as the refused run found it
    assert kept is not None and kept.status is Status.IN_DOUBT
    amount[0] = 1
    with tool_call(*key, in_doubt="rerun"):
        assert checkout() == 1  # runs again: its step replays


# --- a step's place in a call run again (issue #29) ------------------------------------------------------


def charge_then_ship(
    ledger: Ledger, effects: list[str], *, charge_as: str = "charge", interrupt: bool = False
) -> Callable[[str], str]:
    """Two steps, ``charge`` (under the name a deploy gives it: ``charge_as``) and ``ship``; with
    ``interrupt`` the process is interrupted inside ``ship``, so the parent is left in doubt."""

    @replay_safe(ledger=ledger, name=charge_as)
    def charge(order_id: str) -> str:
        effects.append(f"{charge_as} {order_id}")
        return f"ch_{order_id}"

    @replay_safe(ledger=ledger)
    def ship(order_id: str) -> str:
        effects.append(f"ship {order_id}")
        if interrupt:
            raise KeyboardInterrupt  # whether it shipped is unknown: ship and its parent are in doubt
        return f"sh_{order_id}"

    @replay_safe(ledger=ledger)
    def fulfil(order_id: str) -> str:
        return f"{charge(order_id)} {ship(order_id)}"

    return fulfil


def test_a_step_renamed_while_its_parent_is_in_doubt_is_refused(ledger: Ledger) -> None:
    """Interrupted inside its second step, the parent is left in doubt with the names of its steps in its
    record. Deployed with the first step renamed, the rerun refuses the renamed step (it would charge
    again under a new key), names both, runs nothing, and leaves the parent in doubt as it found it; the
    step under its recorded name replays, and only the step that was in doubt runs again."""
    effects: list[str] = []
    ids = new_ids()
    with tool_call(*ids), pytest.raises(KeyboardInterrupt):
        charge_then_ship(ledger, effects, interrupt=True)("o1")
    parent = ledger.get(CallKey(*ids))
    assert parent is not None and parent.status is Status.IN_DOUBT
    assert parent.result == 'rs-steps-1:["charge", "ship"]'
    with tool_call(*ids), pytest.raises(ReplayMismatchError) as refused:
        charge_then_ship(ledger, effects, charge_as="capture")("o1")
    assert "capture" in str(refused.value) and "'charge'" in str(refused.value)
    assert effects == ["charge o1", "ship o1"]
    kept = ledger.get(CallKey(*ids))
    assert kept is not None and kept.status is Status.IN_DOUBT and kept.result == parent.result
    assert ledger.get(step_key(ids, "capture#1")) is None
    with tool_call(*ids):
        assert charge_then_ship(ledger, effects)("o1") == "ch_o1 sh_o1"
    assert effects == ["charge o1", "ship o1", "ship o1"]


def test_a_step_replaced_in_a_nested_step_is_refused(ledger: Ledger) -> None:
    """Places are counted in each parent: a step of a step that pauses is checked against the steps
    that step made, in the step's own paused record."""
    effects: list[str] = []
    answers = iter([None, "ok"])

    class Waiting(Exception):
        pass

    def build(inner_name: str) -> Callable[[], str]:
        @replay_safe(ledger=ledger, name=inner_name)
        def inner() -> str:
            effects.append(inner_name)
            return inner_name

        @replay_safe(ledger=ledger, pause_on=Waiting)
        def middle() -> str:
            done = inner()
            if next(answers) is None:
                raise Waiting("a human")
            return done

        @replay_safe(ledger=ledger)
        def top() -> str:
            return middle()

        return top

    ids = new_ids()
    with tool_call(*ids), pytest.raises(Waiting):
        build("reserve")()
    middle_record = ledger.get(step_key(ids, "middle#1"))
    assert middle_record is not None and middle_record.result == 'rs-steps-1:["reserve"]'
    with tool_call(*ids), pytest.raises(ReplayMismatchError, match="'reserve'"):
        build("hold")()
    assert effects == ["reserve"]
    with tool_call(*ids):
        assert build("reserve")() == "reserve"
    assert effects == ["reserve"]


def test_steps_recorded_at_other_places_replay_where_they_are_called(ledger: Ledger) -> None:
    """A resume that calls its recorded steps in another order (steps made in parallel threads do) is
    answered by each step's own record, as before: a place is refused only for a step recorded nowhere."""
    effects: list[str] = []
    order = [("a", "b"), ("b", "a")]

    @replay_safe(ledger=ledger)
    def a() -> str:
        effects.append("a")
        return "A"

    @replay_safe(ledger=ledger)
    def b() -> str:
        effects.append("b")
        return "B"

    steps = {"a": a, "b": b}

    @replay_safe(ledger=ledger)
    def parent() -> str:
        made = "".join(steps[name]() for name in order[0])
        if len(order) > 1:
            order.pop(0)
            raise KeyboardInterrupt  # in doubt after both steps
        return made

    ids = new_ids()
    with tool_call(*ids), pytest.raises(KeyboardInterrupt):
        parent()
    with tool_call(*ids):
        assert parent() == "BA"
    assert effects == ["a", "b"]


def test_steps_made_in_parallel_threads_replay_after_a_pause(ledger: Ledger) -> None:
    """Two steps of different names made at once in threads take their places in whatever order the
    threads reach them: either order replays."""
    effects: list[str] = []
    answers = iter([None, "ok"])
    lock = threading.Lock()

    class Waiting(Exception):
        pass

    def step(name: str) -> Callable[[], str]:
        @replay_safe(ledger=ledger, name=name)
        def run() -> str:
            with lock:
                effects.append(name)
            return name

        return run

    left, right = step("left"), step("right")

    @replay_safe(ledger=ledger, pause_on=Waiting)
    def both() -> list[str]:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(contextvars.copy_context().run, tool) for tool in (right, left)]
            made = sorted(future.result(timeout=30) for future in futures)
        if next(answers) is None:
            raise Waiting("a human")
        return made

    ids = new_ids()
    with tool_call(*ids), pytest.raises(Waiting):
        both()
    with tool_call(*ids):
        assert both() == ["left", "right"]
    assert sorted(effects) == ["left", "right"]


def test_a_place_whose_step_left_no_record_takes_a_new_step(ledger: Ledger) -> None:
    """The step at a place raised (its claim released, nothing recorded), the parent went on and paused:
    a step renamed there since has nothing recorded to run twice, and runs."""
    effects: list[str] = []

    class Waiting(Exception):
        pass

    def build(name: str, fails: bool) -> Callable[[], str]:
        @replay_safe(ledger=ledger, name=name)
        def lookup() -> str:
            effects.append(name)
            if fails:
                raise ValueError("the provider is down")
            return name

        @replay_safe(ledger=ledger, pause_on=Waiting)
        def parent() -> str:
            try:
                found = lookup()
            except ValueError:
                raise Waiting("try again later") from None
            return found

        return parent

    ids = new_ids()
    with tool_call(*ids), pytest.raises(Waiting):
        build("lookup", fails=True)()
    assert ledger.get(step_key(ids, "lookup#1")) is None
    with tool_call(*ids):
        assert build("find", fails=False)() == "find"
    assert effects == ["lookup", "find"]


def test_a_call_paused_before_its_steps_were_kept_still_replays_them(ledger: Ledger) -> None:
    """A paused record written by an earlier version holds no step names: its resume replays each
    recorded step by its key, as it always did (there is nothing to check a renamed one against)."""
    effects: list[str] = []
    answers = iter([None, "ok"])

    class Waiting(Exception):
        pass

    @replay_safe(ledger=ledger)
    def refund() -> str:
        effects.append("refund")
        return "re"

    @replay_safe(ledger=ledger, pause_on=Waiting)
    def parent() -> str:
        receipt = refund()
        if next(answers) is None:
            raise Waiting("a human")
        return receipt

    ids = new_ids()
    with tool_call(*ids), pytest.raises(Waiting):
        parent()
    # Rewritten as an earlier version wrote it: paused, no result.
    now = datetime.now(timezone.utc)
    paused = ledger.get(CallKey(*ids))
    assert paused is not None and paused.result is not None
    assert ledger.takeover(paused, owner="an-earlier-version", now=now, lease_expires_at=now + timedelta(minutes=5))
    assert ledger.complete(CallKey(*ids), owner="an-earlier-version", status=Status.PAUSED, result=None, now=now)
    with tool_call(*ids):
        assert parent() == "re"
    assert effects == ["refund"]
