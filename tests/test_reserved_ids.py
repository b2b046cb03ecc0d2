"""Ids in replaysafe's own key spaces are refused at ``tool_call(...)``; every other id is an ordinary id.

A step's key is its parent's ids with ``>tool#n`` after the tool call id, a ``key="args"`` call lives
under the message id ``replaysafe:args``, a business key under the thread id ``replaysafe:key``. A call of
its own under one of those keys would share that record: be handed its result, or block it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replaysafe import (
    CallKey,
    InvalidCallIdError,
    Ledger,
    MemoryLedger,
    replay_safe,
    tool_call,
)
from replaysafe._keys import ARGS_MESSAGE_ID, BUSINESS_THREAD_ID, RESERVED_PREFIX, reserved_id


def new_thread() -> str:
    return f"thread-{uuid.uuid4().hex[:10]}"


def checkout_with_a_charge_step(ledger: Ledger, ran: list[str]) -> Callable[[str], str]:
    """A protected ``checkout`` whose one step is a protected ``charge`` (``ran`` lists each charge run)."""

    @replay_safe(ledger=ledger)
    def charge(order_id: str) -> str:
        ran.append(order_id)
        return f"ch_{order_id}"

    @replay_safe(ledger=ledger)
    def checkout(order_id: str) -> str:
        return charge(order_id)

    return checkout


def test_a_step_form_tool_call_id_is_refused_and_the_step_keeps_its_record(ledger: Ledger) -> None:
    """``call_1>charge#1`` is the key of the first ``charge`` step of ``call_1``: a call of its own under it
    is refused before any I/O, so it is never handed the step's result, and the step's record stays."""
    ran: list[str] = []
    checkout = checkout_with_a_charge_step(ledger, ran)
    thread = new_thread()
    with tool_call(thread, "msg_1", "call_1"):
        assert checkout("o1") == "ch_o1"
    step = CallKey(thread, "msg_1", "call_1>charge#1")
    recorded = ledger.get(step)
    assert recorded is not None and recorded.tool_name == "charge"

    with pytest.raises(InvalidCallIdError) as raised:
        tool_call(*step)
    message = str(raised.value)
    assert "tool_call_id 'call_1>charge#1'" in message
    assert "<parent tool_call_id>><tool>#<n>" in message and "step" in message
    assert "Use the id the framework gave the call" in message
    assert isinstance(raised.value, ValueError)
    assert ran == ["o1"] and ledger.get(step) == recorded
    with tool_call(thread, "msg_1", "call_1"):
        assert checkout("o1") == "ch_o1"  # the parent replays; its step was not disturbed
    assert ran == ["o1"]


@pytest.mark.parametrize("tool_call_id", ["call_1>charge#1", "a>b>c#12", ">x#3", "id>#9", "x>y\n#2"])
def test_every_tool_call_id_of_a_steps_form_is_refused(tool_call_id: str) -> None:
    """Whatever the tool's name: a ``>`` followed, at the end, by ``#`` and a number."""
    with pytest.raises(InvalidCallIdError, match="reserved form of a step's id"):
        tool_call("t", "m", tool_call_id)


def test_the_business_key_thread_is_refused(ledger: Ledger) -> None:
    """A business key lives under thread ``replaysafe:key``, message id the tool name, across threads."""
    ran: list[str] = []

    @replay_safe(ledger=ledger, key=lambda order_id: order_id)
    def refund(order_id: str) -> str:
        ran.append(order_id)
        return f"re_{order_id}"

    with tool_call(new_thread(), "msg_1", "call_1"):
        assert refund("o1") == "re_o1"
    (record,) = ledger.records(thread_id=BUSINESS_THREAD_ID)
    assert record.key.message_id == f"{__name__}:test_the_business_key_thread_is_refused.<locals>.refund"
    with pytest.raises(InvalidCallIdError) as raised:
        tool_call(*record.key)
    message = str(raised.value)
    assert "thread_id 'replaysafe:key' is reserved" in message and "business key" in message
    assert "Use the conversation's thread id" in message
    with pytest.raises(InvalidCallIdError, match="thread_id 'replaysafe:key'"):
        tool_call.from_config({"configurable": {"thread_id": BUSINESS_THREAD_ID}}, message_id="m", tool_call_id="c")
    assert len(ran) == 1


