"""The replay protocol alone: its decisions, driven by hand, with no ledger and no I/O.

The protocol reads nothing ambient: its clocks, owner liveness and event sink are
handed in, so these tests hand it a fixed instant and an owner that is never seen.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from replaysafe import (
    CallInProgressError,
    CallKey,
    ClaimResult,
    JsonSerializer,
    LedgerError,
    Record,
    ReplayMismatchError,
    Status,
)
from replaysafe._context import CallScope, RunningCall
from replaysafe._core import (
    Claim,
    Complete,
    Get,
    Host,
    Release,
    Run,
    Sleep,
    Takeover,
    ToolSpec,
    Verdict,
    held_after,
    judge,
    replay,
    settle_error,
    undo_for,
)
from replaysafe._keys import step_key

KEY = CallKey("t", "m", "c")
NOW = datetime(2026, 12, 2, tzinfo=timezone.utc)
SPEC = ToolSpec(
    name="refund_order",
    serializer=JsonSerializer(),
    record_errors=(),
    on_ledger_error="warn",
    lease=330,
    wait_timeout=1,
)


EVENTS: list[tuple[Any, ...]] = []
#: A fixed instant, a monotonic clock that does not move, owners this host cannot see.
HOST = Host(
    now=lambda: NOW,
    monotonic=lambda: 0.0,
    owner_alive=lambda owner: None,
    emit=lambda kind, message, **fields: EVENTS.append((kind, message)),
    wanted=lambda kind: True,
)


def record(status: Status, *, lease_left: float = 100, result: str | None = None, digest: str = "d") -> Record:
    return Record(
        KEY, "refund_order", digest, status, result, "other#1", 1, NOW, NOW, NOW + timedelta(seconds=lease_left)
    )


def start() -> Any:
    protocol = replay(SPEC, CallScope(KEY), "d", ("1042",), {}, None, None, "me#1", HOST)
    return protocol, next(protocol)


def finish(protocol: Any, value: Any) -> Any:
    with pytest.raises(StopIteration) as stop:
        protocol.send(value)
    return stop.value.value


def test_a_miss_claims_runs_then_records() -> None:
    """Claim -> run -> complete with the encoded result, in that order."""
    protocol, effect = start()
    assert isinstance(effect, Claim)
    mine = record(Status.RUNNING)
    run = protocol.send(ClaimResult(mine, True))
    assert isinstance(run, Run)
    assert run.call.attempt == 1
    assert run.call.args == ("1042",)
    complete = protocol.send("refunded")
    assert isinstance(complete, Complete)
    assert (complete.status, complete.result) == (Status.COMPLETED, '"refunded"')
    assert finish(protocol, True) == "refunded"


def test_a_hit_replays_without_running() -> None:
    """A completed record ends the protocol with its decoded result: no Run effect."""
    protocol, _ = start()
    assert finish(protocol, ClaimResult(record(Status.COMPLETED, result="0"), False)) == 0


def test_a_live_owner_is_waited_for_then_replayed() -> None:
    """Running elsewhere: sleep, claim again, replay once it completed."""
    protocol, _ = start()
    assert isinstance(protocol.send(ClaimResult(record(Status.RUNNING), False)), Sleep)
    assert isinstance(protocol.send(None), Claim)
    assert finish(protocol, ClaimResult(record(Status.COMPLETED, result='"done"'), False)) == "done"


def test_an_expired_lease_is_taken_over() -> None:
    """A dead owner's record is taken over and the tool runs as attempt 2."""
    protocol, _ = start()
    stale = record(Status.RUNNING, lease_left=-1)
    takeover = protocol.send(ClaimResult(stale, False))
    assert isinstance(takeover, Takeover)
    assert takeover.record == stale
    run = protocol.send(Record(KEY, "refund_order", "d", Status.RUNNING, None, takeover.owner, 2, NOW, NOW, NOW))
    assert isinstance(run, Run)
    assert run.call.attempt == 2


def test_a_lost_takeover_looks_again() -> None:
    """When another worker took over first, the protocol claims again instead of running. It reads the record
    first: a takeover of its own whose answer was lost (tried again, it found its own write) would answer the
    same, and is then the protocol's to go on with."""
    protocol, _ = start()
    stale = record(Status.RUNNING, lease_left=-1)
    protocol.send(ClaimResult(stale, False))
    assert isinstance(protocol.send(None), Get)
    taken_by_another = stale._replace(owner="other:2:2#1", attempt=stale.attempt + 1)
    assert isinstance(protocol.send(taken_by_another), Claim)


def test_a_takeover_whose_answer_was_lost_but_landed_goes_on() -> None:
    """The record read after a takeover answered ``None`` is this owner's, as the very next attempt: the
    takeover landed (its answer lost, its retry found it done), so the protocol runs as it decided."""
    protocol, _ = start()
    stale = record(Status.RUNNING, lease_left=-1)
    protocol.send(ClaimResult(stale, False))
    assert isinstance(protocol.send(None), Get)
    assert isinstance(protocol.send(stale._replace(owner="me#1", attempt=stale.attempt + 1)), Run)


