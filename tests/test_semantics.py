"""The rules of docs/semantics.md, one section each, run on every ledger backend."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import decimal
import logging
import threading
import uuid
from typing import Any

import pydantic
import pytest
from freezegun import freeze_time

from replaysafe import (
    CallInProgressError,
    CallKey,
    Ledger,
    MissingCallIdError,
    RecordedToolError,
    ReplayMismatchError,
    ResultEncodingError,
    Status,
    UnprotectedCallWarning,
    current_call,
    replay_safe,
    tool_call,
)

from .waiting import SeesWaiting


def new_ids(message: str = "msg_1", call: str = "call_1") -> tuple[str, str, str]:
    return (f"thread-{uuid.uuid4().hex[:10]}", message, call)


# --- 1. the key ------------------------------------------------------------------


def test_same_ids_in_another_thread_run_again(ledger: Ledger) -> None:
    """thread_id namespaces everything: the same message and call ids elsewhere are new calls."""
    runs: list[str] = []

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str) -> str:
        runs.append(order_id)
        return f"refunded {order_id}"

    for thread in ("t-a", f"t-b-{uuid.uuid4().hex}"):
        with tool_call(thread, "msg_1", "call_1"):
            assert refund_order("1042") == "refunded 1042"
    assert runs == ["1042", "1042"]
    ledger.purge_thread("t-a")


def test_same_call_id_in_a_new_message_runs(ledger: Ledger) -> None:
    """call_1 repeats every turn: a new message id makes a new call."""
    runs: list[int] = []

    @replay_safe(ledger=ledger)
    def send_email(to: str) -> int:
        runs.append(1)
        return len(runs)

    thread = new_ids()[0]
    with tool_call(thread, "msg_1", "call_1"):
        assert send_email("a@x") == 1
    with tool_call(thread, "msg_2", "call_1"):
        assert send_email("a@x") == 2
    with tool_call(thread, "msg_1", "call_1"):
        assert send_email("a@x") == 1
    assert len(runs) == 2


# --- 2. claim, replay, wait, in doubt --------------------------------------------------


def test_replay_returns_the_recorded_result_without_running(ledger: Ledger) -> None:
    """The core promise: a recorded call is not executed again."""
    runs: list[str] = []

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str, amount: float) -> str:
        runs.append(order_id)
        return f"Refunded {amount:.2f} for order {order_id}"

    ids = new_ids()
    with tool_call(*ids):
        first = refund_order("1042", 59.0)
    with tool_call(*ids):
        second = refund_order("1042", 59.0)
    assert first == second == "Refunded 59.00 for order 1042"
    assert runs == ["1042"]


def test_concurrent_replay_waits_for_the_live_owner(ledger: Ledger) -> None:
    """A second caller of a running call waits and returns the owner's result."""
    started = threading.Event()
    runs: list[int] = []
    observed = SeesWaiting(ledger)

    @replay_safe(ledger=observed)
    def slow_refund(order_id: str) -> str:
        runs.append(1)
        started.set()
        # The owner finishes only once the waiter has found the call running: the wait is certain.
        assert observed.waited.wait(30), "the second caller never found the call running"
        return f"refunded {order_id}"

    ids = new_ids()
    results: list[str] = []

    def call() -> None:
        with tool_call(*ids):
            results.append(slow_refund("7"))

    owner = threading.Thread(target=call)
    owner.start()
    assert started.wait(10)
    waiter = threading.Thread(target=call)
    waiter.start()
    owner.join(30)
    waiter.join(30)
    assert results == ["refunded 7", "refunded 7"]
    assert runs == [1]
    assert observed.waits >= 1


def test_wait_runs_out_with_call_in_progress(ledger: Ledger) -> None:
    """A live owner that does not finish within wait_timeout gives CallInProgressError."""

    @replay_safe(ledger=ledger, wait_timeout=0.2)
    def charge(card: str) -> str:
        return f"charged {card}"

    ids = new_ids()
    now = dt.datetime.now(dt.timezone.utc)
    ledger.claim(
        CallKey(*ids),
        tool_name="charge",
        args_digest=_record_digest(ledger, charge, "c1"),
        owner="elsewhere:1:1#1",
        now=now,
        lease_expires_at=now + dt.timedelta(seconds=300),
    )
    with tool_call(*ids), pytest.raises(CallInProgressError) as raised:
        charge("c1")
    message = str(raised.value)
    assert "charge" in message and ids[0] in message
    # The owner is for operators (attribute, events, `ledger show`), never in a message a model may see.
    assert "elsewhere:1:1#1" not in message and raised.value.owner == "elsewhere:1:1#1"
    assert raised.value.key == CallKey(*ids)


