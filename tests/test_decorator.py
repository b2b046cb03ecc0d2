"""How @replay_safe wraps functions: signatures, methods, async, options."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from replaysafe import (
    ArgumentDigestError,
    CallKey,
    MemoryLedger,
    current_call,
    current_call_or_none,
    is_replay_safe,
    replay_safe,
    tool_call,
)


def ids() -> tuple[str, str, str]:
    return (f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")


def test_bare_and_configured_forms(memory_ledger: MemoryLedger) -> None:
    """@replay_safe and @replay_safe(...) both decorate; name= renames the tool."""

    @replay_safe
    def bare(x: int) -> int:
        return x

    @replay_safe(ledger=memory_ledger, name="refund")
    def configured(x: int) -> int:
        return x

    with tool_call(*ids(), ledger=memory_ledger):
        assert bare(1) == 1
    key = ids()
    with tool_call(*key):
        assert configured(2) == 2
    (record,) = memory_ledger.records(thread_id=key[0])
    assert record.tool_name == "refund"


def test_preserves_name_doc_and_signature() -> None:
    """The wrapper looks like the tool: agent frameworks read these."""

    def refund_order(order_id: str, amount: float = 1.0, *, reason: str = "") -> str:
        """Refund an order."""
        return order_id

    wrapped = replay_safe(refund_order)
    assert wrapped.__name__ == "refund_order"
    assert wrapped.__doc__ == "Refund an order."
    assert inspect.signature(wrapped) == inspect.signature(refund_order)
    assert wrapped.__wrapped__ is refund_order  # type: ignore[attr-defined]


def test_async_stays_a_coroutine_function() -> None:
    """An async def tool is still detected as one."""

    @replay_safe
    async def tool() -> None:
        return None

    assert inspect.iscoroutinefunction(tool)


def test_callable_outside_any_tool_call(memory_ledger: MemoryLedger) -> None:
    """Outside tool_call the tool runs plainly (with the missing-ids warning)."""

    @replay_safe(ledger=memory_ledger)
    def tool(x: int) -> int:
        assert current_call_or_none() is None
        return x * 2

    with pytest.warns(UserWarning, match="tool ran WITHOUT replay protection"):
        assert tool(4) == 8
    assert list(memory_ledger.records()) == []


class Shop:
    def __init__(self, ledger: MemoryLedger) -> None:
        self.refunds: list[str] = []
        self.ledger = ledger

    @replay_safe
    def refund(self, order_id: str) -> str:
        self.refunds.append(order_id)
        return f"refunded {order_id}"

    @staticmethod
    @replay_safe
    def quote(order_id: str) -> str:
        return f"quote {order_id}"

    @classmethod
    @replay_safe
    def kind(cls, order_id: str) -> str:
        return f"{cls.__name__} {order_id}"


def test_methods_static_and_class_methods(memory_ledger: MemoryLedger) -> None:
    """Methods bind by name without self/cls in the digest, and replay."""
    shop = Shop(memory_ledger)
    key = ids()
    for _ in range(2):
        with tool_call(*key, ledger=memory_ledger):
            assert shop.refund("1") == "refunded 1"
    assert shop.refunds == ["1"]
    for method, expected in ((Shop.quote, "quote 2"), (Shop.kind, "Shop 2"), (shop.kind, "Shop 2")):
        with tool_call(*ids(), ledger=memory_ledger):
            assert method("2") == expected


def test_method_replays_on_another_instance(memory_ledger: MemoryLedger) -> None:
    """self is not data: a new instance after a restart replays the same call."""
    key = ids()
    first, second = Shop(memory_ledger), Shop(memory_ledger)
    with tool_call(*key, ledger=memory_ledger):
        first.refund("1")
    with tool_call(*key, ledger=memory_ledger):
        assert second.refund("1") == "refunded 1"
    assert second.refunds == []


def test_current_call_inside_the_tool(memory_ledger: MemoryLedger) -> None:
    """current_call() gives the ids, tool, attempt and a stable idempotency key."""
    seen = []

    @replay_safe(ledger=memory_ledger)
    def refund_order(order_id: str, *, amount: float) -> str:
        seen.append(current_call())
        return "ok"

    key = ids()
    with tool_call(*key):
        refund_order("1", amount=3.0)
    (info,) = seen
    assert info is not None
    assert (info.thread_id, info.message_id, info.tool_call_id) == key
    assert info.tool_name == "refund_order"
    assert info.attempt == 1
    assert info.args == ("1",)
    assert info.kwargs == {"amount": 3.0}
    assert info.idempotency_key.startswith("rs-")
    assert current_call_or_none() is None


def test_idempotency_key_is_stable_and_distinct(memory_ledger: MemoryLedger) -> None:
    """The same call gives the same key on every attempt; another call gets another."""
    keys: list[str] = []

    @replay_safe(ledger=memory_ledger)
    def tool(n: int) -> None:
        info = current_call()
        assert info is not None
        keys.append(info.idempotency_key)
        raise RuntimeError("fail, so the next call runs again")

    key = ids()
    for n_ids in (key, key, (key[0], "msg_2", "call_1")):
        with tool_call(*n_ids), pytest.raises(RuntimeError):
            tool(1)
    assert keys[0] == keys[1] != keys[2]


def test_nested_protected_call_is_a_step_of_the_outer_call(memory_ledger: MemoryLedger) -> None:
    """A protected tool called from inside another is recorded as a step of the outer call."""

    @replay_safe(ledger=memory_ledger)
    def inner() -> str:
        return "inner"

    @replay_safe(ledger=memory_ledger)
    def outer() -> str:
        return inner() + "+outer"

    key = ids()
    with tool_call(*key):
        assert outer() == "inner+outer"
    records = list(memory_ledger.records())
    assert [r.tool_name for r in records] == ["outer", "inner"]
    assert records[1].key == CallKey(key[0], key[1], f"{key[2]}>inner#1")


def test_non_data_argument_gives_a_clear_error(memory_ledger: MemoryLedger) -> None:
    """An argument without a stable digest raises before running, naming it and the fix."""
    runs = []

    @replay_safe(ledger=memory_ledger)
    def lookup(order_id: str, runtime: object) -> str:
        runs.append(1)
        return "found"

    with tool_call(*ids()), pytest.raises(ArgumentDigestError) as raised:
        lookup("1", object())
    assert "runtime" in str(raised.value)
    assert "exclude_args=('runtime',)" in str(raised.value)
    assert runs == []


def test_bad_options_are_rejected_at_decoration() -> None:
    """Misconfiguration fails when the module is imported, not mid-incident."""

    def tool(order_id: str) -> None:
        return None

    with pytest.raises(TypeError, match="no parameter named runtime"):
        replay_safe(exclude_args=("runtime",))(tool)
    with pytest.raises(ValueError, match="on_missing_ids"):
        replay_safe(on_missing_ids="ignore")(tool)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="on_ledger_error"):
        replay_safe(on_ledger_error="skip")(tool)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="lease"):
        replay_safe(lease=0)(tool)


def test_wrong_arguments_raise_type_error_like_the_function(memory_ledger: MemoryLedger) -> None:
    """A call the function could not accept raises TypeError and claims nothing."""

    @replay_safe(ledger=memory_ledger)
    def tool(order_id: str) -> None:
        return None

    with tool_call(*ids()), pytest.raises(TypeError):
        tool("1", "2")  # type: ignore[call-arg]
    assert list(memory_ledger.records()) == []


def test_tool_call_rejects_non_string_ids() -> None:
    """Ids are strings; anything else is a clear TypeError naming which id."""
    with pytest.raises(TypeError, match="message_id must be a str"):
        tool_call("t", 7, "c")  # type: ignore[arg-type]


def test_tool_call_nests_and_restores() -> None:
    """An inner tool_call shadows the outer one until it exits."""
    from replaysafe._context import current_scope

    with tool_call("t", "m1", "c1") as outer:
        with tool_call("t", "m2", "c2") as inner:
            scope = current_scope()
            assert scope is not None
            assert scope.key == inner
        scope = current_scope()
        assert scope is not None
        assert scope.key == outer
    assert current_scope() is None


def test_is_replay_safe() -> None:
    """is_replay_safe tells decorated tools apart, through wraps layers and static methods."""
    import functools

    @replay_safe
    def protected() -> None:
        return None

    @functools.wraps(protected)
    def layered() -> None:
        return None

    def plain() -> None:
        return None

    from replaysafe import is_replay_safe

    assert is_replay_safe(protected)
    assert is_replay_safe(layered)
    assert is_replay_safe(Shop.quote)
    assert is_replay_safe(Shop.refund)
    assert not is_replay_safe(plain)
    assert not is_replay_safe(print)


def test_from_config_accepts_non_string_thread_ids() -> None:
    """A framework's int or UUID thread id is keyed by its text."""
    import uuid as uuid_module

    thread = uuid_module.UUID("12345678-1234-5678-1234-567812345678")
    scope = tool_call.from_config({"configurable": {"thread_id": thread}}, message_id="m", tool_call_id="c").scope
    assert scope.key.thread_id == str(thread)
    assert tool_call.from_config({"thread_id": 7}, message_id="m", tool_call_id="c").scope.key.thread_id == "7"


