"""The ledger protocol, run on every backend: atomic claims, fencing, lookups."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import threading
import unicodedata
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import replaysafe
from replaysafe import CallKey, Ledger, Status, replay_safe, tool_call
from replaysafe.ledgers import Ledger as LedgerProtocol

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc)
LEASE = NOW + timedelta(seconds=330)


def new_key(thread: str | None = None, message: str = "msg_1", call: str = "call_1") -> CallKey:
    return CallKey(thread or f"t-{uuid.uuid4().hex[:8]}", message, call)


def claim(ledger: Ledger, key: CallKey, owner: str = "host:1:1#1", now: datetime = NOW):  # type: ignore[no-untyped-def]
    return ledger.claim(
        key, tool_name="refund_order", args_digest="d" * 64, owner=owner, now=now, lease_expires_at=now + (LEASE - NOW)
    )


def test_is_a_ledger(ledger: Ledger) -> None:
    """Every backend satisfies the runtime-checkable protocol."""
    assert isinstance(ledger, LedgerProtocol)


def test_first_claim_creates_a_running_record(ledger: Ledger) -> None:
    """A first claim owns a new running record, attempt 1, with aware UTC times."""
    key = new_key()
    found = claim(ledger, key)
    assert found.claimed
    assert found.record.status is Status.RUNNING
    assert found.record.attempt == 1
    stored = ledger.get(key)
    assert stored is not None
    assert stored.status is Status.RUNNING
    assert stored.owner == "host:1:1#1"
    assert stored.created_at == NOW
    assert stored.lease_expires_at == LEASE
    assert stored.created_at.tzinfo is not None


def test_second_claim_returns_the_existing_record(ledger: Ledger) -> None:
    """A claim of a held key returns the holder's record and changes nothing."""
    key = new_key()
    claim(ledger, key, owner="a#1")
    found = claim(ledger, key, owner="b#1")
    assert not found.claimed
    assert found.record.owner == "a#1"
    stored = ledger.get(key)
    assert stored is not None
    assert stored.owner == "a#1"


def test_complete_is_fenced_by_owner(ledger: Ledger) -> None:
    """Only the owner completes; a stranger's write is refused and changes nothing."""
    key = new_key()
    claim(ledger, key, owner="a#1")
    assert not ledger.complete(key, owner="b#1", status=Status.COMPLETED, result='"forged"', now=NOW)
    assert ledger.complete(key, owner="a#1", status=Status.COMPLETED, result='"ok"', now=NOW)
    stored = ledger.get(key)
    assert stored is not None
    assert (stored.status, stored.result) == (Status.COMPLETED, '"ok"')


def test_complete_tried_again_after_a_lost_answer_succeeds(ledger: Ledger) -> None:
    """The owner's repeated identical write succeeds (a retry after a lost reply)."""
    key = new_key()
    claim(ledger, key, owner="a#1")
    assert ledger.complete(key, owner="a#1", status=Status.COMPLETED, result="1", now=NOW)
    assert ledger.complete(key, owner="a#1", status=Status.COMPLETED, result="1", now=NOW)


def test_complete_cannot_turn_a_failure_into_a_success(ledger: Ledger) -> None:
    """A finished record is final: the owner cannot change its status."""
    key = new_key()
    claim(ledger, key, owner="a#1")
    assert ledger.complete(key, owner="a#1", status=Status.FAILED, result="{}", now=NOW)
    assert not ledger.complete(key, owner="a#1", status=Status.COMPLETED, result="1", now=NOW)


def test_release_is_fenced_and_frees_the_key(ledger: Ledger) -> None:
    """Release deletes only the owner's running record; then the key can be claimed anew."""
    key = new_key()
    claim(ledger, key, owner="a#1")
    assert not ledger.release(key, owner="b#1")
    assert ledger.release(key, owner="a#1")
    assert ledger.get(key) is None
    assert claim(ledger, key, owner="b#1").claimed


