"""The key rules of docs/keys.md (rs1), on every ledger: a tool's identity, numbers by value, arguments
at their default, and records written under the earlier rules (rs0), which replay or fail loudly."""

from __future__ import annotations

import decimal
import gc
import math
import os
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from replaysafe import (
    ArgumentDigestError,
    CallInDoubtError,
    CallInProgressError,
    CallKey,
    JsonSerializer,
    Ledger,
    MemoryLedger,
    ReplayMismatchError,
    SqliteLedger,
    Status,
    TamperedRecordError,
    replay_safe,
    tool_call,
)
from replaysafe._identity import args_digest
from replaysafe._keys import args_key, business_key
from replaysafe.testing import kill_point, run_in_child


def new_thread() -> str:
    return f"thread-{uuid.uuid4().hex[:10]}"


# --- the tool's identity ------------------------------------------------------------------


class Stripe:
    def __init__(self) -> None:
        self.refunds: list[str] = []

    @replay_safe(key=lambda order_id, amount: order_id)
    def refund(self, order_id: str, amount: int) -> str:
        self.refunds.append(order_id)
        return f"stripe:{order_id}:{amount}"

    @replay_safe(key="args")
    def charge(self, order_id: str, amount: int) -> str:
        self.refunds.append(order_id)
        return f"stripe-charge:{order_id}"


class Paypal:
    def __init__(self) -> None:
        self.refunds: list[str] = []

    @replay_safe(key=lambda order_id, amount: order_id)
    def refund(self, order_id: str, amount: int) -> str:
        self.refunds.append(order_id)
        return f"paypal:{order_id}:{amount}"

    @replay_safe(key="args")
    def charge(self, order_id: str, amount: int) -> str:
        self.refunds.append(order_id)
        return f"paypal-charge:{order_id}"


def test_two_tools_of_one_name_keep_their_own_records(ledger: Ledger) -> None:
    """``Stripe.refund`` and ``Paypal.refund`` with one business key (or ``key="args"``) are two tools: each
    runs once and replays its own result, never the other's."""
    stripe, paypal = Stripe(), Paypal()
    order = f"o-{uuid.uuid4().hex[:8]}"
    thread = new_thread()
    for attempt in range(2):  # the second round replays
        with tool_call(thread, f"msg_{attempt}", "call_1", ledger=ledger):
            assert stripe.refund(order, 59) == f"stripe:{order}:59"
            assert paypal.refund(order, 59) == f"paypal:{order}:59"
            assert stripe.charge(order, 59) == f"stripe-charge:{order}"
            assert paypal.charge(order, 59) == f"paypal-charge:{order}"
    assert stripe.refunds == [order, order]  # refund, then charge: each once
    assert paypal.refunds == [order, order]


DUPLICATE_TOOL = """
from replaysafe import replay_safe

@replay_safe(key="args")
def refund(order_id):
    return "first"

REFUND_V1 = refund

@replay_safe(key="args")
def refund(order_id):
    return "second"
"""


def test_two_different_tools_under_one_identity_are_refused_when_decorated() -> None:
    """A module that defines ``refund`` twice (copy and paste) keeps both tools: they would share their
    records, so the second decoration raises, naming the identity, both definitions and ``name=``."""
    module = f"shop_{uuid.uuid4().hex[:8]}.tools"
    with pytest.raises(ValueError, match="identity") as raised:
        exec(compile(DUPLICATE_TOOL, "shop/tools.py", "exec"), {"__name__": module})  # a module's own source
    message = str(raised.value)
    assert f"{module}:refund" in message
    assert "shop/tools.py:4" in message and "shop/tools.py:10" in message
    assert 'name="..."' in message