def test_the_args_key_message_id_is_refused(ledger: Ledger) -> None:
    """A ``key="args"`` call lives under (thread, ``replaysafe:args``, ``tool:digest``)."""
    ran: list[str] = []

    @replay_safe(ledger=ledger, key="args")
    def refund(order_id: str) -> str:
        ran.append(order_id)
        return f"re_{order_id}"

    thread = new_thread()
    with tool_call(thread, "msg_1", "call_1"):
        assert refund("o1") == "re_o1"
    (record,) = ledger.records(thread_id=thread)
    assert record.key.message_id == ARGS_MESSAGE_ID
    with pytest.raises(InvalidCallIdError) as raised:
        tool_call(*record.key)
    message = str(raised.value)
    assert "message_id 'replaysafe:args' is reserved" in message and 'key="args"' in message
    assert "Use the id of the message that asked for the call" in message
    assert ran == ["o1"]


@pytest.mark.parametrize(
    "ids",
    [
        ("t", "m", "call_1>charge"),  # a '>' alone
        ("t", "m", "call#1"),  # a '#' alone
        ("t", "m", "a>b#0"),  # no step has ordinal 0...
        ("t", "m", "a>b#01"),  # ...or a leading zero
        ("t", "m", "a>b#1x"),  # not at the end
        ("t", "m", "#1>a"),  # '#n' before the '>'
        ("t>1#2", "m>1#2", "c"),  # the step form is reserved in a tool call id only
        ("replaysafe:args", "replaysafe:key", "replaysafe:args"),  # each name only in its own field
        ("replaysafe:other", "replaysafe:", "replaysafe:key"),  # the prefix alone is not reserved
        ("t", "m", "toolu_01A09q90qw90lq917835lq9"),  # Anthropic
        ("t", "chatcmpl-9", "call_abc123XYZ"),  # OpenAI
        ("t", "run-3c5f2a0e-9b7d-4f1e-8a21-0c6b9d4e7f10", "call_1"),  # LangChain
        ("t", "m", "pyd_ai_0f8b7c6d5e4f4a3b9c2d1e0f9a8b7c6d"),  # Pydantic AI
    ],
)
def test_ids_outside_the_reserved_forms_are_ordinary_ids(ids: tuple[str, str, str]) -> None:
    """Only what can collide is refused: such ids claim, record and replay their own record."""
    assert reserved_id(CallKey(*ids)) is None
    ledger = MemoryLedger()
    ran: list[str] = []

    @replay_safe(ledger=ledger)
    def echo(value: str) -> str:
        ran.append(value)
        return value

    for _ in range(2):
        with tool_call(*ids):
            assert echo("v") == "v"
    assert ran == ["v"]
    record = ledger.get(CallKey(*ids))
    assert record is not None and record.tool_name == "echo"


def test_a_call_whose_own_id_holds_a_gt_keeps_its_steps_apart(ledger: Ledger) -> None:
    """A tool call id with a '>' (accepted) is a parent like any: its steps are keyed under it and replay."""
    ran: list[str] = []
    checkout = checkout_with_a_charge_step(ledger, ran)
    thread = new_thread()
    for _ in range(2):
        with tool_call(thread, "m", "a>b"):
            assert checkout("o1") == "ch_o1"
    assert ran == ["o1"]
    step = ledger.get(CallKey(thread, "m", "a>b>charge#1"))
    assert step is not None and step.tool_name == "charge"


