"""Where a call's context ends: a step's reconciler runs outside every call, and a call whose event loop is
closed under it gives up its lease."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import uuid
from pathlib import Path
from typing import Any

import pytest

from replaysafe import SqliteLedger, _drivers, current_call_or_none, replay_safe, tool_call
from replaysafe.http import next_request_key


class Crash(BaseException):
    """The worker dies here (a BaseException: nothing in the tool catches it)."""


def test_a_steps_reconciler_takes_none_of_its_parents_request_keys(tmp_path: Path) -> None:
    """The parent POSTs "charge", its step ``reserve`` (in doubt, settled by a reconciler that POSTs a lookup),
    then "confirm". Attempt 1 dies inside the step, attempt 2 after "confirm". "confirm" must carry one key on
    both attempts: the reconciler's request is not one of the parent's, and carries no key."""
    sent: list[tuple[str, str | None]] = []
    plan = {"crash_in_step": True, "crash_after_confirm": False}
    seen_in_reconciler: list[object] = []

    def lookup(call: Any) -> str:
        seen_in_reconciler.append(current_call_or_none())
        sent.append(("lookup", next_request_key()))
        return "reserved (found by lookup)"

    with SqliteLedger(tmp_path / "ledger.db") as ledger:

        @replay_safe(ledger=ledger, in_doubt=lookup)
        def reserve(item: str) -> str:
            if plan["crash_in_step"]:
                plan["crash_in_step"] = False
                raise Crash
            return "reserved"

        @replay_safe(ledger=ledger, in_doubt="rerun")
        def checkout(order: str) -> str:
            sent.append(("charge", next_request_key()))
            reserve("sku")
            sent.append(("confirm", next_request_key()))
            if plan["crash_after_confirm"]:
                plan["crash_after_confirm"] = False
                raise Crash
            return "done"

        attempts: list[list[tuple[str, str | None]]] = []
        key = (f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")
        for attempt in (1, 2, 3):
            plan["crash_after_confirm"] = attempt == 2
            with pytest.raises(Crash) if attempt < 3 else contextlib.nullcontext(), tool_call(*key):
                assert checkout("o1") == "done"
            attempts.append(sent[:])
            sent.clear()

    assert seen_in_reconciler == [None]
    assert ("lookup", None) in attempts[1]
    confirms = [dict((name, k) for name, k in requests if name == "confirm") for requests in attempts[1:]]
    assert confirms[0]["confirm"] is not None
    assert confirms[0] == confirms[1]
    charges = {k for requests in attempts for name, k in requests if name == "charge"}
    assert len(charges) == 1 and None not in charges  # every attempt's first request: one key


# Closing a loop under a pending task makes the finally blocks of its coroutines fail (no running loop, context
# variables set in another context): reported as unraisable, as for any code. What is tested is the lease.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_call_whose_event_loop_is_closed_under_it_gives_up_its_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop torn down (a worker thread's) while an async call waits closes the tool's coroutine: the tool has
    ended, so its lease must end too. It was renewed for as long as the process lived (the call never became in
    doubt, and every other host waited for it)."""
    leases: list[Any] = []
    add = _drivers.renewer.add

    def kept(lease: Any) -> None:  # the real renewer, watched
        if lease is not None:
            leases.append(lease)
        add(lease)

    monkeypatch.setattr(_drivers.renewer, "add", kept)
    ended: list[str] = []
    with SqliteLedger(tmp_path / "ledger.db") as ledger:

        @replay_safe(ledger=ledger, lease=30.0, timeout=None)
        async def slow(order: str) -> str:
            try:
                await asyncio.Event().wait()
            finally:
                ended.append(order)
            return "never"

        async def main() -> str:
            async with tool_call(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1"):
                return await slow("o1")

        loop = asyncio.new_event_loop()
        task = loop.create_task(main())
        loop.run_until_complete(_until(lambda: bool(leases)))
        loop.close()
        del task
        gc.collect()
    assert ended == ["o1"]
    assert [lease.active for lease in leases] == [False]


async def _until(condition: Any) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the call did not start")