def test_expired_lease_is_in_doubt_and_reruns_with_a_warning(ledger: Ledger, caplog: pytest.LogCaptureFixture) -> None:
    """A running record whose lease ran out is taken over: attempt 2, with a warning naming the call."""
    attempts: list[int] = []

    @replay_safe(ledger=ledger, lease=60)
    def refund_order(order_id: str) -> str:
        info = current_call()
        assert info is not None
        attempts.append(info.attempt)
        return "ok"

    ids = new_ids()
    with freeze_time("2026-12-02 10:00:00") as frozen:
        digest = _record_digest(ledger, refund_order, "1")
        ledger.claim(
            CallKey(*ids),
            tool_name="refund_order",
            args_digest=digest,
            owner="deadhost:1:1#1",
            now=dt.datetime.now(dt.timezone.utc),
            lease_expires_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60),
        )
        attempts.clear()
        frozen.tick(61)
        with caplog.at_level(logging.WARNING, logger="replaysafe"), tool_call(*ids):
            assert refund_order("1") == "ok"
    assert attempts == [2]
    (warning,) = [r for r in caplog.records if "in doubt" in r.getMessage()]
    assert ids[0] in warning.getMessage() and "refund_order" in warning.getMessage()
    assert warning.replaysafe_thread_id == ids[0]  # type: ignore[attr-defined]
    record = ledger.get(CallKey(*ids))
    assert record is not None
    assert (record.status, record.attempt) == (Status.COMPLETED, 2)


def _record_digest(ledger: Ledger, tool: Any, *args: Any) -> str:
    """Run ``tool`` once under throwaway ids and read the digest it recorded."""
    ids = new_ids()
    with tool_call(*ids):
        tool(*args)
    record = ledger.get(CallKey(*ids))
    assert record is not None
    ledger.purge_thread(ids[0])
    return record.args_digest


def test_live_lease_is_not_taken_over_under_frozen_time(ledger: Ledger) -> None:
    """One second before the lease ends, the owner is still presumed alive."""
    ids = new_ids()

    @replay_safe(ledger=ledger, lease=60, wait_timeout=0)
    def tool() -> str:
        return "ran"

    with freeze_time("2026-12-02 10:00:00") as frozen:
        digest = _record_digest(ledger, tool)
        now = dt.datetime.now(dt.timezone.utc)
        ledger.claim(
            CallKey(*ids),
            tool_name="tool",
            args_digest=digest,
            owner="o#1",
            now=now,
            lease_expires_at=now + dt.timedelta(seconds=60),
        )
        frozen.tick(59)
        with tool_call(*ids), pytest.raises(CallInProgressError):
            tool()


# --- 3. fencing --------------------------------------------------------------------


def test_late_finisher_cannot_overwrite_the_new_owner(ledger: Ledger, caplog: pytest.LogCaptureFixture) -> None:
    """A worker whose claim was removed and re-claimed ends with a logged duplicate; the new record stands."""
    slow_started, slow_may_finish = threading.Event(), threading.Event()
    calls: list[str] = []

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str) -> str:
        calls.append("slow" if not calls else "new")
        if calls == ["slow"]:
            slow_started.set()
            slow_may_finish.wait(10)
            return "late result"
        return "new result"

    ids = new_ids()
    late: list[str] = []

    def slow() -> None:
        with tool_call(*ids):
            late.append(refund_order("9"))

    worker = threading.Thread(target=slow)
    with caplog.at_level(logging.WARNING, logger="replaysafe"):
        worker.start()
        assert slow_started.wait(10)
        assert ledger.delete(CallKey(*ids))  # an operator clears the running call ...
        with tool_call(*ids):  # ... and another worker claims and finishes it
            assert refund_order("9") == "new result"
        slow_may_finish.set()
        worker.join(10)
    assert late == ["late result"]
    assert calls == ["slow", "new"]
    record = ledger.get(CallKey(*ids))
    assert record is not None
    assert record.result == '"new result"'
    assert any("duplicate execution" in r.getMessage() and ids[0] in r.getMessage() for r in caplog.records)


