"""Messages never carry values: every failure path, run with a secret in the arguments,
the result and the stored record, leaves it out of every exception text, log record,
event and span. Type names, ids and digests only.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from replaysafe import (
    RERUN,
    CallInfo,
    CallKey,
    Event,
    Ledger,
    ReplayMismatchError,
    ReplaySafeError,
    SqliteLedger,
    Status,
    instrument_opentelemetry,
    on_event,
    replay_safe,
    tool_call,
)
from replaysafe.ledgers import RetryPolicy

from .faults import drop_ledger_table

SECRET = "4111-1111-SECRET-CARD"


class Card:
    """Not JSON: its text is the secret, so any message built from it would show."""

    def __repr__(self) -> str:
        return SECRET

    __str__ = __repr__


class Refund(pydantic.BaseModel):
    card: str


class RefundV2(pydantic.BaseModel):
    card: str
    currency: str


class Seen:
    def __init__(self) -> None:
        self.texts: list[str] = []

    def exception(self, exc: BaseException) -> None:
        """The text a traceback shows: the exception and the causes it displays."""
        while exc is not None:
            self.texts.append(f"{type(exc).__name__}: {exc}")
            cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
            exc = cause  # type: ignore[assignment]

    def run(self, call: Callable[[], Any]) -> None:
        try:
            call()
        except ReplaySafeError as exc:
            self.exception(exc)


@pytest.fixture
def seen(caplog: pytest.LogCaptureFixture) -> Iterator[Seen]:
    collected = Seen()
    events: list[Event] = []
    unsubscribe = on_event(events.append)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    stop = instrument_opentelemetry(provider)
    with caplog.at_level(logging.DEBUG, logger="replaysafe"):
        yield collected
    stop()
    unsubscribe()
    collected.texts += [repr(event) for event in events]
    records, spans = caplog.get_records("call"), exporter.get_finished_spans()
    collected.texts += [f"{r.getMessage()} {r.__dict__!r} {r.exc_text or ''}" for r in records]
    collected.texts += [f"{s.name} {dict(s.attributes or {})!r} {s.status.description}" for s in spans]
    assert events and records and spans  # the paths did report
    leaked = [text for text in collected.texts if SECRET in text]
    assert not leaked, leaked


def ids() -> tuple[str, str, str]:
    return (f"thread-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")


def call(key: tuple[str, str, str], tool: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    def run() -> Any:
        with tool_call(*key):
            return tool(*args)

    return run


@pytest.mark.parametrize("on_ledger_error", ["warn", "raise"])
def test_results_that_cannot_be_stored_or_read(ledger: Ledger, seen: Seen, on_ledger_error: Any) -> None:
    @replay_safe(ledger=ledger, on_ledger_error=on_ledger_error, name="charge")
    def unencodable(card: str) -> Any:
        return Card()

    @replay_safe(ledger=ledger, on_ledger_error=on_ledger_error, max_result_bytes=10, name="charge")
    def too_large(card: str) -> str:
        return f"charged {card}"

    @replay_safe(ledger=ledger, on_ledger_error=on_ledger_error, name="refund")
    def refund(card: str) -> Refund:
        return Refund(card=card)

    @replay_safe(ledger=ledger, on_ledger_error=on_ledger_error, name="refund")
    def refund_after_deploy(card: str) -> RefundV2:
        return RefundV2(card=card, currency="EUR")

    for tool in (unencodable, too_large):
        key = ids()
        seen.run(call(key, tool, SECRET))
        seen.run(call(key, tool, SECRET))  # the replay
        seen.run(call(key, tool, "another card"))  # a mismatch
    key = ids()
    seen.run(call(key, refund, SECRET))
    seen.run(call(key, refund_after_deploy, SECRET))  # pydantic's error quotes input_value


@pytest.mark.parametrize("status", ["completed", "failed"])
def test_a_corrupt_record(ledger: Ledger, seen: Seen, status: str) -> None:
    @replay_safe(ledger=ledger, record_errors=True)
    def charge(card: str) -> dict[str, str]:
        return {"card": card}

    key = ids()
    seen.run(call(key, charge, SECRET))
    record = ledger.get(CallKey(*key))
    assert record is not None
    now = dt.datetime.now(dt.timezone.utc)
    assert ledger.takeover(record, owner="damage", now=now, lease_expires_at=now) is not None
    ledger.complete(CallKey(*key), owner="damage", status=Status(status), result=f'["{SECRET}", ', now=now)
    seen.run(call(key, charge, SECRET))


def test_a_recorded_error_and_a_reconciler(ledger: Ledger, seen: Seen) -> None:
    @replay_safe(ledger=ledger, record_errors=True)
    def charge(card: str) -> str:
        raise ValueError(f"card {card} declined")

    key = ids()
    with pytest.raises(ValueError, match="declined"):  # the tool's own error reaches its caller as it is
        call(key, charge, SECRET)()
    seen.run(call(key, charge, SECRET))  # RecordedToolError: the type, not the message

    def look_up(call_info: CallInfo, card: str) -> Any:
        return RERUN

    @replay_safe(ledger=ledger, in_doubt=functools.partial(look_up, card=SECRET))
    def pay(card: str) -> str:
        return "paid"

    key = ids()
    now = dt.datetime.now(dt.timezone.utc)
    with tool_call(*key):
        pass
    digest_key = ids()
    with tool_call(*digest_key):
        pay(SECRET)
    digest = ledger.get(CallKey(*digest_key))
    assert digest is not None
    ledger.claim(
        CallKey(*key),
        tool_name="pay",
        args_digest=digest.args_digest,
        owner="gone-host:1:1#1",
        now=now,
        lease_expires_at=now,  # its lease ran out: in doubt, the reconciler is asked
    )
    seen.run(call(key, pay, SECRET))


def test_ledger_failures_timeouts_and_waits(tmp_path: Path, seen: Seen) -> None:
    ledger = SqliteLedger(tmp_path / "l.db", retry=RetryPolicy(attempts=1))

    @replay_safe(ledger=ledger, on_ledger_error="raise")
    def charge(card: str) -> str:
        drop_ledger_table(ledger.path)  # the record cannot be written
        return f"charged {card}"

    seen.run(call(ids(), charge, SECRET))
    ledger.close()

    memory = SqliteLedger(tmp_path / "m.db")

    @replay_safe(ledger=memory, timeout=0.05)
    async def slow(card: str) -> str:
        await asyncio.sleep(10)
        return card

    async def run_slow() -> None:
        async with tool_call(*ids()):
            await slow(SECRET)

    seen.run(lambda: asyncio.run(run_slow()))

    @replay_safe(ledger=memory, wait_timeout=0.05)
    def held(card: str) -> str:
        return card

    key = ids()
    with tool_call(*ids()):
        held(SECRET)
    now = dt.datetime.now(dt.timezone.utc)
    record = next(r for r in memory.records() if r.tool_name == "held")
    memory.claim(
        CallKey(*key),
        tool_name="held",
        args_digest=record.args_digest,
        owner="elsewhere:1:1#1",
        now=now,
        lease_expires_at=now + dt.timedelta(minutes=5),
    )
    seen.run(call(key, held, SECRET))  # CallInProgressError
    memory.close()


def test_a_driver_error_is_quoted_only_when_it_cannot_hold_a_parameter(postgres_server_url: str) -> None:
    """PostgreSQL's data errors (SQLSTATE class 22) quote the offending value: only their type
    and SQLSTATE reach a LedgerError; other errors keep their text, which names the fix."""
    import psycopg

    from replaysafe._operations import _reason

    from . import servers

    with psycopg.connect(servers.libpq_url(postgres_server_url), autocommit=True) as connection:
        with pytest.raises(psycopg.errors.InvalidTextRepresentation) as data_error:
            connection.execute("SELECT %s::int", (SECRET,))
        with pytest.raises(psycopg.errors.UndefinedTable) as missing_table:
            connection.execute("SELECT 1 FROM replaysafe_no_such_table")
    assert SECRET in str(data_error.value)  # the driver quotes it...
    assert _reason(data_error.value) == "InvalidTextRepresentation 22P02"  # ...the message does not
    assert "replaysafe_no_such_table" in _reason(missing_table.value)
    assert _reason(ValueError(SECRET)) == "ValueError"


class AwaitingApproval(Exception):
    pass


def test_steps_pauses_and_business_keys(ledger: Ledger, seen: Seen) -> None:
    """A business key made of a secret, a step replayed with other arguments, a pause whose text quotes a secret."""

    @replay_safe(ledger=ledger, key=lambda card: card)
    def charge_once(card: str) -> str:
        return "charged"

    seen.run(lambda: charge_once(SECRET))
    seen.run(lambda: charge_once(SECRET))  # the replay, in any thread
    cards = iter([SECRET, SECRET + "-other"])

    @replay_safe(ledger=ledger)
    def charge(card: str) -> str:
        return "ok"

    @replay_safe(ledger=ledger, pause_on=AwaitingApproval)
    def checkout() -> str:
        charge(next(cards))
        raise AwaitingApproval(f"approve card {SECRET}")

    key = ids()
    with pytest.raises(AwaitingApproval):
        call(key, checkout)()
    with pytest.raises(ReplayMismatchError) as raised:  # the resume: the step at its position has other arguments
        call(key, checkout)()
    seen.exception(raised.value)