def test_a_failed_claim_runs_unprotected_by_default() -> None:
    """A LedgerError on the claim leads straight to running, with no record written."""
    protocol, _ = start()
    run = protocol.throw(LedgerError("down"))
    assert isinstance(run, Run)
    assert finish(protocol, "ran") == "ran"


def test_a_tool_error_releases_and_propagates() -> None:
    """The tool's exception is thrown in; the protocol releases, then re-raises it."""
    protocol, _ = start()
    protocol.send(ClaimResult(record(Status.RUNNING), True))
    error = ValueError("declined")
    assert isinstance(protocol.throw(error), Release)
    with pytest.raises(ValueError, match="declined") as raised:
        protocol.send(True)
    assert raised.value is error


def test_a_cleanup_failure_never_hides_the_tool_error() -> None:
    """If the release itself fails, the user's exception still wins."""
    protocol, _ = start()
    protocol.send(ClaimResult(record(Status.RUNNING), True))
    protocol.throw(ValueError("declined"))
    with pytest.raises(ValueError, match="declined"):
        protocol.throw(LedgerError("release failed"))


def test_the_wait_is_bounded() -> None:
    """When the wait deadline passes, CallInProgressError."""
    spec = ToolSpec("refund_order", JsonSerializer(), (), "warn", lease=330, wait_timeout=0)
    protocol = replay(spec, CallScope(KEY), "d", (), {}, None, None, "me#1", HOST)
    next(protocol)
    with pytest.raises(CallInProgressError):
        protocol.send(ClaimResult(record(Status.RUNNING), False))


@pytest.mark.parametrize(
    ("status", "lease_left", "verdict"),
    [
        (Status.COMPLETED, 10, Verdict.REPLAY),
        (Status.FAILED, 10, Verdict.RAISE_RECORDED),
        (Status.RUNNING, 10, Verdict.WAIT),
        (Status.RUNNING, 0, Verdict.IN_DOUBT),
        (Status.IN_DOUBT, 10, Verdict.IN_DOUBT),
    ],
)
def test_judge(status: Status, lease_left: float, verdict: Verdict) -> None:
    """Each stored state maps to one verdict."""
    assert judge(record(status, lease_left=lease_left), NOW, HOST.owner_alive) is verdict


def test_tool_call_builds_its_scope_field_by_field() -> None:
    """``tool_call`` builds its key and scope as plain tuples, in field order: every field lands in its place."""
    from replaysafe import MemoryLedger, tool_call
    from replaysafe._context import current_scope

    ledger = MemoryLedger()
    with tool_call("t", "m", "c", ledger=ledger, tool_timeout=5, in_doubt="raise", missing_ids_fix="fix") as key:
        scope = current_scope()
    assert type(key) is CallKey and key == CallKey(thread_id="t", message_id="m", tool_call_id="c")
    assert type(scope) is CallScope
    assert scope == CallScope(
        key=key, ledger=ledger, pauses=(), tool_timeout=5.0, in_doubt="raise", parent=None, missing_ids_fix="fix"
    )


# --- what the mutation check found unguarded -------------------------------------------------


def test_a_lost_takeover_is_undone_to_in_doubt_not_deleted() -> None:
    """A takeover whose answer was lost may have landed under this owner: it is undone by marking the call in doubt
    (fenced by owner), never by deleting the record, which would let the next replay run the call as new."""
    taken = Takeover(record(Status.RUNNING, lease_left=-1), "me#1", NOW, NOW + timedelta(seconds=330))
    assert undo_for(taken) == Complete(KEY, "me#1", Status.IN_DOUBT, None, NOW)
    assert held_after(taken, record(Status.RUNNING)) == Complete(KEY, "me#1", Status.IN_DOUBT, None, NOW)
    assert held_after(taken, None) is None  # it did not land: nothing to undo
    claim = Claim(KEY, "refund_order", "d", "me#1", NOW, NOW)
    assert undo_for(claim) == Release(KEY, "me#1")


def test_a_finished_record_under_this_owner_replays_it_does_not_run() -> None:
    """Only a running record of this owner is its own claim tried again; a finished one under the same token
    replays like any other."""
    protocol, _ = start()
    mine_finished = Record(KEY, "refund_order", "d", Status.COMPLETED, '"done"', "me#1", 1, NOW, NOW, NOW)
    assert finish(protocol, ClaimResult(mine_finished, False)) == "done"


def test_a_paused_call_resumes_without_asking_the_in_doubt_policy() -> None:
    """A paused call is taken over and run again under in_doubt="raise" too, with no in_doubt event: its owner
    stopped on purpose."""
    spec = dataclasses.replace(SPEC, in_doubt="raise")
    protocol = replay(spec, CallScope(KEY), "d", ("1042",), {}, None, None, "me#1", HOST)
    next(protocol)
    EVENTS.clear()
    takeover = protocol.send(ClaimResult(record(Status.PAUSED), False))
    assert isinstance(takeover, Takeover)
    run = protocol.send(Record(KEY, "refund_order", "d", Status.RUNNING, None, "me#1", 2, NOW, NOW, NOW))
    assert isinstance(run, Run)
    assert run.call.attempt == 2
    assert [kind for kind, _ in EVENTS if str(kind) == "in_doubt"] == []