# --- 4. errors ---------------------------------------------------------------------


class PaymentDeclined(Exception):
    pass


def test_raising_tool_releases_its_claim_and_propagates(ledger: Ledger) -> None:
    """By default an exception propagates unchanged and a retry runs the tool again."""
    runs: list[int] = []
    error = PaymentDeclined("card declined")

    @replay_safe(ledger=ledger)
    def charge(amount: int) -> str:
        runs.append(amount)
        if len(runs) == 1:
            raise error
        return "charged"

    ids = new_ids()
    with tool_call(*ids), pytest.raises(PaymentDeclined) as raised:
        charge(5)
    assert raised.value is error
    assert ledger.get(CallKey(*ids)) is None
    with tool_call(*ids):
        assert charge(5) == "charged"
    assert runs == [5, 5]


def test_record_errors_replays_a_recorded_tool_error(ledger: Ledger) -> None:
    """record_errors=True records the failure; a replay raises RecordedToolError, never re-runs."""
    runs: list[int] = []

    @replay_safe(ledger=ledger, record_errors=True)
    def charge(amount: int) -> str:
        runs.append(amount)
        raise PaymentDeclined(f"declined {amount}")

    ids = new_ids()
    with tool_call(*ids), pytest.raises(PaymentDeclined):
        charge(5)
    with tool_call(*ids), pytest.raises(RecordedToolError) as raised:
        charge(5)
    assert raised.value.error_type.endswith("PaymentDeclined")
    assert raised.value.error_message == "declined 5"
    assert ids[0] in str(raised.value) and "charge" in str(raised.value)
    assert runs == [5]
    record = ledger.get(CallKey(*ids))
    assert record is not None
    assert record.status is Status.FAILED


def test_record_errors_with_types_records_only_those(ledger: Ledger) -> None:
    """record_errors=(PaymentDeclined,) records that type and releases any other."""
    runs: list[str] = []

    @replay_safe(ledger=ledger, record_errors=(PaymentDeclined,))
    def act(kind: str) -> None:
        runs.append(kind)
        raise PaymentDeclined(kind) if kind == "declined" else KeyError(kind)

    declined, broken = new_ids(call="c1"), new_ids(call="c2")
    for ids, kind, error in ((declined, "declined", PaymentDeclined), (broken, "broken", KeyError)):
        with tool_call(*ids), pytest.raises(error):
            act(kind)
    assert ledger.get(CallKey(*declined)) is not None
    assert ledger.get(CallKey(*broken)) is None


def test_a_pause_is_kept_as_paused_even_with_record_errors(ledger: Ledger) -> None:
    """An exception named in tool_call(pauses=...) leaves the call paused instead of recording it failed."""

    class Interrupt(Exception):
        pass

    runs: list[int] = []

    @replay_safe(ledger=ledger, record_errors=True)
    def approve() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise Interrupt("waiting for a human")
        return "approved"

    ids = new_ids()
    with tool_call(*ids, pauses=(Interrupt,)), pytest.raises(Interrupt):
        approve()
    paused = ledger.get(CallKey(*ids))
    assert paused is not None and paused.status is Status.PAUSED and paused.result is None
    with tool_call(*ids, pauses=(Interrupt,)):
        assert approve() == "approved"
    resumed = ledger.get(CallKey(*ids))
    assert resumed is not None and resumed.status is Status.COMPLETED and resumed.attempt == 2


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread", "worker-thread"])
def test_a_pause_that_is_a_base_exception_is_paused_not_in_doubt(ledger: Ledger, in_thread: bool) -> None:
    """A pause deriving from BaseException (10xGraph's GraphInterrupt) leaves the call paused too."""

    class GraphInterrupt(BaseException):
        pass

    runs: list[int] = []

    @replay_safe(ledger=ledger)
    def approve() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise GraphInterrupt("waiting for a human")
        return "approved"

    ids = new_ids()

    def first_call() -> None:
        with tool_call(*ids, pauses=(GraphInterrupt,)), pytest.raises(GraphInterrupt):
            approve()

    if in_thread:  # a sync tool outside the main thread runs under a worker-thread deadline
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(first_call).result(timeout=60)
    else:
        first_call()
    paused = ledger.get(CallKey(*ids))
    assert paused is not None and paused.status is Status.PAUSED
    with tool_call(*ids, pauses=(GraphInterrupt,)):
        assert approve() == "approved"
    assert runs == [1, 1]


