"""``SteppedClock``: replaysafe's time, moved by the test alone, and put back after it."""

from __future__ import annotations

import asyncio
import math
import threading
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import replaysafe.testing
from replaysafe import (
    CallInProgressError,
    CallKey,
    MemoryLedger,
    _drivers,
    _renewer,
    current_call,
    open_ledger,
    replay_safe,
    tool_call,
)
from replaysafe._clock import MACHINE
from replaysafe.ledgers._protocol import handed_now
from replaysafe.testing import SteppedClock, kill_point, run_in_child
from replaysafe.testing import _clock as stepped_clock


def _in_use() -> tuple[object, ...]:
    """The clocks replaysafe reads: the protocol's, the ledgers', the renewer's."""
    return (_drivers.HOST.now, _drivers.HOST.monotonic, _renewer._now, _renewer._monotonic, _renewer._timed)


MACHINES = (MACHINE.now, MACHINE.monotonic, MACHINE.now, MACHINE.monotonic, True)


def test_it_moves_only_when_stepped_and_only_forward() -> None:
    clock = SteppedClock(start=datetime(2026, 1, 1, 12, tzinfo=timezone.utc))
    wall, monotonic = clock.now(), clock.monotonic()
    assert wall == datetime(2026, 1, 1, 12, tzinfo=timezone.utc) and wall.tzinfo is timezone.utc
    assert (clock.now(), clock.monotonic()) == (wall, monotonic)
    clock.advance(1.5)
    clock.advance(timedelta(minutes=1))
    assert clock.now() - wall == timedelta(seconds=61.5)
    assert clock.monotonic() - monotonic == pytest.approx(61.5)
    for backwards in (-1, timedelta(seconds=-1), math.nan):
        with pytest.raises(ValueError, match="only moves forward"):
            clock.advance(backwards)
    assert clock.now() - wall == timedelta(seconds=61.5)


def test_it_starts_at_the_machines_time_unless_told() -> None:
    before = datetime.now(timezone.utc)
    clock = SteppedClock()
    assert before <= clock.now() <= datetime.now(timezone.utc)
    elsewhere = datetime(2026, 6, 1, 14, tzinfo=timezone(timedelta(hours=2)))
    assert (
        SteppedClock(start=elsewhere).now() == elsewhere and SteppedClock(start=elsewhere).now().tzinfo is timezone.utc
    )
    with pytest.raises(ValueError, match="timezone-aware"):
        SteppedClock(start=datetime(2026, 1, 1))


def test_replaysafe_reads_it_inside_the_block_and_the_machines_after() -> None:
    assert _in_use() == MACHINES
    with SteppedClock() as clock:
        assert _in_use() == (clock.now, clock.monotonic, clock.now, clock.monotonic, False)
        clock.advance(3600)
        assert handed_now() == clock.now()  # what SQL ledgers hide expired records at
        with SteppedClock(start=datetime(2030, 1, 1, tzinfo=timezone.utc)) as inner:
            assert _drivers.HOST.now() == inner.now()
        assert _in_use() == (clock.now, clock.monotonic, clock.now, clock.monotonic, False)
        with pytest.raises(RuntimeError, match="already in use"), clock:
            pass
    assert _in_use() == MACHINES


def test_reset_puts_the_machines_clocks_back() -> None:
    clock = SteppedClock()
    with clock:
        replaysafe.testing.reset()
        assert _in_use() == MACHINES
    assert _in_use() == MACHINES