def test_one_tool_decorated_again_or_made_anew_is_one_tool() -> None:
    """The same function decorated twice, a factory's inner function made on every call, an explicit
    ``name=`` shared on purpose, and a definition run again once the first is gone: all allowed."""

    def plain(order_id: str) -> str:
        return order_id

    replay_safe(plain)
    replay_safe(key="args")(plain)

    def make() -> Any:
        @replay_safe(key="args")
        def refund(order_id: str) -> str:
            return order_id

        return refund

    kept = [make(), make()]  # both alive: the same code, one tool
    assert len(kept) == 2

    @replay_safe(name="refund_order")
    def one(order_id: str) -> str:
        return order_id

    @replay_safe(name="refund_order")
    def other(order_id: str) -> str:
        return order_id

    module = f"notebook_{uuid.uuid4().hex[:8]}"
    source = "from replaysafe import replay_safe\n@replay_safe\ndef refund(order_id):\n    return order_id\n"
    namespace: dict[str, Any] = {"__name__": module}
    exec(compile(source, "<cell 1>", "exec"), namespace)
    del namespace
    gc.collect()
    exec(compile(source, "<cell 2>", "exec"), {"__name__": module})  # the cell run again


# --- numbers by value, arguments at their default -------------------------------------------


@pytest.mark.parametrize("again", [59.0, decimal.Decimal("59.00")], ids=["float", "decimal"])
def test_equal_amounts_are_one_call(ledger: Ledger, again: Any) -> None:
    """A re-asked model sends ``59.0`` for ``59``: under ``key="args"`` one refund, and under
    ``key="call"`` the replay replays instead of raising ``ReplayMismatchError``."""
    ran: list[Any] = []

    @replay_safe(ledger=ledger, key="args")
    def refund(order_id: str, amount: Any) -> str:
        ran.append(amount)
        return f"re_{order_id}"

    @replay_safe(ledger=ledger)
    def charge(order_id: str, amount: Any) -> str:
        ran.append(amount)
        return f"ch_{order_id}"

    thread = new_thread()
    with tool_call(thread, "msg_1", "call_1"):
        assert refund("1042", 59) == "re_1042"
        assert charge("1042", 59) == "ch_1042"
    with tool_call(thread, "msg_2", "call_7"):  # new ids, as a re-asked model gives
        assert refund("1042", again) == "re_1042"
    with tool_call(thread, "msg_1", "call_1"):  # the same ids, as a resumed run gives
        assert charge("1042", again) == "ch_1042"
    assert ran == [59, 59]


def test_a_parameter_added_with_a_default_keeps_the_calls_made_before(ledger: Ledger) -> None:
    """A deploy adds ``notify: bool = False`` while calls are recorded: they replay (under ``key="args"`` and
    ``key="call"``); a call that sets the new parameter is another call."""
    ran: list[str] = []
    thread = new_thread()

    @replay_safe(ledger=ledger, key="args", name="refund")
    def refund_v1(order_id: str, amount: int) -> str:
        ran.append("v1")
        return f"re_{order_id}"

    @replay_safe(ledger=ledger, name="charge")
    def charge_v1(order_id: str, amount: int) -> str:
        ran.append("v1")
        return f"ch_{order_id}"

    with tool_call(thread, "msg_1", "call_1"):
        assert refund_v1("1042", 59) == "re_1042"
    with tool_call(thread, "msg_1", "call_2"):
        assert charge_v1("1042", 59) == "ch_1042"

    @replay_safe(ledger=ledger, key="args", name="refund")  # the same tool, deployed again
    def refund_v2(order_id: str, amount: int, notify: bool = False) -> str:
        ran.append("v2")
        return f"re_{order_id}_v2"

    @replay_safe(ledger=ledger, name="charge")
    def charge_v2(order_id: str, amount: int, notify: bool = False) -> str:
        ran.append("v2")
        return f"ch_{order_id}_v2"

    with tool_call(thread, "msg_9", "call_9"):
        assert refund_v2("1042", 59) == "re_1042"
        assert refund_v2("1042", 59, notify=False) == "re_1042"
    with tool_call(thread, "msg_1", "call_2"):
        assert charge_v2("1042", 59) == "ch_1042"
    assert ran == ["v1", "v1"]
    with tool_call(thread, "msg_9", "call_9"):
        assert refund_v2("1042", 59, notify=True) == "re_1042_v2"
    assert ran == ["v1", "v1", "v2"]