# --- 5. what a record keeps, and mismatches ---------------------------------------------------


def test_record_keeps_key_tool_digest_status_result_owner_attempt_times(ledger: Ledger) -> None:
    """A completed record carries everything an operator needs."""

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str) -> dict[str, str]:
        return {"order": order_id}

    ids = new_ids()
    before = dt.datetime.now(dt.timezone.utc)
    with tool_call(*ids):
        refund_order("1042")
    record = ledger.get(CallKey(*ids))
    assert record is not None
    assert record.key == CallKey(*ids)
    assert record.tool_name == "refund_order"
    assert len(record.args_digest) == 64
    assert record.status is Status.COMPLETED
    assert record.result == '{"order":"1042"}'
    assert record.owner.count(":") == 2 and "#" in record.owner
    assert record.attempt == 1
    assert before <= record.created_at <= record.updated_at
    assert record.updated_at.tzinfo is not None


def test_other_tool_under_the_same_key_is_a_mismatch(ledger: Ledger) -> None:
    """The same key used for another tool raises ReplayMismatchError and runs nothing."""
    runs: list[str] = []

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str) -> str:
        runs.append("refund")
        return "ok"

    @replay_safe(ledger=ledger)
    def send_email(order_id: str) -> str:
        runs.append("email")
        return "ok"

    ids = new_ids()
    with tool_call(*ids):
        refund_order("1")
    with tool_call(*ids), pytest.raises(ReplayMismatchError) as raised:
        send_email("1")
    assert runs == ["refund"]
    assert "refund_order" in str(raised.value) and ids[0] in str(raised.value)


def test_other_arguments_under_the_same_key_are_a_mismatch(ledger: Ledger) -> None:
    """Same tool, same key, different arguments: ReplayMismatchError, nothing runs."""
    runs: list[float] = []

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str, amount: float) -> str:
        runs.append(amount)
        return "ok"

    ids = new_ids()
    with tool_call(*ids):
        refund_order("1", 10.0)
    with tool_call(*ids), pytest.raises(ReplayMismatchError):
        refund_order("1", 99.0)
    with tool_call(*ids):  # the same arguments, by keyword, still replay
        assert refund_order(amount=10.0, order_id="1") == "ok"
    assert runs == [10.0]


def test_excluded_arguments_are_left_out_of_the_digest(ledger: Ledger) -> None:
    """exclude_args keeps a framework's runtime object out of the digest."""

    class Runtime:  # not data: no stable digest
        pass

    runs: list[str] = []

    @replay_safe(ledger=ledger, exclude_args=("runtime",))
    def lookup(order_id: str, runtime: Runtime) -> str:
        runs.append(order_id)
        return "found"

    ids = new_ids()
    for _ in range(2):
        with tool_call(*ids):
            assert lookup("5", Runtime()) == "found"
    assert runs == ["5"]


# --- 6. missing ids, no ledger ---------------------------------------------------------


def test_missing_ids_run_unprotected_with_one_warning_per_tool(ledger: Ledger) -> None:
    """Without ids the tool runs every time, and the warning names it once."""
    runs: list[int] = []

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str) -> str:
        runs.append(1)
        return "ok"

    with pytest.warns(UnprotectedCallWarning, match="refund_order") as warned:
        refund_order("1")
        with tool_call("t", "", "call_1"):
            refund_order("1")
        with tool_call(None, "m", "c"):
            refund_order("1")
    assert len(warned) == 1
    assert runs == [1, 1, 1]
    assert warned[0].filename == __file__