def test_release_keeps_a_completed_record(ledger: Ledger) -> None:
    """A completed record is never released."""
    key = new_key()
    claim(ledger, key, owner="a#1")
    ledger.complete(key, owner="a#1", status=Status.COMPLETED, result="1", now=NOW)
    assert not ledger.release(key, owner="a#1")
    assert ledger.get(key) is not None


def test_takeover_is_compare_and_set(ledger: Ledger) -> None:
    """Takeover succeeds once from the record as read; a stale read loses."""
    key = new_key()
    first = claim(ledger, key, owner="a#1").record
    later = NOW + timedelta(seconds=400)
    taken = ledger.takeover(first, owner="b#1", now=later, lease_expires_at=later + timedelta(seconds=330))
    assert taken is not None
    assert (taken.owner, taken.attempt, taken.status) == ("b#1", 2, Status.RUNNING)
    assert ledger.takeover(first, owner="c#1", now=later, lease_expires_at=later) is None
    stored = ledger.get(key)
    assert stored is not None
    assert (stored.owner, stored.attempt) == ("b#1", 2)
    # The old owner is fenced out.
    assert not ledger.complete(key, owner="a#1", status=Status.COMPLETED, result="1", now=later)


def test_takeover_from_a_stale_read_of_a_call_its_owner_finished_loses(ledger: Ledger) -> None:
    """A takeover decided on a running record its owner completed meanwhile changes nothing: same owner, same
    attempt, only the status moved, so the takeover's status check alone keeps the recorded result (a takeover
    that won would run the tool a second time)."""
    key = new_key()
    running = claim(ledger, key, owner="a#1").record
    assert ledger.complete(key, owner="a#1", status=Status.COMPLETED, result='"refunded"', now=NOW)
    later = NOW + timedelta(seconds=400)
    assert ledger.takeover(running, owner="b#1", now=later, lease_expires_at=later + timedelta(seconds=330)) is None
    stored = ledger.get(key)
    assert stored is not None
    assert (stored.status, stored.owner, stored.attempt) == (Status.COMPLETED, "a#1", 1)
    assert stored.result is not None and stored.result.endswith('"refunded"')


def test_takeover_of_an_in_doubt_record(ledger: Ledger) -> None:
    """A record its owner marked in doubt can be taken over."""
    key = new_key()
    claim(ledger, key, owner="a#1")
    assert ledger.complete(key, owner="a#1", status=Status.IN_DOUBT, result=None, now=NOW)
    stored = ledger.get(key)
    assert stored is not None
    taken = ledger.takeover(stored, owner="b#1", now=NOW, lease_expires_at=LEASE)
    assert taken is not None
    assert taken.attempt == 2


def test_takeover_writes_the_new_records_status_result_and_digest(ledger: Ledger) -> None:
    """An approver's decision (running or paused into paused, with its state) and a run that spends it (into
    running, with its state and, for an edit asked with the edited arguments, their digest): one
    compare-and-set each, sync and async, with no expiry; a stale read changes nothing."""
    key = new_key()
    running = claim(ledger, key, owner="a#1").record
    paused = ledger.takeover(
        running, owner="approver#1", now=NOW, lease_expires_at=NOW, status=Status.PAUSED, result="rs-state-1:{}"
    )
    assert paused is not None
    stored = ledger.get(key)
    assert stored == paused
    assert (stored.status, stored.result, stored.owner, stored.attempt) == (
        Status.PAUSED,
        "rs-state-1:{}",
        "approver#1",
        2,
    )
    assert stored.args_digest == "d" * 64 and stored.expires_at is None
    assert ledger.takeover(running, owner="c#1", now=NOW, lease_expires_at=LEASE, status=Status.PAUSED) is None

    async def spend() -> Any:
        return await ledger.aio.takeover(
            stored, owner="b#1", now=NOW, lease_expires_at=LEASE, result="rs-state-1:[]", args_digest="e" * 64
        )

    taken = asyncio.run(spend())
    assert taken is not None
    again = ledger.get(key)
    assert again == taken
    assert (again.status, again.result, again.args_digest, again.attempt) == (
        Status.RUNNING,
        "rs-state-1:[]",
        "e" * 64,
        3,
    )
    assert ledger.complete(key, owner="b#1", status=Status.COMPLETED, result='"ok"', now=NOW)