# --- records written under the earlier rules (rs0) --------------------------------------------
#
# Written as the earlier version wrote them: its key (the tool's name where rs1 puts its identity),
# its digest (numbers by type, defaults included; tests/key_vectors.json pins it against that
# version's output), through the ledger's own operations.

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def write_rs0(ledger: Ledger, key: CallKey, tool_name: str, digest: str, status: Status, result: Any = None) -> None:
    owner = f"rs0-host:1:{uuid.uuid4().hex[:6]}#1"
    far = datetime.now(timezone.utc) + timedelta(hours=1)
    assert ledger.claim(
        key, tool_name=tool_name, args_digest=digest, owner=owner, now=NOW, lease_expires_at=far
    ).claimed
    if status is not Status.RUNNING:
        text = None if result is None else JsonSerializer().dumps(result)
        if text is not None and ledger.sealer is not None:
            text = ledger.sealer.seal(key, tool_name, digest, status, text)
        assert ledger.complete(key, owner=owner, status=status, result=text, now=NOW)


def test_an_rs0_record_of_an_argument_keyed_call_replays(ledger: Ledger) -> None:
    """A refund recorded by the earlier version under ``key="args"`` (an amount of ``59.0``) is found after the
    upgrade: it replays, its tool does not run, and it is kept under the rs1 key from then on."""
    ran: list[str] = []
    thread = new_thread()

    @replay_safe(ledger=ledger, key="args")
    def refund(order_id: str, amount: float) -> str:
        ran.append(order_id)
        return "ran again"

    digest = args_digest({"order_id": "1042", "amount": 59.0}, tool_name="refund", rs0=True)
    write_rs0(ledger, args_key(thread, "refund", digest), "refund", digest, Status.COMPLETED, "re_1042")
    with tool_call(thread, "msg_2", "call_2"):
        assert refund("1042", 59.0) == "re_1042"
        assert refund("1042", 59) == "re_1042"
    assert ran == []
    (adopted,) = [r for r in ledger.records(thread_id=thread) if r.key.tool_call_id.startswith(f"{__name__}:")]
    assert adopted.status is Status.COMPLETED


def test_an_rs0_record_of_a_business_key_replays(ledger: Ledger) -> None:
    ran: list[str] = []

    @replay_safe(ledger=ledger, key=lambda order_id: order_id)
    def refund(order_id: str) -> str:
        ran.append(order_id)
        return "ran again"

    order = f"o-{uuid.uuid4().hex[:8]}"
    key = business_key("refund", order, rs0=True)
    write_rs0(
        ledger, key, "refund", args_digest({"order_id": order}, tool_name="refund", rs0=True), Status.COMPLETED, "re"
    )
    assert refund(order) == "re"
    assert ran == []


def test_an_rs0_record_of_a_call_with_a_default_replays(ledger: Ledger) -> None:
    """Under ``key="call"`` the earlier digest held the arguments left at their default: still this call."""
    ran: list[str] = []

    @replay_safe(ledger=ledger)
    def refund(order_id: str, amount: float, currency: str = "usd") -> str:
        ran.append(order_id)
        return "ran again"

    key = CallKey(new_thread(), "msg_1", "call_1")
    digest = args_digest({"order_id": "1042", "amount": 59.0, "currency": "usd"}, tool_name="refund", rs0=True)
    write_rs0(ledger, key, "refund", digest, Status.COMPLETED, "re_1042")
    with tool_call(*key):
        assert refund("1042", 59.0) == "re_1042"
    assert ran == []


@pytest.mark.parametrize(
    ("status", "error"),
    [(Status.IN_DOUBT, CallInDoubtError), (Status.PAUSED, CallInDoubtError), (Status.RUNNING, CallInProgressError)],
)
def test_an_unfinished_rs0_record_fails_loudly(ledger: Ledger, status: Status, error: type[Exception]) -> None:
    """An rs0 record still running, paused or in doubt cannot be carried over: a named error says how to
    settle it, nothing runs, and the rs1 key is left free."""
    ran: list[str] = []
    thread = new_thread()

    @replay_safe(ledger=ledger, key="args")
    def refund(order_id: str) -> str:
        ran.append(order_id)
        return "ran again"

    digest = args_digest({"order_id": "1042"}, tool_name="refund", rs0=True)
    earlier = args_key(thread, "refund", digest)
    write_rs0(ledger, earlier, "refund", digest, status)
    with tool_call(thread, "msg_2", "call_2"), pytest.raises(error) as raised:
        refund("1042")
    assert ran == []
    assert "earlier key rules (rs0)" in str(raised.value)
    if status is not Status.RUNNING:
        assert "replaysafe ledger resolve" in str(raised.value)
    assert [r.key for r in ledger.records(thread_id=thread)] == [earlier]