def test_missing_ids_raise_when_asked(ledger: Ledger) -> None:
    """on_missing_ids='raise' raises MissingCallIdError before running."""
    runs: list[int] = []

    @replay_safe(ledger=ledger, on_missing_ids="raise")
    def refund_order(order_id: str) -> str:
        runs.append(1)
        return "ok"

    with tool_call("t", "m", ""), pytest.raises(MissingCallIdError, match="refund_order"):
        refund_order("1")
    assert runs == []


@pytest.mark.parametrize(
    ("ids", "named"),
    [(("t", "", "c"), "message_id"), (("", "m", "c"), "thread_id"), (("t", "", ""), "message_id and tool_call_id")],
)
def test_a_raised_missing_id_names_the_empty_id_and_says_nothing_ran(
    memory_ledger: Ledger, ids: tuple[str, str, str], named: str
) -> None:
    """Inside tool_call(...) with an empty id, the error names that id and says the tool did not run: it does not
    tell the user to wrap a call that is wrapped, nor that a tool ran that did not."""
    runs: list[int] = []

    @replay_safe(ledger=memory_ledger, on_missing_ids="raise")
    def refund_order(order_id: str) -> str:
        runs.append(1)
        return "ok"

    with tool_call(*ids), pytest.raises(MissingCallIdError) as raised:
        refund_order("1")
    assert runs == []
    message = str(raised.value)
    assert message.startswith("refund_order did not run: ")
    assert f"the call's {named} is empty" in message
    assert "WITHOUT" not in message and "Wrap the call" not in message
    assert 'key="args"' in message


def test_a_missing_scope_raised_says_nothing_ran_and_to_wrap_the_call(memory_ledger: Ledger) -> None:
    @replay_safe(ledger=memory_ledger, on_missing_ids="raise")
    def refund_order(order_id: str) -> str:
        return "ok"

    with pytest.raises(MissingCallIdError, match=r"refund_order did not run: no tool_call\(...\) is set.*Wrap"):
        refund_order("1")


def test_no_ledger_runs_plain_with_one_warning_per_tool() -> None:
    """With no ledger anywhere the tool is a plain function, with one warning per tool (not one per process)."""

    @replay_safe
    def one() -> int:
        return 1

    @replay_safe
    def two() -> int:
        return 2

    with pytest.warns(UnprotectedCallWarning, match="no ledger") as warned, tool_call("t", "m", "c"):
        assert one() == 1
        assert two() == 2
        assert one() == 1
    assert sorted(str(w.message).split()[0] for w in warned) == ["one", "two"]


# --- 8. results ----------------------------------------------------------------------------


@dataclasses.dataclass
class Refund:
    order_id: str
    amount: decimal.Decimal
    at: dt.datetime
    lines: list[Line]


@dataclasses.dataclass
class Line:
    sku: str
    qty: int


class Receipt(pydantic.BaseModel):
    id: uuid.UUID
    total: decimal.Decimal
    tags: list[str]