def test_renew_moves_the_lease_of_its_owner_only(ledger: Ledger) -> None:
    """A renewal by the owner moves the lease; a stranger's changes nothing and reports False."""
    key = new_key()
    claim(ledger, key, owner="a#1")
    later = LEASE + timedelta(seconds=600)
    assert not ledger.renew(key, owner="b#1", lease_expires_at=later)
    stored = ledger.get(key)
    assert stored is not None
    assert (stored.owner, stored.lease_expires_at, stored.status) == ("a#1", LEASE, Status.RUNNING)
    assert ledger.renew(key, owner="a#1", lease_expires_at=later)
    stored = ledger.get(key)
    assert stored is not None
    assert (stored.owner, stored.lease_expires_at, stored.status, stored.attempt) == ("a#1", later, Status.RUNNING, 1)


def test_renew_leaves_finished_taken_over_and_missing_records(ledger: Ledger) -> None:
    """A renewal after completion, after a takeover or of no record changes nothing."""
    later = LEASE + timedelta(seconds=600)
    done = new_key()
    claim(ledger, done, owner="a#1")
    assert ledger.complete(done, owner="a#1", status=Status.COMPLETED, result='"ok"', now=NOW)
    assert not ledger.renew(done, owner="a#1", lease_expires_at=later)
    stored = ledger.get(done)
    assert stored is not None
    assert (stored.status, stored.result, stored.lease_expires_at) == (Status.COMPLETED, '"ok"', LEASE)

    taken = new_key()
    record = claim(ledger, taken, owner="a#1").record
    assert ledger.takeover(record, owner="b#1", now=NOW, lease_expires_at=LEASE) is not None
    assert not ledger.renew(taken, owner="a#1", lease_expires_at=later)
    stored = ledger.get(taken)
    assert stored is not None
    assert (stored.owner, stored.lease_expires_at) == ("b#1", LEASE)

    assert not ledger.renew(new_key(), owner="a#1", lease_expires_at=later)


async def test_async_renew_is_fenced(ledger: Ledger) -> None:
    """``.aio.renew`` moves the owner's lease and refuses a stranger's, like the sync one."""
    key = new_key()
    claim(ledger, key, owner="a#1")
    later = LEASE + timedelta(seconds=600)
    assert not await ledger.aio.renew(key, owner="b#1", lease_expires_at=later)
    assert await ledger.aio.renew(key, owner="a#1", lease_expires_at=later)
    stored = await ledger.aio.get(key)
    assert stored is not None
    assert (stored.owner, stored.lease_expires_at) == ("a#1", later)


def test_threads_are_isolated(ledger: Ledger) -> None:
    """The same message and call ids in two threads are two calls."""
    one, two = new_key("thread-one"), new_key("thread-two")
    assert claim(ledger, one).claimed
    assert claim(ledger, two).claimed
    assert ledger.purge_thread("thread-one") == 1
    assert ledger.get(one) is None
    assert ledger.get(two) is not None
    ledger.purge_thread("thread-two")


@pytest.mark.parametrize(
    "thread_id",
    ["a:b", "a}b", "{a}", "a*", "x y", "ünï©ødé 🚀", "x" * 1024, "'; DROP TABLE tool_executions; --", "a\\b", "%s"],
)
def test_hostile_ids_are_isolated(ledger: Ledger, thread_id: str) -> None:
    """Ids with separators, patterns, quotes or unicode neither collide nor leak."""
    key = CallKey(thread_id, "m:1", "c}1")
    neighbour = CallKey(thread_id + "x", "m:1", "c}1")
    assert claim(ledger, key).claimed
    assert claim(ledger, neighbour).claimed
    stored = ledger.get(key)
    assert stored is not None
    assert stored.key == key
    assert ledger.purge_thread(thread_id) == 1
    assert ledger.get(neighbour) is not None
    ledger.purge_thread(thread_id + "x")