_module_level_runs: list[str] = []


@replay_safe(ledger=MemoryLedger())
def module_level_refund(order_id: str) -> str:
    """Refund an order (a tool defined at module level)."""
    _module_level_runs.append(order_id)
    return f"refunded {order_id}"


def test_a_function_outside_a_class_is_wrapped_in_an_ordinary_function() -> None:
    """A tool defined outside any class body is an ordinary function (no proxy): frameworks that check
    for functions see one, it pickles by reference, and it still replays what it recorded."""
    import pickle
    import types

    assert type(module_level_refund) is types.FunctionType
    assert is_replay_safe(module_level_refund)
    assert pickle.loads(pickle.dumps(module_level_refund)) is module_level_refund
    key, runs = ids(), len(_module_level_runs)
    for _ in range(2):  # the same key twice: the second call replays
        with tool_call(*key):
            assert module_level_refund("o1") == "refunded o1"
    assert len(_module_level_runs) == runs + 1

    class Refunds:
        @replay_safe
        def refund(self, order_id: str) -> str:
            return order_id

    # A method keeps wrapt's proxy: called through an instance, its receiver is left out of the digest.
    assert type(Refunds.__dict__["refund"]) is not types.FunctionType


def _retried(function: Callable[[Any, str], str]) -> Callable[[Any, str], str]:
    """A decorator that copies nothing of the function (no ``functools.wraps``)."""

    def attempt(receiver: Any, order_id: str) -> str:  # not named self: only the class body tells
        return function(receiver, order_id)

    return attempt