def test_the_hosts_built_before_are_built_again_from_it() -> None:
    """A call reads the host built for its ledger's class: one built before the clock was in use is not kept."""
    ledger = MemoryLedger()
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c")
    with tool_call(f"warm-{uuid.uuid4().hex[:8]}", "m", "c"):
        replay_safe(ledger=ledger, name="warm")(lambda: None)()
    with SteppedClock(start=datetime(2030, 1, 1, tzinfo=timezone.utc)), tool_call(*key):
        replay_safe(ledger=ledger, name="stepped")(lambda: None)()
    record = ledger.get(key)
    assert record is not None and record.created_at == datetime(2030, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_wait_for_a_live_owner_steps_the_clock_instead_of_sleeping(flavour: str) -> None:
    """A replay finds the call running under another host's live lease: its pauses between looks step the
    clock, so its wait gives up once ``wait_timeout`` has passed on it (the last pause going no further)."""
    ledger = MemoryLedger()
    key = CallKey(f"t-{uuid.uuid4().hex[:8]}", "m", "c")

    @replay_safe(ledger=ledger, wait_timeout=5)
    def refund_order(order_id: str) -> str:
        return "refunded"

    @replay_safe(ledger=ledger, name=refund_order.__name__, wait_timeout=5)
    async def arefund_order(order_id: str) -> str:
        return "refunded"

    probe = CallKey(f"probe-{uuid.uuid4().hex[:8]}", "m", "c")
    with tool_call(*probe):
        refund_order("1")
    like = ledger.get(probe)
    assert like is not None
    with SteppedClock() as clock:
        now, started = clock.now(), clock.monotonic()
        claimed = ledger.claim(
            key,
            tool_name=like.tool_name,
            args_digest=like.args_digest,
            owner="other-host:1:1#1",
            now=now,
            lease_expires_at=now + timedelta(seconds=600),
        )
        assert claimed.claimed
        if flavour == "sync":
            with tool_call(*key), pytest.raises(CallInProgressError):
                refund_order("1")
        else:

            async def replay() -> str:
                async with tool_call(*key):
                    return await arefund_order("1")

            with pytest.raises(CallInProgressError):
                asyncio.run(replay())
        assert clock.monotonic() - started == pytest.approx(5)
        assert clock.now() - now == timedelta(seconds=5)


def test_a_step_that_the_renewer_cannot_catch_up_with_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A renewal that hangs (a ledger that never answers) fails the step that made it due, after a bound."""
    monkeypatch.setattr(stepped_clock, "RENEWALS_TIMEOUT", 0.2)
    go_on = threading.Event()

    class Hangs(MemoryLedger):
        def renew(self, key: CallKey, *, owner: str, lease_expires_at: datetime) -> bool:
            go_on.wait(30)
            return super().renew(key, owner=owner, lease_expires_at=lease_expires_at)

    ledger = Hangs()

    @replay_safe(ledger=ledger, lease=3, timeout=None)
    def long_task() -> None:
        try:
            with pytest.raises(TimeoutError, match="did not make the renewals due"):
                clock.advance(1)
        finally:
            go_on.set()

    with SteppedClock() as clock, tool_call(f"t-{uuid.uuid4().hex[:8]}", "m", "c"):
        long_task()


def send_invoice(ledger_url: str) -> int:
    """The guide's example (docs/testing.md): a tool whose host dies inside it, under ``kill_at``."""
    with open_ledger(ledger_url) as ledger:

        @replay_safe(ledger=ledger)
        def send(invoice_id: str) -> int:
            kill_point("mid_send")
            return current_call().attempt

        with tool_call("t1", "msg_1", "call_1"):
            return send("inv-7")


def test_a_call_left_by_a_dead_host_is_taken_over_once_its_lease_runs_out(
    tmp_path: Path, replaysafe_clock: SteppedClock
) -> None:
    """The guide's example: another machine's process dies inside the tool; a replay here waits for its
    lease (the default, 330 s) to run out on the stepped clock, then takes the call over (attempt 2)."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    died = run_in_child(send_invoice, url, kill_at="mid_send", env={"REPLAYSAFE_OWNER_MACHINE": "host-b"})
    assert died.killed
    with open_ledger(url) as ledger:
        record = ledger.get(CallKey("t1", "msg_1", "call_1"))
    assert record is not None and record.owner.startswith("host-b:")
    replaysafe_clock.advance(record.lease_expires_at - replaysafe_clock.now())
    assert send_invoice(url) == 2