def test_get_many_returns_only_existing(ledger: Ledger) -> None:
    """get_many maps each existing key to its record and skips the rest."""
    keys = [new_key("t-many", call=f"call_{i}") for i in range(5)]
    for key in keys[:3]:
        claim(ledger, key)
    found = ledger.get_many(keys)
    assert set(found) == set(keys[:3])
    assert all(found[k].key == k for k in keys[:3])
    assert ledger.get_many([]) == {}
    ledger.purge_thread("t-many")


def test_records_and_delete(ledger: Ledger) -> None:
    """records() lists a thread's records oldest first; delete removes one."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    keys = [new_key(thread, call=f"call_{i}") for i in range(3)]
    for i, key in enumerate(keys):
        claim(ledger, key, now=NOW + timedelta(seconds=i))
    assert [r.key for r in ledger.records(thread_id=thread)] == keys
    assert ledger.delete(keys[0])
    assert not ledger.delete(keys[0])
    assert [r.key for r in ledger.records(thread_id=thread)] == keys[1:]
    ledger.purge_thread(thread)


async def test_async_operations(ledger: Ledger) -> None:
    """The .aio view claims, completes and reads like the sync ledger."""
    key = new_key()
    found = await ledger.aio.claim(key, tool_name="t", args_digest="d", owner="a#1", now=NOW, lease_expires_at=LEASE)
    assert found.claimed
    assert not (
        await ledger.aio.claim(key, tool_name="t", args_digest="d", owner="b#1", now=NOW, lease_expires_at=LEASE)
    ).claimed
    assert await ledger.aio.complete(key, owner="a#1", status=Status.COMPLETED, result="0", now=NOW)
    stored = await ledger.aio.get(key)
    assert stored is not None
    assert stored.result == "0"
    assert set(await ledger.aio.get_many([key])) == {key}


async def test_async_claims_race(ledger: Ledger) -> None:
    """Of many concurrent async claims of one key, exactly one wins."""
    key = new_key()
    results = await asyncio.gather(
        *(
            ledger.aio.claim(key, tool_name="t", args_digest="d", owner=f"o#{i}", now=NOW, lease_expires_at=LEASE)
            for i in range(20)
        )
    )
    assert sum(r.claimed for r in results) == 1


@contextlib.contextmanager
def _switching_often() -> Iterator[None]:
    """Switch threads as often as the interpreter can, so that operations interleave inside the ledger's code."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def _at_once(*operations: Callable[[], Any]) -> list[Any]:
    """Run ``operations`` in threads of their own, released together by a barrier; their answers in order."""
    barrier = threading.Barrier(len(operations))

    def run(operation: Callable[[], Any]) -> Any:
        barrier.wait(30)
        return operation()

    with concurrent.futures.ThreadPoolExecutor(len(operations)) as pool:
        return list(pool.map(run, operations))


def _rounds(ledger: Ledger) -> int:
    # An in-process ledger is cheap to race often; a server one costs round trips per operation.
    return 300 if isinstance(ledger, replaysafe.MemoryLedger) else 10


def test_threaded_claims_race(ledger: Ledger) -> None:
    """Claims of one key from many threads released at once by a barrier: exactly one wins, every round.

    (MemoryLedger's ``.aio`` runs inline, so the async race above is sequential there: this one is not.)
    """
    threads = 16
    with _switching_often():
        for _ in range(_rounds(ledger)):
            key = new_key()
            barrier = threading.Barrier(threads)

            def contend(n: int, key: CallKey = key, barrier: threading.Barrier = barrier) -> bool:
                barrier.wait(30)
                return claim(ledger, key, owner=f"host:1:{n}#1").claimed

            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                won = list(pool.map(contend, range(threads)))
            assert sum(won) == 1, f"{sum(won)} of {threads} concurrent claims won {key}"
            stored = ledger.get(key)
            assert stored is not None
            assert stored.owner == f"host:1:{won.index(True)}#1"


