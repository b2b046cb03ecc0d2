"""A finished call never runs again, whatever happened to its result (on every ledger).

A result that cannot be stored (too large, not encodable) is recorded as "ran; result
not recorded"; a recorded result that cannot be read back (a changed model, a corrupt
record) raises ``RecordUnreadableError``. Neither runs the tool again, and neither
falls back to an unprotected run; ``ledger.resolve`` settles both.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pydantic
import pytest

from replaysafe import (
    CallKey,
    Ledger,
    RecordUnreadableError,
    ResultEncodingError,
    Status,
    open_ledger,
    replay_safe,
    tool_call,
)
from replaysafe._identity import call_idempotency_key
from replaysafe._sealing import unsealed
from replaysafe._unrecorded import PREFIX, parse


def new_ids() -> tuple[str, str, str]:
    return (f"thread-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")


class Opaque:
    """A result no codec can encode."""


def _assert_names_the_call(error: Exception, ids: tuple[str, str, str], tool: str) -> None:
    text = str(error)
    assert all(part in text for part in ids)
    assert tool in text
    assert call_idempotency_key(*ids, tool) in text
    assert "replaysafe ledger" in text and "resolve" in text


@pytest.mark.parametrize("case", ["not_encodable", "too_large"])
def test_a_result_that_cannot_be_stored_is_recorded_as_run_and_never_runs_again(ledger: Ledger, case: str) -> None:
    runs: list[int] = []
    value: Any = Opaque() if case == "not_encodable" else "x" * 200

    @replay_safe(ledger=ledger, max_result_bytes=100)
    def send_invites() -> Any:
        runs.append(1)
        return value

    ids = new_ids()
    with tool_call(*ids):
        assert send_invites() is value  # the first caller gets its value
    record = ledger.get(CallKey(*ids))
    assert record is not None
    assert record.status is Status.COMPLETED
    marker = parse(unsealed(record.result))
    assert marker is not None and marker.reason == case
    assert marker.type_name == ("tests.test_finished_calls.Opaque" if case == "not_encodable" else "str")
    for _ in range(2):
        with tool_call(*ids), pytest.raises(ResultEncodingError) as raised:
            send_invites()
        _assert_names_the_call(raised.value, ids, "send_invites")
        assert raised.value.key == CallKey(*ids)
    assert runs == [1]


def test_fail_closed_hands_the_first_caller_the_error_with_its_value(ledger: Ledger) -> None:
    value = Opaque()

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    def tool() -> Any:
        return value

    ids = new_ids()
    with tool_call(*ids), pytest.raises(ResultEncodingError) as raised:
        tool()
    assert raised.value.result is value
    _assert_names_the_call(raised.value, ids, "tool")
    record = ledger.get(CallKey(*ids))
    assert record is not None and record.status is Status.COMPLETED


def test_a_serializer_output_with_a_reserved_prefix_is_not_mistaken_for_a_marker(ledger: Ledger) -> None:
    class Mimic:
        def dumps(self, value: Any) -> str:
            return PREFIX + '{"reason": "too_large", "type": "str"}'

        def loads(self, text: str) -> Any:
            return text

    runs: list[int] = []

    @replay_safe(ledger=ledger, serializer=Mimic())
    def tool() -> str:
        runs.append(1)
        return "real"

    ids = new_ids()
    with tool_call(*ids):
        assert tool() == "real"
    record = ledger.get(CallKey(*ids))
    assert record is not None
    marker = parse(unsealed(record.result))
    assert marker is not None and marker.reason == "not_encodable"
    with tool_call(*ids), pytest.raises(ResultEncodingError):
        tool()
    assert runs == [1]


class _Bytes:
    """A serializer built on a bytes-producing encoder (orjson-style)."""

    def dumps(self, value: Any) -> Any:
        return b'"x"'

    def loads(self, text: str) -> Any:
        return text


class _Verbatim:
    """A serializer that keeps non-ASCII text as is: a lone surrogate or NUL goes through."""

    def __init__(self, text: str) -> None:
        self.text = text

    def dumps(self, value: Any) -> str:
        return self.text

    def loads(self, text: str) -> Any:
        return text


@pytest.mark.parametrize(
    "serializer",
    [_Bytes(), _Verbatim('"caf\udce9"'), _Verbatim('"a\x00b"')],
    ids=["bytes", "lone-surrogate", "nul"],
)
def test_serializer_output_no_store_can_hold_is_recorded_as_run(ledger: Ledger, serializer: Any) -> None:
    """Text the store would refuse every time is not a ledger outage: the call is recorded as run
    without its result, and a replay raises instead of running it again."""
    runs: list[int] = []

    @replay_safe(ledger=ledger, serializer=serializer)
    def tool() -> str:
        runs.append(1)
        return "real"

    ids = new_ids()
    with tool_call(*ids):
        assert tool() == "real"
    record = ledger.get(CallKey(*ids))
    assert record is not None and record.status is Status.COMPLETED
    marker = parse(unsealed(record.result))
    assert marker is not None and marker.reason == "not_encodable"
    with tool_call(*ids), pytest.raises(ResultEncodingError):
        tool()
    assert runs == [1]


def test_the_marker_is_sealed_on_a_signing_ledger(ledger_url: str) -> None:
    with open_ledger(ledger_url, signing_key="k" * 32) as ledger:
        runs: list[int] = []

        @replay_safe(ledger=ledger, max_result_bytes=10)
        def tool() -> str:
            runs.append(1)
            return "a long result"

        ids = new_ids()
        with tool_call(*ids):
            tool()
        record = ledger.get(CallKey(*ids))
        assert record is not None and record.result is not None
        assert record.result.startswith("rs-seal-1:")
        with tool_call(*ids), pytest.raises(ResultEncodingError):
            tool()
        assert runs == [1]


class RefundV1(pydantic.BaseModel):
    refund_id: str


class RefundV2(pydantic.BaseModel):
    refund_id: str
    currency: str  # added by a deploy: old records no longer validate


@pytest.mark.parametrize("on_ledger_error", ["warn", "raise"])
def test_a_result_that_no_longer_decodes_raises_and_never_runs_again(ledger: Ledger, on_ledger_error: Any) -> None:
    """Never "unprotected", whatever the ledger-error policy: the refund does not happen twice."""
    runs: list[str] = []

    @replay_safe(ledger=ledger, name="refund", on_ledger_error=on_ledger_error)
    def refund_before(order_id: str) -> RefundV1:
        runs.append(order_id)
        return RefundV1(refund_id="r-1")

    @replay_safe(ledger=ledger, name="refund", on_ledger_error=on_ledger_error)
    def refund_after_deploy(order_id: str) -> RefundV2:
        runs.append(order_id)
        return RefundV2(refund_id="r-2", currency="EUR")

    ids = new_ids()
    with tool_call(*ids):
        refund_before("o-1")
    for _ in range(2):
        with tool_call(*ids), pytest.raises(RecordUnreadableError) as raised:
            refund_after_deploy("o-1")
        _assert_names_the_call(raised.value, ids, "refund")
        assert raised.value.idempotency_key == call_idempotency_key(*ids, "refund")
        assert raised.value.__cause__ is None  # pydantic's error quotes the stored value
    assert runs == ["o-1"]


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.FAILED])
def test_a_corrupt_record_raises_and_never_runs_again(ledger: Ledger, status: Status) -> None:
    runs: list[int] = []

    @replay_safe(ledger=ledger, record_errors=True)
    def tool() -> dict[str, int]:
        runs.append(1)
        return {"n": 1}

    ids = new_ids()
    with tool_call(*ids):
        tool()
    key = CallKey(*ids)
    recorded = ledger.get(key)
    assert recorded is not None
    # The store is damaged: the record's text is no longer what the codec wrote.
    now = dt.datetime.now(dt.timezone.utc)
    taken = ledger.takeover(recorded, owner="damage", now=now, lease_expires_at=now)
    assert taken is not None
    assert ledger.complete(key, owner="damage", status=status, result='{"n": 1, ', now=now)
    with tool_call(*ids), pytest.raises(RecordUnreadableError) as raised:
        tool()
    _assert_names_the_call(raised.value, ids, "tool")
    assert runs == [1]


def test_resolve_settles_a_call_whose_result_was_not_recorded(ledger: Ledger) -> None:
    runs: list[int] = []

    @replay_safe(ledger=ledger)
    def tool() -> Any:
        runs.append(1)
        return Opaque()

    ids = new_ids()
    with tool_call(*ids):
        tool()
    settled = ledger.resolve(CallKey(*ids), result={"invites": 3})
    assert settled is not None and settled.status is Status.COMPLETED
    with tool_call(*ids):
        assert tool() == {"invites": 3}
    assert runs == [1]


def test_resolve_with_force_settles_a_call_whose_result_cannot_be_read(ledger: Ledger) -> None:
    runs: list[str] = []

    @replay_safe(ledger=ledger, name="refund")
    def refund_before(order_id: str) -> RefundV1:
        runs.append(order_id)
        return RefundV1(refund_id="r-1")

    @replay_safe(ledger=ledger, name="refund")
    def refund_after_deploy(order_id: str) -> RefundV2:
        runs.append(order_id)
        return RefundV2(refund_id="r-2", currency="EUR")

    ids = new_ids()
    with tool_call(*ids):
        refund_before("o-1")
    with pytest.raises(ValueError, match="--force"):  # a readable-looking finished record: not by accident
        ledger.resolve(CallKey(*ids), result={"refund_id": "r-1", "currency": "EUR"})
    ledger.resolve(CallKey(*ids), result={"refund_id": "r-1", "currency": "EUR"}, force=True)
    with tool_call(*ids):
        assert refund_after_deploy("o-1") == RefundV2(refund_id="r-1", currency="EUR")
    assert runs == ["o-1"]