def test_a_tampered_rs0_record_is_refused(tmp_path: Any) -> None:
    """On a signing ledger the rs0 record's seal is checked before its result is carried over."""
    ledger = MemoryLedger(signing_key="k" * 32)
    forger = MemoryLedger(signing_key="x" * 32)
    ran: list[str] = []
    thread = new_thread()

    @replay_safe(ledger=ledger, key="args")
    def refund(order_id: str) -> str:
        ran.append(order_id)
        return "ran again"

    digest = args_digest({"order_id": "1042"}, tool_name="refund", rs0=True)
    key = args_key(thread, "refund", digest)
    ledger.sealer, real = forger.sealer, ledger.sealer  # written with another key: a forged record
    write_rs0(ledger, key, "refund", digest, Status.COMPLETED, "forged")
    ledger.sealer = real
    with tool_call(thread, "msg_2", "call_2"), pytest.raises(TamperedRecordError):
        refund("1042")
    assert ran == []


def test_a_sealed_rs0_record_is_copied_with_a_seal_of_its_new_key() -> None:
    """On a signing ledger the rs0 record's seal checks, and its copy under the rs1 key is sealed for that key:
    it replays now and on every later call."""
    ledger = MemoryLedger(signing_key="k" * 32)
    ran: list[str] = []
    thread = new_thread()

    @replay_safe(ledger=ledger, key="args")
    def refund(order_id: str) -> str:
        ran.append(order_id)
        return "ran again"

    digest = args_digest({"order_id": "1042"}, tool_name="refund", rs0=True)
    write_rs0(ledger, args_key(thread, "refund", digest), "refund", digest, Status.COMPLETED, "re_1042")
    for ids in (("msg_2", "call_2"), ("msg_3", "call_3")):
        with tool_call(thread, *ids):
            assert refund("1042") == "re_1042"
    assert ran == []


def test_other_arguments_under_a_recorded_key_are_a_mismatch_whatever_their_defaults(ledger: Ledger) -> None:
    """``pay(5)`` after ``pay(0, 5)`` under one key: the record's digest (``amount=0`` left out, at its default)
    is ``{"tip": 5}``, which ``pay(5)`` also digests to if its 5 is taken for a receiver's next argument. It is
    another call: ``ReplayMismatchError``, nothing runs and nothing is replayed. So with an excluded first
    argument."""
    ran: list[tuple[Any, ...]] = []

    @replay_safe(ledger=ledger)
    def pay(amount: int = 0, tip: int = 0) -> str:
        ran.append((amount, tip))
        return f"paid {amount} {tip}"

    @replay_safe(ledger=ledger, exclude_args=("account",))
    def transfer(account: str, amount: int = 1) -> str:
        ran.append((account, amount))
        return f"moved {amount} from {account}"

    key = CallKey(new_thread(), "msg_1", "call_1")
    with tool_call(*key):
        assert pay(0, 5) == "paid 0 5"
    with tool_call(*key), pytest.raises(ReplayMismatchError):
        pay(5)
    other = CallKey(new_thread(), "msg_1", "call_1")
    with tool_call(*other):
        assert transfer("acct-9", 500) == "moved 500 from acct-9"
    with tool_call(*other), pytest.raises(ReplayMismatchError):
        transfer(500)  # type: ignore[arg-type]  # the 500 meant as the amount
    assert ran == [(0, 5), ("acct-9", 500)]