def test_a_completion_racing_its_own_renewal_is_never_undone(ledger: Ledger) -> None:
    """The owner's completion and its renewer's renewal of one record, at once: the record ends
    completed, with its result, whichever ran first (a renewal must not write back a running record)."""
    later = LEASE + timedelta(seconds=600)
    with _switching_often():
        for _ in range(_rounds(ledger)):
            key = new_key()
            claim(ledger, key, owner="a#1")
            completed, renewed = _at_once(
                lambda key=key: ledger.complete(key, owner="a#1", status=Status.COMPLETED, result='"ok"', now=NOW),
                lambda key=key: ledger.renew(key, owner="a#1", lease_expires_at=later),
            )
            stored = ledger.get(key)
            assert stored is not None
            assert completed, f"the owner's completion of {key} was refused (renewed: {renewed})"
            assert (stored.status, stored.result, stored.owner) == (Status.COMPLETED, '"ok"', "a#1")
            assert stored.lease_expires_at == (later if renewed else LEASE)


def test_a_completion_racing_a_takeover_lets_exactly_one_win(ledger: Ledger) -> None:
    """The owner's completion and another worker's takeover of the same running record, at once:
    exactly one succeeds, and the stored record is the winner's."""
    later = NOW + timedelta(seconds=400)
    with _switching_often():
        for _ in range(_rounds(ledger)):
            key = new_key()
            running = claim(ledger, key, owner="a#1").record
            completed, taken = _at_once(
                lambda key=key: ledger.complete(key, owner="a#1", status=Status.COMPLETED, result='"ok"', now=later),
                lambda running=running: ledger.takeover(running, owner="b#1", now=later, lease_expires_at=LEASE),
            )
            assert completed != (taken is not None), f"{key}: completed {completed}, taken over {taken is not None}"
            stored = ledger.get(key)
            assert stored is not None
            if completed:
                assert (stored.status, stored.owner, stored.attempt) == (Status.COMPLETED, "a#1", 1)
            else:
                assert (stored.status, stored.owner, stored.attempt) == (Status.RUNNING, "b#1", 2)