FALSY_AND_PLAIN = [
    0,
    0.0,
    "",
    [],
    {},
    False,
    None,
    True,
    -17,
    1.5,
    "héllo \x00 🚀",
    float("inf"),
    [float("-inf"), 1e308, -0.0],
    [1, "a", None, [2.5]],
    {"nested": {"a": [1, 2]}, "": 0},
]
TYPED = [
    dt.datetime(2026, 12, 2, 10, 0, 5, 123, tzinfo=dt.timezone.utc),
    dt.datetime(2026, 1, 1, 0, 0),
    dt.date(2026, 2, 28),
    decimal.Decimal("59.00"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    b"\x00\xffbytes",
    {"__replaysafe__": "datetime", "v": "not a tag, just data"},
]


@pytest.mark.parametrize("value", FALSY_AND_PLAIN + TYPED, ids=repr)
def test_results_replay_as_themselves(ledger: Ledger, value: Any) -> None:
    """Falsy, nested and tagged results replay equal, of the same type, without running."""
    runs: list[int] = []

    @replay_safe(ledger=ledger)
    def tool() -> Any:
        runs.append(1)
        return value

    ids = new_ids()
    with tool_call(*ids):
        assert tool() == value
    with tool_call(*ids):
        replayed = tool()
    assert replayed == value
    assert type(replayed) is type(value)
    assert runs == [1]


def test_tuples_replay_as_tuples_with_or_without_annotation(ledger: Ledger) -> None:
    """A tuple comes back as a tuple, whether or not the annotation says so."""

    @replay_safe(ledger=ledger)
    def plain() -> Any:
        return (1, 2)

    @replay_safe(ledger=ledger)
    def annotated() -> tuple[int, int]:
        return (1, 2)

    for tool in (plain, annotated):
        ids = new_ids()
        with tool_call(*ids):
            tool()
        with tool_call(*ids):
            assert tool() == (1, 2)
            assert type(tool()) is tuple


def test_dataclass_and_pydantic_results_revive_by_annotation(ledger: Ledger) -> None:
    """A dataclass or pydantic model named by the return annotation comes back as itself."""
    refund = Refund("1042", decimal.Decimal("59.00"), dt.datetime(2026, 12, 2, tzinfo=dt.timezone.utc), [Line("a", 2)])
    receipt = Receipt(id=uuid.uuid4(), total=decimal.Decimal("9.99"), tags=["x"])

    @replay_safe(ledger=ledger)
    def make_refund() -> Refund:
        return refund

    @replay_safe(ledger=ledger)
    def make_receipt() -> Receipt:
        return receipt

    @replay_safe(ledger=ledger)
    def many() -> list[Refund] | None:
        return [refund]

    for tool, value in ((make_refund, refund), (make_receipt, receipt), (many, [refund])):
        ids = new_ids()
        with tool_call(*ids):
            tool()
        with tool_call(*ids):
            replayed = tool()
        assert replayed == value
        assert type(replayed) is type(value)


def test_custom_serializer(ledger: Ledger) -> None:
    """serializer= replaces JSON; what it stores is what replays."""

    class Upper:
        def dumps(self, value: Any) -> str:
            return str(value).upper()

        def loads(self, text: str) -> Any:
            return f"loaded:{text}"

    @replay_safe(ledger=ledger, serializer=Upper())
    def tool() -> str:
        return "abc"

    ids = new_ids()
    with tool_call(*ids):
        assert tool() == "abc"
    with tool_call(*ids):
        assert tool() == "loaded:ABC"


def test_unencodable_result_is_returned_and_the_call_recorded_as_run(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """A result JSON cannot hold: logged with its type, returned, and the call recorded as
    finished without its result, so a replay raises instead of running it again."""

    class Opaque:
        pass

    value = Opaque()
    runs: list[int] = []

    @replay_safe(ledger=ledger)
    def tool() -> Any:
        runs.append(1)
        return value

    ids = new_ids()
    with caplog.at_level(logging.ERROR, logger="replaysafe"), tool_call(*ids):
        assert tool() is value
    assert any("Opaque" in r.getMessage() and ids[0] in r.getMessage() for r in caplog.records)
    record = ledger.get(CallKey(*ids))
    assert record is not None
    assert record.status is Status.COMPLETED
    with tool_call(*ids), pytest.raises(ResultEncodingError):
        tool()
    assert runs == [1]


# --- 9. parallel calls -----------------------------------------------------------------------


def test_parallel_threads_finished_siblings_are_skipped(ledger: Ledger) -> None:
    """Of three parallel calls, only the one that failed runs again on replay."""
    runs: list[str] = []
    lock = threading.Lock()
    fail_once = {"c2"}

    @replay_safe(ledger=ledger)
    def step(name: str) -> str:
        with lock:
            runs.append(name)
            if name in fail_once:
                fail_once.discard(name)
                raise RuntimeError("crashed mid-node")
        return f"done {name}"

    thread = new_ids()[0]

    def node() -> list[str | None]:
        out: list[str | None] = [None] * 3

        def one(i: int) -> None:
            name = f"c{i + 1}"
            with tool_call(thread, "msg_1", name), contextlib.suppress(RuntimeError):
                out[i] = step(name)

        workers = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(10)
        return out

    assert node() == ["done c1", None, "done c3"]
    assert node() == ["done c1", "done c2", "done c3"]
    assert sorted(runs) == ["c1", "c2", "c2", "c3"]


async def test_parallel_gather_finished_siblings_are_skipped(ledger: Ledger) -> None:
    """asyncio.gather: each task carries its own ids; replay skips the finished ones."""
    runs: list[str] = []
    fail_once = {"c1"}

    @replay_safe(ledger=ledger)
    async def step(name: str) -> str:
        runs.append(name)
        await asyncio.sleep(0)
        if name in fail_once:
            fail_once.discard(name)
            raise RuntimeError("boom")
        return f"done {name}"

    thread = new_ids()[0]

    async def one(name: str) -> str | None:
        async with tool_call(thread, "msg_1", name):
            try:
                return await step(name)
            except RuntimeError:
                return None

    names = ["c1", "c2", "c3"]
    assert await asyncio.gather(*(one(n) for n in names)) == [None, "done c2", "done c3"]
    assert await asyncio.gather(*(one(n) for n in names)) == ["done c1", "done c2", "done c3"]
    assert sorted(runs) == ["c1", "c1", "c2", "c3"]


# --- 10. async tools -------------------------------------------------------------------------


async def test_async_tool_replays(ledger: Ledger) -> None:
    """An async def tool is claimed, recorded and replayed like a sync one."""
    runs: list[int] = []

    @replay_safe(ledger=ledger)
    async def refund_order(order_id: str) -> str:
        runs.append(1)
        return f"refunded {order_id}"

    ids = new_ids()
    for _ in range(3):
        async with tool_call(*ids):
            assert await refund_order("9") == "refunded 9"
    assert runs == [1]


async def test_async_replay_waits_without_blocking_the_loop(ledger: Ledger) -> None:
    """A replay waiting on a running async call lets the owner's task finish it."""
    runs: list[int] = []
    waiting = asyncio.Event()
    observed = SeesWaiting(ledger, on_wait=waiting.set)

    @replay_safe(ledger=observed)
    async def slow(order_id: str) -> str:
        runs.append(1)
        # Set by the waiter's claim, which found this call running: the owner can finish only
        # while the waiter waits, and only if that wait leaves the loop free to run this task.
        await asyncio.wait_for(waiting.wait(), 30)
        return "done"

    ids = new_ids()

    async def call() -> str:
        async with tool_call(*ids):
            return await slow("1")

    assert await asyncio.gather(call(), call()) == ["done", "done"]
    assert runs == [1]
    assert observed.waits >= 1


def test_the_wait_deadline_follows_the_monotonic_clock_not_the_wall_clock(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wall clock stepped back (NTP, an operator) while a replay waits on a live owner
    does not stretch the wait: it still gives up after wait_timeout.

    Stepping the machine's real clock would disturb everything else on it, so the wall
    clock the protocol reads is stepped back one hour at each look.
    """
    from replaysafe import _drivers
    from replaysafe._owners import owner_token

    @replay_safe(ledger=ledger, wait_timeout=0.5)
    def charge(card: str) -> str:
        return f"charged {card}"

    ids = new_ids()
    now = dt.datetime.now(dt.timezone.utc)
    live_owner = owner_token().rpartition("#")[0] + "#live"  # this very process: alive
    ledger.claim(
        CallKey(*ids),
        tool_name="charge",
        args_digest=_record_digest(ledger, charge, "c1"),
        owner=live_owner,
        now=now,
        lease_expires_at=now + dt.timedelta(days=365),
    )
    steps = iter(range(1_000_000))
    stepped_back = _drivers.HOST._replace(now=lambda: now - dt.timedelta(hours=next(steps)))
    monkeypatch.setattr(_drivers, "HOST", stepped_back)
    monkeypatch.setattr(_drivers, "hosts", {})  # hosts made per ledger kind derive from HOST anew
    outcome: list[BaseException] = []

    def wait() -> None:
        with tool_call(*ids):
            try:
                charge("c1")
            except BaseException as exc:
                outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(timeout=30)  # bounded: on a wall-clock deadline it would wait for ever
    assert not waiter.is_alive(), "the waiter did not give up: its deadline followed the wall clock"
    assert len(outcome) == 1 and isinstance(outcome[0], CallInProgressError)