WRAPPED_DUPLICATE = """
import functools
from replaysafe import replay_safe

def logged(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapper

@replay_safe(key="args")
@logged
def refund(order_id):
    return "first"

REFUND_V1 = refund

@replay_safe(key="args")
@logged
def refund(order_id):
    return "second"
"""


def test_two_tools_under_one_wrapping_decorator_are_still_two() -> None:
    """Both wrappers run ``logged``'s one wrapper code: the identity check compares the code they wrap."""
    module = f"shop_{uuid.uuid4().hex[:8]}.wrapped"
    with pytest.raises(ValueError, match="two different tools have the identity") as raised:
        exec(compile(WRAPPED_DUPLICATE, "shop/wrapped.py", "exec"), {"__name__": module})
    assert "shop/wrapped.py:11" in str(raised.value) and "shop/wrapped.py:18" in str(raised.value)


# --- a crash between the first rs1 claim and the rs0 read ------------------------------------


class DiesOnItsFirstRead(SqliteLedger):
    """A SQLite ledger whose process is SIGKILLed at its first read (the claim's look for an rs0 record)."""

    def get(self, key: CallKey) -> Any:
        kill_point("rs0-read")  # a real SIGKILL: nothing after it runs


def refund_by_args(order_id: str, amount: float) -> str:
    with open(os.environ["REFUND_LOG"], "a") as log:
        log.write(order_id + "\n")
    return "ran again"


def refund_in_a_process_that_dies_reading(path: str, thread: str) -> None:
    with DiesOnItsFirstRead(path) as dying, tool_call(thread, "msg_2", "call_2"):
        replay_safe(ledger=dying, key="args", name="refund")(refund_by_args)("1042", 59.0)


def test_a_crash_before_the_rs0_read_still_replays_the_rs0_record(tmp_path: Any, monkeypatch: Any) -> None:
    """The process holding the first rs1 claim of a derived key is SIGKILLed before it reads the rs0 key: the
    next call takes the in-doubt claim over and reads the rs0 key then, so the refund recorded before the
    upgrade replays instead of running again."""
    path, thread = str(tmp_path / "ledger.db"), new_thread()
    log = tmp_path / "refunds.log"
    monkeypatch.setenv("REFUND_LOG", str(log))
    digest = args_digest({"order_id": "1042", "amount": 59.0}, tool_name="refund", rs0=True)
    with SqliteLedger(path) as ledger:
        write_rs0(ledger, args_key(thread, "refund", digest), "refund", digest, Status.COMPLETED, "re_1042")
    crashed = run_in_child(refund_in_a_process_that_dies_reading, path, thread, kill_at="rs0-read")
    assert crashed.killed and not log.exists()
    with SqliteLedger(path) as ledger, tool_call(thread, "msg_3", "call_3"):
        assert replay_safe(ledger=ledger, key="args", name="refund")(refund_by_args)("1042", 59.0) == "re_1042"
    assert not log.exists()  # the refund never ran again


# --- defaults that have no digest of their own ----------------------------------------------------

UNSET_MARKER = object()


def test_a_default_without_a_digest_is_left_out_like_any_default(ledger: Ledger) -> None:
    """``math.inf`` and a sentinel ``object()`` have no canonical text: an argument that *is* its default
    object is at its default and left out of the digest, so calls that leave it out are protected."""
    ran: list[str] = []

    @replay_safe(ledger=ledger, key="args")
    def refund(order_id: str, limit: float = math.inf, marker: object = UNSET_MARKER) -> str:
        ran.append(order_id)
        return f"re_{order_id}"

    thread = new_thread()
    with tool_call(thread, "msg_1", "call_1"):
        assert refund("1042") == "re_1042"
    with tool_call(thread, "msg_2", "call_2"):  # re-planned under new ids: the same call by its arguments
        assert refund("1042") == "re_1042"
        assert refund("1042", math.inf, UNSET_MARKER) == "re_1042"  # the default objects, given
    assert ran == ["1042"]
    with tool_call(thread, "msg_3", "call_3"), pytest.raises(ArgumentDigestError):
        refund("1042", marker=object())  # another object, which has no digest: refused, as before