def test_listing_and_purging_while_other_threads_claim(ledger: Ledger) -> None:
    """``records()`` and ``purge_thread()`` while other threads claim in the same thread id: neither
    fails, a listing holds only whole records, and a purge removes every record that was there before it."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    before = [new_key(thread, call=f"before_{i}") for i in range(20)]
    for key in before:
        claim(ledger, key)
    stop, claiming_now = threading.Event(), threading.Barrier(3)

    def claiming(n: int) -> None:
        claim(ledger, new_key(thread, message=f"m{n}", call="during"))
        claiming_now.wait(30)
        made = 1
        while not stop.is_set() and made < 20 * _rounds(ledger):
            claim(ledger, new_key(thread, message=f"m{n}", call=f"during_{made}"))
            made += 1

    with _switching_often(), concurrent.futures.ThreadPoolExecutor(2) as pool:
        claimers = [pool.submit(claiming, n) for n in range(2)]
        try:
            claiming_now.wait(30)
            for _ in range(_rounds(ledger) // 10):
                listed = list(ledger.records(thread_id=thread))
                assert set(before) <= {record.key for record in listed}
                assert all(record.key.thread_id == thread and record.status is Status.RUNNING for record in listed)
            purged = ledger.purge_thread(thread)
        finally:
            stop.set()
        for claimer in claimers:
            claimer.result()  # a claim that failed meanwhile fails the test
    assert purged >= len(before)
    assert all(ledger.get(key) is None for key in before)
    ledger.purge_thread(thread)


async def test_async_tool_replays_across_ledger_objects(durable_ledger_url: str) -> None:
    """An async tool recorded through one ledger object is replayed through another, never rerun."""
    runs: list[str] = []

    async def refund(order_id: str) -> dict[str, str]:
        runs.append(order_id)
        return {"refund": order_id}

    for _ in range(2):
        async with replaysafe.open_ledger(durable_ledger_url) as ledger:
            tool = replay_safe(ledger=ledger)(refund)
            async with tool_call("thread-1", "msg-1", "call-1"):
                assert await tool("1042") == {"refund": "1042"}
    assert runs == ["1042"]


def test_two_event_loops_in_turn(ledger: Ledger) -> None:
    """.aio works from one asyncio.run() after another (async connections are per loop)."""
    thread = f"t-{uuid.uuid4().hex[:8]}"

    async def claim_one(n: int) -> bool:
        key = CallKey(thread, "m", str(n))
        found = await ledger.aio.claim(key, tool_name="t", args_digest="d", owner="o", now=NOW, lease_expires_at=LEASE)
        return found.claimed

    assert asyncio.run(claim_one(1))
    assert asyncio.run(claim_one(2))
    assert {r.key.tool_call_id for r in ledger.records(thread_id=thread)} == {"1", "2"}


# --- check(): the readiness probe ---------------------------------------------------------


def test_check_round_trips_and_leaves_nothing(ledger: Ledger) -> None:
    """check() claims, completes, reads and deletes a probe record: it passes and leaves no record behind."""
    ledger.check()
    ledger.check()  # each probe has its own key: a second one does not meet the first
    assert list(ledger.records()) == []


async def test_acheck_round_trips_and_leaves_nothing(ledger: Ledger) -> None:
    await ledger.acheck()  # type: ignore[attr-defined]
    assert list(ledger.records()) == []


def test_check_does_not_touch_real_calls(ledger: Ledger) -> None:
    """A probe never meets a real call's record, whatever ids that call has."""
    key = new_key(thread="replaysafe-probe")
    claim(ledger, key, owner="a#1")
    ledger.check()
    (record,) = ledger.records()
    assert (record.key, record.owner, record.status) == (key, "a#1", Status.RUNNING)


# --- ids are exact code points ---------------------------------------------------------------


def test_ids_are_compared_as_exact_code_points(ledger: Ledger) -> None:
    """An NFC and an NFD spelling of the same text are two keys; each round-trips exactly (get, get_many, records)."""
    text = "café-Ωμέγα-한국"
    nfc, nfd = unicodedata.normalize("NFC", text), unicodedata.normalize("NFD", text)
    assert nfc != nfd
    prefix = f"t-{uuid.uuid4().hex[:8]}-"
    keys = [CallKey(prefix + form, form, form) for form in (nfc, nfd)]
    for key, result in zip(keys, ('"nfc"', '"nfd"'), strict=True):
        assert claim(ledger, key, owner=f"{result}#1").claimed  # the second spelling does not find the first
        assert ledger.complete(key, owner=f"{result}#1", status=Status.COMPLETED, result=result, now=NOW)
    for key, result in zip(keys, ('"nfc"', '"nfd"'), strict=True):
        stored = ledger.get(key)
        assert stored is not None
        assert stored.result == result
        assert stored.key == key
        assert [list(map(ord, part)) for part in stored.key] == [list(map(ord, part)) for part in key]
        (listed,) = ledger.records(thread_id=key.thread_id)
        assert listed.key == key
        assert listed.result == result
    assert {r.key for r in ledger.records()} >= set(keys)
    assert set(ledger.get_many(keys)) == set(keys)


def test_a_tool_called_under_both_spellings_runs_twice(ledger: Ledger) -> None:
    """What the framework gives is what is keyed: no normalization merges two spellings."""
    runs: list[str] = []

    @replay_safe(ledger=ledger)
    def send(thread: str) -> str:
        runs.append(thread)
        return thread

    text = "Zoë"
    for form in ("NFC", "NFD", "NFC"):
        spelled = unicodedata.normalize(form, text)
        with tool_call(spelled, "m", "c"):
            assert send(spelled) == spelled
    assert runs == [unicodedata.normalize("NFC", text), unicodedata.normalize("NFD", text)]
