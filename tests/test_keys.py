"""Keys beyond the framework's ids: ``key="args"`` and business keys, on every ledger (and with ttl)."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest

import replaysafe
from replaysafe import (
    ArgumentDigestError,
    CallKey,
    Ledger,
    MissingCallIdError,
    ReplayMismatchError,
    current_call,
    replay_safe,
    tool_call,
)
from replaysafe.testing import SteppedClock


def new_thread() -> str:
    return f"thread-{uuid.uuid4().hex[:10]}"


def test_key_args_makes_a_replanned_call_under_new_ids_the_same_call(ledger: Ledger) -> None:
    """The model is asked again on resume: same tool and arguments, new message and call ids: one refund."""
    refunds: list[str] = []
    keys: list[str] = []

    @replay_safe(ledger=ledger, key="args")
    def refund(order_id: str, amount: int = 5) -> str:
        info = current_call()
        assert info is not None
        keys.append(info.idempotency_key)
        refunds.append(order_id)
        return f"re_{order_id}"

    thread = new_thread()
    with tool_call(thread, "msg_1", "call_a"):
        assert refund("o1") == "re_o1"
    with tool_call(thread, "msg_9", "call_z"):
        assert refund(order_id="o1", amount=5) == "re_o1"  # same arguments, bound by name
    with tool_call(thread, None, None):  # a thread id is all key="args" needs
        assert refund("o1") == "re_o1"
    assert refunds == ["o1"]
    with tool_call(thread, "msg_1", "call_a"):
        refund("o1", 6)  # other arguments: another call
    with tool_call(new_thread(), "msg_1", "call_a"):
        refund("o1")  # another thread: another call
    assert refunds == ["o1", "o1", "o1"]
    assert len(set(keys)) == 3
    records = [r for r in ledger.records() if r.tool_name == "refund" and r.key.thread_id == thread]
    assert len(records) == 2
    # Under the tool's identity (module:qualname), then the argument digest.
    identity = (
        f"{__name__}:{test_key_args_makes_a_replanned_call_under_new_ids_the_same_call.__qualname__}.<locals>.refund"
    )
    assert all(r.key.message_id == "replaysafe:args" and r.key.tool_call_id.startswith(identity + ":") for r in records)


def test_key_args_without_a_thread_id_is_unprotected(ledger: Ledger) -> None:
    @replay_safe(ledger=ledger, key="args", on_missing_ids="raise")
    def refund(order_id: str) -> str:
        return order_id

    with pytest.raises(MissingCallIdError, match='key="args" needs a thread id'):
        refund("o1")


def test_a_business_key_is_one_call_across_threads(ledger: Ledger) -> None:
    """key=callable: the order id names the refund, whatever thread or ids it comes with."""
    refunds: list[str] = []
    keys: list[str] = []

    @replay_safe(ledger=ledger, key=lambda order_id, **_: order_id)
    def refund(order_id: str, amount: int) -> str:
        info = current_call()
        assert info is not None
        keys.append(info.idempotency_key)
        refunds.append(order_id)
        return f"re_{order_id}_{amount}"

    order = f"order-{uuid.uuid4().hex[:8]}"
    with tool_call(new_thread(), "msg_1", "call_1"):
        assert refund(order, 59) == f"re_{order}_59"
    with tool_call(new_thread(), "msg_2", "call_7"):
        assert refund(amount=59, order_id=order) == f"re_{order}_59"
    assert refund(order, 59) == f"re_{order}_59"  # no tool_call at all: the key is all it needs
    assert refunds == [order]
    with pytest.raises(ReplayMismatchError) as raised:
        refund(order, 60)  # the same key with other arguments: a used key, refused (Stripe answers 422)
    assert order not in str(raised.value)
    assert refunds == [order]
    other = f"order-{uuid.uuid4().hex[:8]}"
    refund(other, 60)
    assert refunds == [order, other]
    assert len(keys) == 2 and keys[0] != keys[1]
    record = next(r for r in ledger.records(thread_id="replaysafe:key") if r.key.message_id.endswith(".refund"))
    assert order not in "".join(record.key)  # only a digest of the key is stored


def test_a_business_key_of_several_parts_and_the_idempotency_key_follows_it(ledger: Ledger) -> None:
    seen: list[str] = []

    def invoice_key(customer: str, invoice: int, note: str) -> tuple[str, int]:
        return (customer, invoice)

    @replay_safe(ledger=ledger, key=invoice_key, exclude_args=("note",))
    def send_invoice(customer: str, invoice: int, note: str) -> int:
        info = current_call()
        assert info is not None
        seen.append(info.idempotency_key)
        return invoice

    send_invoice("c1", 7, "first")
    send_invoice("c1", 7, "a note left out of the digest")  # a replay
    send_invoice("c1", 8, "x")
    assert len(seen) == 2 and seen[0] != seen[1]
    assert replaysafe.idempotency_key("anything") not in seen


def test_a_business_key_that_is_not_data_is_refused_before_running(ledger: Ledger) -> None:
    runs: list[int] = []

    @replay_safe(ledger=ledger, key=lambda order_id: object())
    def refund(order_id: str) -> None:
        runs.append(1)

    with pytest.raises(ArgumentDigestError, match="key function of refund returned a object"):
        refund("o1")
    assert runs == []


def test_a_bad_key_choice_is_refused_at_decoration() -> None:
    with pytest.raises(ValueError, match="key must be 'call', 'args' or a function"):
        replay_safe(key="thread")(lambda: None)  # type: ignore[arg-type]


def test_a_keyed_tool_inside_a_parent_keeps_its_own_key(ledger: Ledger) -> None:
    """A business key is explicit: inside a parent it still names the operation across parents."""
    charges: list[str] = []

    @replay_safe(ledger=ledger, key=lambda order_id: order_id)
    def charge(order_id: str) -> str:
        info = current_call()
        assert info is not None and info.parent is not None and info.parent.tool_name == "checkout"
        charges.append(order_id)
        return "ch"

    @replay_safe(ledger=ledger)
    def checkout(order_id: str) -> str:
        return charge(order_id)

    order = f"order-{uuid.uuid4().hex[:8]}"
    for message in ("msg_1", "msg_2"):  # two different checkout calls of one order
        with tool_call(new_thread(), message, "call_1"):
            assert checkout(order) == "ch"
    assert charges == [order]


def test_keys_with_ttl(durable_ledger_url: str, replaysafe_clock: SteppedClock) -> None:
    """A record under a chosen key expires with the ledger's ttl like any other; then the call runs again.

    The SQL ledgers expire a record at the clock replaysafe is handed: stepped here, to a microsecond before
    the ttl ends and then to its end. Redis expires the key itself, on its server's clock, which no stepped
    clock moves: there the test waits (bounded) until the server has expired both records."""
    clock = replaysafe_clock
    runs: dict[str, int] = {"args": 0, "business": 0}
    keys: dict[str, CallKey] = {}
    ttl = timedelta(seconds=1)
    with replaysafe.open_ledger(durable_ledger_url, ttl=ttl.total_seconds()) as ledger:

        def ran(kind: str) -> None:
            runs[kind] += 1
            info = current_call()
            keys[kind] = CallKey(info.thread_id, info.message_id, info.tool_call_id)

        @replay_safe(ledger=ledger, key="args")
        def by_args(x: int) -> int:
            ran("args")
            return x

        @replay_safe(ledger=ledger, key=lambda x: f"k{x}")
        def by_key(x: int) -> int:
            ran("business")
            return x

        thread = new_thread()
        business = uuid.uuid4().int % 10**9

        def call_both(message: str) -> Any:
            with tool_call(thread, message, "call_1"):
                return by_args(1), by_key(business)

        call_both("msg_1")
        call_both("msg_2")
        assert runs == {"args": 1, "business": 1}
        assert keys["args"].message_id == "replaysafe:args" and keys["business"].thread_id == "replaysafe:key"
        records = [ledger.get(key) for key in keys.values()]
        assert all(record is not None and record.expires_at is not None for record in records)
        if durable_ledger_url.startswith("redis"):
            for _ in range(100):  # bounded: 10 s
                if all(ledger.get(key) is None for key in keys.values()):
                    break
                time.sleep(0.1)
        else:
            clock.advance(ttl - timedelta(microseconds=1))
            call_both("msg_3")  # a microsecond before the ttl ends: replayed
            assert runs == {"args": 1, "business": 1}
            clock.advance(timedelta(microseconds=1))
        call_both("msg_4")  # past the ttl: both records stopped counting
        assert runs == {"args": 2, "business": 2}