def resumed_parent(result: str | None) -> tuple[Any, Run]:
    """A parent found paused with ``result`` and taken over: its protocol and the run it decided."""
    protocol, _ = start()
    assert isinstance(protocol.send(ClaimResult(record(Status.PAUSED, result=result), False)), Takeover)
    run = protocol.send(Record(KEY, "refund_order", "d", Status.RUNNING, None, "me#1", 2, NOW, NOW, NOW))
    assert isinstance(run, Run) and isinstance(run.call, RunningCall)
    return protocol, run


def step_protocol(parent: RunningCall, name: str) -> Any:
    """The protocol of the next step named ``name`` made inside ``parent``, as the decorator plans it."""
    scope = CallScope(step_key(parent.key, name, parent.next_ordinal(name)), parent=parent)
    return replay(dataclasses.replace(SPEC, name=name), scope, "d", (), {}, None, None, "me#2", HOST)


def test_a_first_executions_steps_are_claimed_with_no_other_ledger_operation() -> None:
    """No record of an earlier execution: each step's first effect is its claim, as before (the hot path)."""
    protocol, _ = start()
    run = protocol.send(ClaimResult(record(Status.RUNNING), True))
    assert isinstance(run, Run) and isinstance(run.call, RunningCall) and run.call.recorded_steps is None
    for name in ("refund", "notify", "refund"):
        assert isinstance(next(step_protocol(run.call, name)), Claim)
    assert run.call.steps_made() == ("refund", "notify", "refund")


def test_a_step_renamed_at_a_recorded_place_is_refused_before_its_claim() -> None:
    """Run again after a pause that recorded a refund step: a step of another name at that place reads the
    refund's record, and, found, is refused (nothing claimed); the parent is kept paused with its steps."""
    _, run = resumed_parent('rs-steps-1:["refund"]')
    assert isinstance(run.call, RunningCall)
    step = step_protocol(run.call, "issue_refund")
    get = next(step)
    assert get == Get(CallKey("t", "m", "c>refund#1"))
    EVENTS.clear()
    with pytest.raises(ReplayMismatchError) as refused:
        step.send(record(Status.COMPLETED, result='"re_1"'))
    assert "'refund'" in str(refused.value) and "issue_refund" in str(refused.value)
    assert [str(kind) for kind, _ in EVENTS] == ["mismatch"]
    kept = next(settle_error(SPEC, CallScope(KEY), run, refused.value))
    assert isinstance(kept, Complete)
    assert (kept.status, kept.result) == (Status.PAUSED, 'rs-steps-1:["refund"]')  # the recorded name kept


@pytest.mark.parametrize(
    "stopped",
    [
        ReplayMismatchError("a step with other arguments"),
        LedgerError("the ledger could not be read", transient=True),
        CallInProgressError("a step runs in another worker"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_call_run_again_that_replaysafe_stops_is_kept_as_it_was_with_its_steps(stopped: Exception) -> None:
    """Not released: released, its next run would have no steps to check a renamed one against."""
    _, run = resumed_parent('rs-steps-1:["refund", "notify"]')
    assert isinstance(run.call, RunningCall)
    run.call.next_ordinal("refund")  # the run got as far as its first step
    kept = next(settle_error(SPEC, CallScope(KEY), run, stopped))
    assert isinstance(kept, Complete)
    assert (kept.status, kept.result) == (Status.PAUSED, 'rs-steps-1:["refund", "notify"]')
    assert isinstance(next(settle_error(SPEC, CallScope(KEY), run, ValueError("the tool's own"))), Release)


@pytest.mark.parametrize(
    ("recorded", "made", "reads"),
    [
        pytest.param('rs-steps-1:["refund"]', ["refund"], False, id="the-same-step"),
        pytest.param('rs-steps-1:["a", "b"]', ["b", "a"], False, id="recorded-at-another-place"),
        pytest.param('rs-steps-1:["refund"]', ["refund", "notify"], False, id="past-the-recorded-places"),
        pytest.param(None, ["issue_refund"], False, id="a-record-written-before-steps-were-kept"),
        pytest.param('rs-steps-1:["lookup"]', ["find"], True, id="the-recorded-step-left-no-record"),
    ],
)
def test_a_step_run_again_is_claimed_when_nothing_recorded_stands_in_its_place(
    recorded: str | None, made: list[str], reads: bool
) -> None:
    _, run = resumed_parent(recorded)
    assert isinstance(run.call, RunningCall)
    for name in made:
        step = step_protocol(run.call, name)
        effect = next(step)
        if reads:
            assert isinstance(effect, Get)
            effect = step.send(None)  # nothing recorded under the earlier step's key
        assert isinstance(effect, Claim) and effect.tool_name == name