def test_a_method_under_a_decorator_that_hides_its_name_keeps_its_receiver_out(memory_ledger: MemoryLedger) -> None:
    """A method wrapped first by a decorator without ``functools.wraps`` has a function's qualified name
    (``_retried.<locals>.attempt``): decorated in a class body, it is still bound as a method, its
    receiver left out of the digest, and it replays."""
    runs: list[str] = []

    class Billing:
        @replay_safe(ledger=memory_ledger)
        @_retried
        def charge(self, order_id: str) -> str:
            runs.append(order_id)
            return f"charged {order_id}"

    key = ids()
    for billing in (Billing(), Billing()):  # another instance: the same call, replayed
        with tool_call(*key):
            assert billing.charge("o1") == "charged o1"
    assert runs == ["o1"]


def test_a_method_whose_receiver_is_in_its_star_args_binds_and_replays(memory_ledger: MemoryLedger) -> None:
    """``def charge(*args, **kwargs)`` in a class: the receiver is ``args[0]``, not a parameter of its
    own. Called through an instance it binds (it raised "too many positional arguments"), its receiver
    left out of the digest, and it replays on another instance."""
    runs: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    class Billing:
        @replay_safe(ledger=memory_ledger)
        def charge(*args: Any, **kwargs: Any) -> str:
            runs.append((args[1:], kwargs))
            return f"charged {args[1]}"

    key = ids()
    for billing in (Billing(), Billing()):
        with tool_call(*key):
            assert billing.charge("o1", amount=5) == "charged o1"
    assert runs == [(("o1",), {"amount": 5})]


def test_a_function_whose_first_parameter_is_self_keeps_wrapts_proxy() -> None:
    """Defined outside a class but meant as a method (first parameter ``self``): bound like a method."""
    import types

    def refund(self: object, order_id: str) -> str:
        return order_id

    assert type(replay_safe(refund)) is not types.FunctionType


def test_a_running_calls_key_cannot_be_reassigned(memory_ledger: MemoryLedger) -> None:
    """``current_call().key`` is read-only, as on every ``CallInfo``: a tool cannot move where its
    own record is written."""
    refused: list[str] = []

    @replay_safe(ledger=memory_ledger)
    def refund_order(order_id: str) -> str:
        try:
            current_call().key = CallKey("other", "m", "c")  # type: ignore[misc]
        except AttributeError as exc:
            refused.append(str(exc))
        return "ok"

    key = CallKey(*ids())
    with tool_call(*key):
        assert refund_order("1") == "ok"
    assert len(refused) == 1
    record = memory_ledger.get(key)
    assert record is not None and record.status.value == "completed"