def test_the_ledger_still_addresses_a_step_by_its_key(ledger: Ledger) -> None:
    """The reserved forms are refused at ``tool_call(...)`` only: reading and settling address every record."""
    checkout = checkout_with_a_charge_step(ledger, [])
    thread = new_thread()
    with tool_call(thread, "m", "c"):
        checkout("o1")
    step = ledger.get(CallKey(thread, "m", "c>charge#1"))
    assert step is not None and step.tool_name == "charge"
    assert ledger.delete(step.key)


@pytest.mark.parametrize("step_name", ["b>charge", "x>y#2", "a>>"])
def test_a_step_whose_name_holds_a_gt_before_its_end_is_refused_before_it_runs(ledger: Ledger, step_name: str) -> None:
    """A step's id is read from its right end, so a ``>`` inside its name could give two steps one id:
    a ``b>charge`` step of call ``a`` would be ``a>b>charge#1``, the id of the ``charge`` step of call ``a>b``,
    and whichever ran second would be blocked by the other's record. Such a step is refused before it runs,
    whatever ran before, and the error says how to name it."""
    ran: list[str] = []

    @replay_safe(ledger=ledger, name=step_name)
    def charge(order_id: str) -> str:
        ran.append(order_id)
        return f"ch_{order_id}"

    @replay_safe(ledger=ledger)
    def checkout(order_id: str) -> str:
        return charge(order_id)

    thread = new_thread()
    with pytest.raises(InvalidCallIdError) as raised, tool_call(thread, "m", "a"):
        checkout("o1")
    message = str(raised.value)
    assert message.startswith(f"{step_name} cannot run as a step inside the call (")
    assert "tool_call_id='a'" in message and "Nothing ran" in message and '@replay_safe(name="...")' in message
    assert "o1" not in message
    assert raised.value.tool_name == step_name and raised.value.key == CallKey(thread, "m", "a")
    assert ran == []

    # The same tool called on its own (not as a step) keeps its name and its protection.
    with tool_call(thread, "m", "b"):
        assert charge("o2") == "ch_o2"
    with tool_call(thread, "m", "b"):
        assert charge("o2") == "ch_o2"
    assert ran == ["o2"]


@pytest.mark.parametrize("step_name", ["<lambda>", "charge#1", "a>", "#"])
def test_a_step_named_with_a_final_gt_or_a_hash_runs_and_replays(ledger: Ledger, step_name: str) -> None:
    """A ``>`` at the end of a name (a lambda's ``<lambda>``) or a ``#`` cannot make two steps share an id:
    such steps run once and replay, under the key their name gives."""
    ran: list[str] = []
    step = replay_safe(ledger=ledger, name=step_name)(lambda order_id: ran.append(order_id) or f"ch_{order_id}")

    @replay_safe(ledger=ledger)
    def checkout(order_id: str) -> str:
        return str(step(order_id))

    thread = new_thread()
    for _ in range(2):
        with tool_call(thread, "m", "a"):
            assert checkout("o1") == "ch_o1"
    assert ran == ["o1"]
    record = ledger.get(CallKey(thread, "m", f"a>{step_name}#1"))
    assert record is not None and record.tool_name == step_name


_ids = st.one_of(
    st.sampled_from(["t1", "msg_1", "call_1", ARGS_MESSAGE_ID, BUSINESS_THREAD_ID, "call_1>charge#1", "a>b", "x#2"]),
    st.text(alphabet="ab>#12:replaysfe", max_size=20),
)


@given(_ids, _ids, _ids)
def test_tool_call_refuses_exactly_the_ids_reserved_id_names(thread: str, message: str, call: str) -> None:
    """``tool_call`` checks the common ids at once and skips ``reserved_id`` for those holding neither a ``>``
    nor the reserved prefix: that shortcut must refuse exactly what ``reserved_id`` refuses."""
    reserved = reserved_id(CallKey(thread, message, call)) is not None
    if reserved:
        assert ">" in call or RESERVED_PREFIX in thread + message
    try:
        tool_call(thread, message, call)
    except InvalidCallIdError:
        assert reserved
    else:
        assert not reserved
