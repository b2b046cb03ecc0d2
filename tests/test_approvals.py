"""Approvals: one-use capabilities bound to the call they approve, on every ledger (docs/approvals.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import replaysafe
from replaysafe import (
    RERUN,
    ApprovalExpiredError,
    ApprovalMismatchError,
    ApprovalRejectedError,
    ApprovalRequiredError,
    CallInDoubtError,
    CallKey,
    Event,
    EventKind,
    Ledger,
    LedgerError,
    ReplayMismatchError,
    Status,
    TamperedRecordError,
    approvals,
    replay_safe,
    tool_call,
)
from replaysafe._approvals import STATE_PREFIX, Approval, parse_state
from replaysafe._sealing import Sealer, unsealed
from replaysafe.testing import SteppedClock

from .cli import cli
from .test_signing import KEY_A, KEY_B, signed  # noqa: F401  (signed: the fixture)

CHILD = str(Path(__file__).with_name("approvals_child.py"))


def new_key() -> CallKey:
    return CallKey(f"thread-{uuid.uuid4().hex[:10]}", "msg_1", "call_1")


class Refunds:
    """A ``needs_approval`` refund tool on ``ledger`` and the refunds it made, in order."""

    def __init__(self, ledger: Ledger, **options: Any) -> None:
        self.made: list[tuple[str, int]] = []

        @replay_safe(ledger=ledger, needs_approval=True, name="refund_order", **options)
        def refund_order(order_id: str, amount: int) -> str:
            self.made.append((order_id, amount))
            return f"re_{order_id}_{amount}"

        self.tool = refund_order

    def call(self, key: CallKey, order_id: str = "A1", amount: int = 30) -> str:
        with tool_call(*key):
            result: str = self.tool(order_id, amount)
            return result


def asked(refunds: Refunds, key: CallKey, **args: Any) -> ApprovalRequiredError:
    """The first call of ``key``: kept paused for a decision, nothing run."""
    with pytest.raises(ApprovalRequiredError) as raised:
        refunds.call(key, **args)
    return raised.value


def state_of(ledger: Ledger, key: CallKey) -> Any:
    record = ledger.get(key)
    assert record is not None
    assert record.result is not None and record.result.startswith(STATE_PREFIX)
    return record.status, parse_state(record.result)


def test_a_call_runs_once_on_an_approval_and_then_replays(ledger: Ledger, events: list[Event]) -> None:
    refunds, key = Refunds(ledger), new_key()
    error = asked(refunds, key)
    assert refunds.made == []
    assert error.key == key and error.may_have_run is False
    assert "replaysafe ledger approve" in str(error)
    assert "A1" not in str(error).replace(str(key), "")  # never an argument value
    status, state = state_of(ledger, key)
    assert status is Status.PAUSED and state.requested and state.decision is None
    asked(refunds, key)  # asked again before a decision: still nothing runs
    approvals.approve(error, by="ana", ledger=ledger)
    assert refunds.call(key) == "re_A1_30"
    assert refunds.call(key) == "re_A1_30"  # replayed: the approval was spent once
    assert refunds.made == [("A1", 30)]
    kinds = [event.kind for event in events]
    assert kinds.count(EventKind.APPROVAL_REQUESTED) == 1
    assert kinds.count(EventKind.APPROVED) == 1
    assert kinds.count(EventKind.EXECUTED) == 1 and kinds.count(EventKind.REPLAYED) == 1
    approved = next(event for event in events if event.kind is EventKind.APPROVED)
    assert approved.approver == "ana" and approved.key == key


def test_other_arguments_on_an_approved_call_are_refused_and_it_stays_paused(
    ledger: Ledger, events: list[Event]
) -> None:
    """The model asks again with another amount after the approval (or a resumed run re-plans): the approval
    runs only what it approved; the call stays paused, and the approved arguments still run once."""
    refunds, key = Refunds(ledger), new_key()
    asked(refunds, key)
    approvals.approve(key, by="ana", ledger=ledger)
    with pytest.raises(ApprovalMismatchError, match="not for this call") as refused:
        refunds.call(key, amount=82000)
    assert isinstance(refused.value, ReplayMismatchError)
    assert "82000" not in str(refused.value)
    assert refunds.made == []
    assert state_of(ledger, key)[0] is Status.PAUSED
    refusal = next(event for event in events if event.kind is EventKind.APPROVAL_REFUSED)
    assert refusal.reason == "mismatch" and refusal.approver == "ana"
    assert refunds.call(key) == "re_A1_30"
    assert refunds.made == [("A1", 30)]


def test_other_arguments_before_any_decision_are_a_mismatch(ledger: Ledger) -> None:
    refunds, key = Refunds(ledger), new_key()
    asked(refunds, key)
    with pytest.raises(ApprovalMismatchError, match="paused for a decision with other arguments"):
        refunds.call(key, amount=5)
    assert refunds.made == []


def test_an_approval_of_another_tool_under_the_key_is_a_mismatch(ledger: Ledger) -> None:
    key = new_key()
    asked(Refunds(ledger), key)
    approvals.approve(key, by="ana", ledger=ledger)
    other = Refunds(ledger, exclude_args=())  # the same code, another tool name: a rename while paused
    renamed = replay_safe(ledger=ledger, needs_approval=True, name="refund_v2")(lambda order_id, amount: "x")
    with tool_call(*key), pytest.raises(ReplayMismatchError):
        renamed("A1", 30)
    assert other.made == []


def test_an_expired_approval_is_refused_and_a_new_one_runs(ledger: Ledger, events: list[Event]) -> None:
    refunds, key = Refunds(ledger), new_key()
    with SteppedClock() as clock:
        asked(refunds, key)
        approvals.approve(key, by="ana", expires_in=60, ledger=ledger)
        clock.advance(61)
        with pytest.raises(ApprovalExpiredError, match="expired"):
            refunds.call(key)
        assert refunds.made == []
        assert [e.reason for e in events if e.kind is EventKind.APPROVAL_REFUSED] == ["expired"]
        approvals.approve(key, by="ana", expires_in=timedelta(minutes=5), ledger=ledger)
        clock.advance(299)
        assert refunds.call(key) == "re_A1_30"
    assert refunds.made == [("A1", 30)]


def test_a_rejected_call_never_runs_until_a_new_decision(ledger: Ledger, events: list[Event]) -> None:
    refunds, key = Refunds(ledger), new_key()
    asked(refunds, key)
    approvals.reject(key, by="bo", reason="amount too high", ledger=ledger)
    for _ in range(2):
        with pytest.raises(ApprovalRejectedError) as rejected:
            refunds.call(key)
        assert rejected.value.by == "bo" and rejected.value.reason == "amount too high"
        assert "too high" not in str(rejected.value)  # the approver's words are data, not the message
    assert refunds.made == []
    assert [e.approver for e in events if e.kind is EventKind.REJECTED] == ["bo"]
    approvals.approve(key, by="bo", ledger=ledger)  # a new decision replaces the rejection
    assert refunds.call(key) == "re_A1_30"
    assert refunds.made == [("A1", 30)]


def test_an_edit_runs_the_edited_arguments_once(ledger: Ledger) -> None:
    """Approve with edits: the call, asked as first asked, runs with the approver's arguments; its replays,
    asked the same way, return that run's result."""
    refunds, key = Refunds(ledger), new_key()
    asked(refunds, key)
    approvals.approve(key, by="ana", args={"order_id": "A1", "amount": 25}, ledger=ledger)
    assert refunds.call(key) == "re_A1_25"
    assert refunds.call(key) == "re_A1_25"
    assert refunds.made == [("A1", 25)]


def test_an_edit_also_runs_when_the_call_is_asked_with_it(ledger: Ledger) -> None:
    """The framework applied the edit (Pydantic AI's override_args): asked with the edited arguments, it runs
    them; any third set of arguments is refused."""
    refunds, key = Refunds(ledger), new_key()
    asked(refunds, key)
    approvals.approve(key, by="ana", args={"order_id": "A1", "amount": 25}, ledger=ledger)
    with pytest.raises(ApprovalMismatchError):
        refunds.call(key, amount=26)
    assert refunds.call(key, amount=25) == "re_A1_25"
    assert refunds.call(key, amount=25) == "re_A1_25"
    assert refunds.made == [("A1", 25)]


def test_an_edit_that_does_not_fit_the_tool_is_refused(ledger: Ledger) -> None:
    refunds, key = Refunds(ledger), new_key()
    asked(refunds, key)
    approvals.approve(key, by="ana", args={"order": "A1"}, ledger=ledger)
    with pytest.raises(ApprovalMismatchError, match="do not fit"):
        refunds.call(key)
    assert refunds.made == []


class Interrupted(BaseException):
    """A stop in the middle of the tool (as a cancellation or a signal handler's exception)."""


def test_an_approved_run_that_stops_in_doubt_asks_again_and_never_reruns_on_it(
    ledger: Ledger, events: list[Event]
) -> None:
    """Interrupted inside the approved tool, after its side effect: the call is in doubt and its approval
    spent; even under the default rerun policy it does not run again, it waits for a new decision and says
    the first attempt may have taken effect."""
    made: list[int] = []

    @replay_safe(ledger=ledger, needs_approval=True)
    def refund_order(amount: int) -> str:
        made.append(amount)
        if len(made) == 1:
            raise Interrupted()
        return f"re_{amount}"

    key = new_key()
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order(30)
    approvals.approve(key, by="ana", ledger=ledger)
    with tool_call(*key), pytest.raises(Interrupted):
        refund_order(30)
    status, state = state_of(ledger, key)
    assert status is Status.IN_DOUBT and state.spent is not None and state.may_have_run
    with tool_call(*key), pytest.raises(ApprovalRequiredError) as again:
        refund_order(30)
    assert again.value.may_have_run is True and "may have happened" in str(again.value)
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order(30)  # still: no run without a new decision
    assert made == [30]
    approvals.approve(key, by="ana", ledger=ledger)  # the approver checked the provider: run it again
    with tool_call(*key):
        assert refund_order(30) == "re_30"
    assert made == [30, 30]
    assert [e.kind for e in events].count(EventKind.APPROVAL_REQUESTED) == 2


def interrupted_on_its_approval(
    ledger: Ledger, answer: str | None = None, **options: Any
) -> tuple[Any, CallKey, list[int]]:
    """A ``needs_approval`` tool asked, approved (on ``answer``), then interrupted inside its approved run (in
    doubt): the tool, the call's key, and the amounts it ran with."""
    made: list[int] = []

    @replay_safe(ledger=ledger, needs_approval=True, **options)
    def refund_order(amount: int) -> str:
        made.append(amount)
        raise Interrupted()

    key = new_key()
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order(30)
    approvals.approve(key, by="ana", ledger=ledger, answer=answer)
    with tool_call(*key), pytest.raises(Interrupted):
        refund_order(30)
    return refund_order, key, made


def test_in_doubt_after_an_approval_raises_under_raise(ledger: Ledger) -> None:
    refund_order, key, made = interrupted_on_its_approval(ledger, in_doubt="raise")
    with tool_call(*key), pytest.raises(CallInDoubtError):
        refund_order(30)
    assert made == [30]


def test_a_reconciler_that_asks_for_a_rerun_gets_a_new_decision_instead(ledger: Ledger) -> None:
    asked_reconciler: list[int] = []
    while_asked: list[Any] = []

    def reconcile(call: Any) -> Any:
        asked_reconciler.append(call.attempt)
        while_asked.append(state_of(ledger, call.key))  # what a crash of the reconciler would leave
        return RERUN

    refund_order, key, made = interrupted_on_its_approval(ledger, answer="first", in_doubt=reconcile)
    with tool_call(*key), pytest.raises(ApprovalRequiredError) as again:
        refund_order(30)
    assert again.value.may_have_run is True
    assert asked_reconciler and made == [30]
    status, state = state_of(ledger, key)
    assert status is Status.PAUSED and state.answers == ("first",)  # the answer it ran on: not a new one
    [(status, state)] = while_asked
    assert status is Status.RUNNING and state.may_have_run and state.answers == ("first",)


def test_a_call_that_raises_after_its_approval_needs_a_new_one_to_run_again(ledger: Ledger) -> None:
    """An error frees the call for a retry; the retry is a new run, on a new approval."""
    made: list[int] = []

    @replay_safe(ledger=ledger, needs_approval=True)
    def refund_order(amount: int) -> str:
        made.append(amount)
        if len(made) == 1:
            raise RuntimeError("the provider said 503")
        return "ok"

    key = new_key()
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order(30)
    approvals.approve(key, by="ana", ledger=ledger)
    with tool_call(*key), pytest.raises(RuntimeError):
        refund_order(30)
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order(30)
    approvals.approve(key, by="ana", ledger=ledger)
    with tool_call(*key):
        assert refund_order(30) == "ok"
    assert made == [30, 30]


def test_a_plain_pause_approved_is_bound_by_its_approval(ledger: Ledger) -> None:
    """An approval written on a call paused by its framework (no needs_approval): its resume is checked and
    spends it, and a later pause of the same call needs a new one."""

    class NeedsHuman(Exception):
        pass

    made: list[int] = []
    answers = iter(["pause", "run"])

    @replay_safe(ledger=ledger, pause_on=NeedsHuman)
    def refund_order(amount: int) -> str:
        if next(answers) == "pause":
            raise NeedsHuman()
        made.append(amount)
        return "ok"

    key = new_key()
    with tool_call(*key), pytest.raises(NeedsHuman):
        refund_order(30)
    approvals.approve(key, by="ana", ledger=ledger)
    with tool_call(*key), pytest.raises(ApprovalMismatchError):
        refund_order(31)
    with tool_call(*key):
        assert refund_order(30) == "ok"
    assert made == [30]


def test_deciding_a_call_that_is_not_paused_is_refused(ledger: Ledger) -> None:
    refunds, key = Refunds(ledger), new_key()
    with pytest.raises(LookupError, match="no record"):
        approvals.approve(key, by="ana", ledger=ledger)
    asked(refunds, key)
    approvals.approve(key, by="ana", ledger=ledger)
    refunds.call(key)
    with pytest.raises(ValueError, match="is completed, not paused"):
        approvals.approve(key, by="ana", ledger=ledger)
    with pytest.raises(ValueError, match="approver"):
        approvals.approve(key, by="", ledger=ledger)
    with pytest.raises(TypeError, match="always expires"):
        approvals.approve(key, by="ana", expires_in=None, ledger=ledger)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reason"):
        approvals.reject(key, by="ana", reason=" ", ledger=ledger)
    with pytest.raises(TypeError, match="JSON values"):
        approvals.approve(key, by="ana", args={"amount": object()}, ledger=ledger)


def test_a_ledger_that_fails_never_runs_the_tool_unprotected(ledger: Ledger) -> None:
    class Broken:
        """The ledger's store down for good: every operation fails."""

        def __getattr__(self, name: str) -> Any:
            return getattr(ledger, name)

        def claim(self, *args: Any, **kwargs: Any) -> Any:
            raise ConnectionError("the ledger's server is down")

    made: list[int] = []

    @replay_safe(ledger=Broken(), needs_approval=True)  # type: ignore[arg-type]
    def refund_order(amount: int) -> str:
        made.append(amount)
        return "ok"

    with tool_call(*new_key()), pytest.raises(LedgerError):
        refund_order(30)
    assert made == []


def test_async_tools_and_decisions(ledger: Ledger) -> None:
    made: list[int] = []

    @replay_safe(ledger=ledger, needs_approval=True)
    async def refund_order(amount: int) -> str:
        made.append(amount)
        return f"re_{amount}"

    key = new_key()

    async def flow() -> None:
        with tool_call(*key):
            with pytest.raises(ApprovalRequiredError):
                await refund_order(30)
            await approvals.areject(key, by="bo", reason="no", ledger=ledger)
            with pytest.raises(ApprovalRejectedError):
                await refund_order(30)
            await approvals.aapprove(key, by="bo", ledger=ledger)
            assert await refund_order(30) == "re_30"
            assert await refund_order(30) == "re_30"

    asyncio.run(flow())
    assert made == [30]


def test_the_cli_approves_and_rejects(durable_ledger: Ledger, durable_ledger_url: str) -> None:
    refunds, key = Refunds(durable_ledger), new_key()
    asked(refunds, key)
    shown = cli("ledger", "--ledger", durable_ledger_url, "show", *key, "--json")
    assert shown.returncode == 0, shown.stderr
    shown_json = json.loads(shown.stdout)
    assert shown_json["result_kind"] == "approval" and shown_json["result_marker"]["requested"] is True
    listed = cli("ledger", "--ledger", durable_ledger_url, "list", "--status", "paused", "--json")
    assert key.thread_id in listed.stdout
    rejected = cli("ledger", "--ledger", durable_ledger_url, "reject", *key, "--by", "bo", "--reason", "no", "--yes")
    assert rejected.returncode == 0, rejected.stderr
    with pytest.raises(ApprovalRejectedError):
        refunds.call(key)
    approved = cli(
        "ledger", "--ledger", durable_ledger_url, "approve", *key, "--by", "ana", "--expires", "15m", "--yes", "--json"
    )
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["decided"] == "approved"
    shown = cli("ledger", "--ledger", durable_ledger_url, "show", *key)
    assert "approved by ana until" in shown.stdout
    assert refunds.call(key) == "re_A1_30"
    refused = cli("ledger", "--ledger", durable_ledger_url, "approve", *key, "--by", "ana", "--yes")
    assert refused.returncode == 1 and "not paused" in refused.stderr
    bad = cli("ledger", "--ledger", durable_ledger_url, "approve", *key, "--by", "ana", "--args", "[1]", "--yes")
    assert bad.returncode == 2 and "JSON object" in bad.stderr
    assert refunds.made == [("A1", 30)]


# --- real processes: a crash inside the approved tool, two workers on one approval ----------------


def run_child(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, CHILD, *args], capture_output=True, text=True, timeout=120)


def outcome(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_a_sigkill_inside_the_approved_tool_never_reruns_on_that_approval(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path
) -> None:
    effects, thread = tmp_path / "effects", f"t-{uuid.uuid4().hex[:10]}"
    key = CallKey(thread, "msg_1", "call_1")
    assert outcome(run_child("run", durable_ledger_url, str(effects), thread, "none")) == {
        "error": "ApprovalRequiredError",
        "may_have_run": False,
    }
    approvals.approve(key, by="ana", ledger=durable_ledger, answer="first")
    killed = run_child("run", durable_ledger_url, str(effects), thread, "inside")
    assert killed.returncode == -9, killed.stderr
    resumed = outcome(run_child("run", durable_ledger_url, str(effects), thread, "none"))
    assert resumed == {"error": "ApprovalRequiredError", "may_have_run": True}
    # The answer it ran on, handed back after the crash (a framework keeps it): not a new approval.
    approvals.approve(key, by="ana", ledger=durable_ledger, answer="first")
    again = outcome(run_child("run", durable_ledger_url, str(effects), thread, "none"))
    assert again == {"error": "ApprovalRequiredError", "may_have_run": True}
    assert len(effects.read_text().splitlines()) == 1
    approvals.approve(key, by="ana", ledger=durable_ledger)
    assert outcome(run_child("run", durable_ledger_url, str(effects), thread, "none")) == {"result": "re_A1_30"}
    assert len(effects.read_text().splitlines()) == 2  # the second approval's run, and no other


def test_two_workers_on_one_approval_run_the_tool_once(
    durable_ledger: Ledger, durable_ledger_url: str, tmp_path: Path
) -> None:
    effects, thread = tmp_path / "effects", f"t-{uuid.uuid4().hex[:10]}"
    key = CallKey(thread, "msg_1", "call_1")
    outcome(run_child("run", durable_ledger_url, str(effects), thread, "none"))
    approvals.approve(key, by="ana", ledger=durable_ledger)
    racers = [
        subprocess.Popen(
            [sys.executable, CHILD, "race", durable_ledger_url, str(effects), thread],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for racer in racers:
        assert racer.stdout is not None and racer.stdout.readline().strip() == "ready"
    for racer in racers:
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    answers = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        answers.append(json.loads(out.strip().splitlines()[-1]))
    assert answers == [{"result": "re_A1_30"}] * 3
    assert len(effects.read_text().splitlines()) == 1


# --- sealing: an approval written by someone who can write the store, not by an approver ---------------


def test_a_forged_approval_is_refused_and_nothing_runs(signed: Any) -> None:  # noqa: F811  (the fixture)
    """On a signing ledger, an approval is sealed with the rest of the paused record: one written straight
    into the store (unsealed, or sealed with a key the ledger does not accept) raises TamperedRecordError,
    for the call and for an approver alike, and the tool never runs."""
    ledger, tamper, _ = signed
    refunds, honest = Refunds(ledger), new_key()
    asked(refunds, honest, order_id="H1")
    approvals.approve(honest, by="ana", ledger=ledger)  # sealed by the ledger's key: it runs
    assert refunds.call(honest, order_id="H1") == "re_H1_30"
    key = new_key()
    asked(refunds, key)
    record = ledger.get(key)
    assert record is not None
    state = parse_state(unsealed(record.result) or "")
    assert state is not None
    now = datetime.now(timezone.utc)
    forged = dataclasses.replace(
        state,
        decision=Approval("approved", "mallory", now, key, "refund_order", record.args_digest, now + timedelta(days=1)),
    )
    foreign = Sealer([KEY_B]).seal(key, "refund_order", record.args_digest, Status.PAUSED, forged.text())
    for text in (forged.text(), foreign):
        tamper(ledger, key, {"result": text})
        with pytest.raises(TamperedRecordError):
            refunds.call(key)
        with pytest.raises(TamperedRecordError):
            approvals.approve(key, by="ana", ledger=ledger)
    assert refunds.made == [("H1", 30)]


def test_the_answers_a_call_keeps_after_a_raise_or_a_rerun_by_hand_do_not_expire(
    durable_ledger_url: str, replaysafe_clock: SteppedClock
) -> None:
    """On a ledger with a ttl, the paused records that keep a call's answers (its run raised on its approval; a
    rerun by hand of a call in doubt on one) never expire: expired, the answer handed back would run it again."""
    ttl = timedelta(seconds=60)
    with replaysafe.open_ledger(durable_ledger_url, ttl=ttl.total_seconds()) as ledger:
        raised: list[int] = []

        @replay_safe(ledger=ledger, needs_approval=True)
        def refund_order(amount: int) -> str:
            raised.append(amount)
            raise TimeoutError("the provider timed out")

        key = new_key()
        with tool_call(*key), pytest.raises(ApprovalRequiredError):
            refund_order(30)
        approvals.approve(key, by="ana", ledger=ledger, answer="first")
        with tool_call(*key), pytest.raises(TimeoutError):
            refund_order(30)
        rerun, rerun_key, made = interrupted_on_its_approval(ledger, answer="first")
        ledger.resolve(rerun_key, rerun=True)
        for call in (key, rerun_key):
            record = ledger.get(call)
            assert record is not None and record.status is Status.PAUSED and record.expires_at is None
        replaysafe_clock.advance(ttl * 2)  # the SQL ledgers expire at this clock (Redis: expires_at is the key's)
        for tool, call in ((refund_order, key), (rerun, rerun_key)):
            approvals.approve(call, by="ana", ledger=ledger, answer="first")  # handed back: decides nothing
            with tool_call(*call), pytest.raises(ApprovalRequiredError):
                tool(30)
        assert (raised, made) == ([30], [30])


def test_a_rerun_by_hand_on_a_signing_ledger_seals_the_answers_it_keeps(signed: Any) -> None:  # noqa: F811
    """On a signing ledger the paused record a rerun by hand leaves is sealed: the call asks for a new decision
    (no forgery reported). Without the signing key, or with another, the rerun is refused, and nothing is
    changed."""
    ledger, _, reopen = signed
    refund_order, key, made = interrupted_on_its_approval(ledger, answer="first")
    before = ledger.get(key)
    with pytest.raises(ValueError, match="signing key") as refused:
        reopen(None).resolve(key, rerun=True)
    assert str(key.thread_id) in str(refused.value)
    with pytest.raises(ValueError, match="does not check"):  # another key: what the record says is not trusted
        reopen(KEY_B).resolve(key, rerun=True)
    reopen(KEY_A)  # the memory ledger's own key back (the others reopened a ledger of their own)
    assert ledger.get(key) == before
    ledger.resolve(key, rerun=True)
    approvals.approve(key, by="ana", ledger=ledger, answer="first")
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order(30)
    approvals.approve(key, by="ana", ledger=ledger, answer="second")
    with tool_call(*key), pytest.raises(Interrupted):
        refund_order(30)
    assert made == [30, 30]


def test_the_cli_reruns_a_call_decided_on_answers_only_with_the_key_that_seals_them(tmp_path: Path) -> None:
    """``ledger resolve --rerun`` of a call decided on a human's answers, on a ledger that seals: refused before it
    asks for confirmation without the key (exit 5) or with another (exit 6), nothing changed; with the key, it
    says what it does (the call is kept paused for a new decision), and does it."""
    url = f"sqlite:///{tmp_path / 'signed.db'}"
    with replaysafe.open_ledger(url, signing_key=KEY_A) as ledger:
        _, key, _ = interrupted_on_its_approval(ledger, answer="first")
        before = ledger.get(key)
        wrong = tmp_path / "wrong.key"
        wrong.write_text(KEY_B)
        rerun = ("ledger", "--ledger", url, "resolve", *key, "--rerun")
        without = cli(*rerun, stdin="y\n")
        assert without.returncode == 5, without.stderr
        assert key.thread_id in without.stderr and "signing key" in without.stderr and "Settle it" not in without.stdout
        other = cli("ledger", "--ledger", url, "--signing-key-file", str(wrong), *rerun[3:], "--yes")
        assert other.returncode == 6, other.stderr
        assert "does not check" in other.stderr
        assert ledger.get(key) == before
        done = cli(*rerun, "--yes", env={"REPLAYSAFE_SIGNING_KEY": KEY_A})
        assert done.returncode == 0, done.stderr
        assert "keep it paused for a new decision" in done.stdout
        paused = ledger.get(key)
        assert paused is not None and paused.status is Status.PAUSED
        assert ledger.sealer is not None
        state = parse_state(ledger.sealer.open(paused) or "")  # sealed with the ledger's key: it checks
        assert state is not None and state.answers == ("first",) and state.decision is None


class _InterruptedAfterTheSpendingTakeover:
    """``ledger``, but the takeover that spends an approval lands and then its caller is interrupted: its
    outcome unknown to the call, which leaves it to be written in doubt later, as for a reply lost."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def takeover(self, record: Any, **kwargs: Any) -> Any:
        taken = self._ledger.takeover(record, **kwargs)
        if kwargs.get("status") is Status.RUNNING and kwargs.get("result") is not None:
            raise Interrupted()
        return taken


def test_a_spending_takeover_whose_outcome_is_lost_puts_the_approval_back(ledger: Ledger) -> None:
    """The takeover that spends an approval is interrupted once it landed: the tool has not run, so what is
    written in its place is the paused call with its approval unspent, and the next call runs once on it."""
    interrupted = _InterruptedAfterTheSpendingTakeover(ledger)
    refunds, key = Refunds(interrupted), new_key()  # type: ignore[arg-type]
    asked(refunds, key)
    approvals.approve(key, by="ana", ledger=ledger)
    with pytest.raises(Interrupted):
        refunds.call(key)
    deadline = time.monotonic() + 20
    while (record := ledger.get(key)) is None or record.status is not Status.PAUSED:
        assert time.monotonic() < deadline, f"the call was left {record}"
        time.sleep(0.02)
    _, state = state_of(ledger, key)
    assert state.decision is not None and state.spent is None
    assert refunds.made == []
    assert Refunds(ledger).call(key) == "re_A1_30"


# --- a framework that holds a call back for its human: request, then decide, then the call runs ---------------


def test_a_call_held_back_by_its_framework_runs_once_on_the_answer(ledger: Ledger, events: list[Event]) -> None:
    """The framework asks its human before it calls the tool (Pydantic AI's requires_approval, the OpenAI
    Agents SDK's needs_approval): the adapter requests a decision for the call, records the answer (here an
    edit), and the call the framework then makes runs the approved arguments once."""
    refunds, key = Refunds(ledger), new_key()
    first = approvals.request(key, tool=refunds.tool, args={"order_id": "A1", "amount": 30}, ledger=ledger)
    again = approvals.request(key, tool=refunds.tool, args={"order_id": "A1", "amount": 30}, ledger=ledger)
    assert first.status is Status.PAUSED and again == first  # asked twice: one request
    assert [e.kind for e in events].count(EventKind.APPROVAL_REQUESTED) == 1
    approvals.approve(key, by="ana", args={"order_id": "A1", "amount": 25}, ledger=ledger)
    with pytest.raises(ApprovalMismatchError):
        refunds.call(key, amount=31)  # the model's own third idea
    assert refunds.call(key, amount=25) == "re_A1_25"  # the framework applied the edit
    assert refunds.call(key, amount=25) == "re_A1_25"
    assert refunds.made == [("A1", 25)]
    with pytest.raises(ValueError, match="is completed"):
        approvals.request(key, tool=refunds.tool, args={"order_id": "A1", "amount": 25}, ledger=ledger)


def test_a_request_for_other_arguments_under_a_used_key_is_refused(ledger: Ledger) -> None:
    refunds, key = Refunds(ledger), new_key()
    approvals.request(key, tool=refunds.tool, args={"order_id": "A1", "amount": 30}, ledger=ledger)
    with pytest.raises(ReplayMismatchError):
        approvals.request(key, tool=refunds.tool, args={"order_id": "A1", "amount": 31}, ledger=ledger)
    with pytest.raises(TypeError, match="@replay_safe tool"):
        approvals.request(key, tool=lambda: None, args={}, ledger=ledger)


def test_a_held_back_call_rejected_never_runs(ledger: Ledger) -> None:
    refunds, key = Refunds(ledger), new_key()

    async def flow() -> None:
        await approvals.arequest(key, tool=refunds.tool, args={"order_id": "A1", "amount": 30}, ledger=ledger)
        await approvals.areject(key, by="bo", reason="fraud", ledger=ledger)

    asyncio.run(flow())
    with pytest.raises(ApprovalRejectedError):
        refunds.call(key)
    assert refunds.made == []


def test_a_request_needs_no_argument_the_digest_leaves_out(ledger: Ledger) -> None:
    """A framework's context or client parameter (``exclude_args``) is not part of the call's identity: a
    request without it is the call the framework then makes with it."""
    made: list[int] = []

    @replay_safe(ledger=ledger, needs_approval=True, exclude_args=("context",))
    def refund_order(amount: int, context: object) -> str:
        made.append(amount)
        return f"re_{amount}"

    key = new_key()
    approvals.request(key, tool=refund_order, args={"amount": 30}, ledger=ledger)
    approvals.approve(key, by="ana", ledger=ledger)
    with tool_call(*key):
        assert refund_order(30, context=object()) == "re_30"
    assert made == [30]


def test_state_says_when_a_call_waits_for_its_first_decision(ledger: Ledger) -> None:
    """A framework that hands its human's answer back after a restart asks ``state`` whether the call still
    waits for its first decision: once decided, run, or in doubt after a run, it does not, so an answer handed
    back twice never approves a second run."""
    refunds, key = Refunds(ledger), new_key()
    assert approvals.state(key, ledger=ledger) is None
    asked(refunds, key)
    waiting = approvals.state(key, ledger=ledger)
    assert waiting is not None and waiting.waiting and waiting.status is Status.PAUSED
    approvals.approve(key, by="ana", ledger=ledger)
    decided = approvals.state(key, ledger=ledger)
    assert decided is not None and not decided.waiting and decided.decision is not None
    assert decided.decision.by == "ana"
    refunds.call(key)
    done = approvals.state(key, ledger=ledger)
    assert done is not None and done.status is Status.COMPLETED and not done.waiting and not done.requested
    refund_order, in_doubt, _ = interrupted_on_its_approval(ledger)
    with tool_call(*in_doubt), pytest.raises(ApprovalRequiredError):
        refund_order(30)
    again = approvals.state(in_doubt, ledger=ledger)
    assert again is not None and again.may_have_run and not again.waiting


# --- an answer handed back: decided once (approve(answer=...)) ------------------------------------------


def test_an_answer_handed_back_after_its_approval_expired_does_not_renew_it(
    ledger: Ledger, events: list[Event]
) -> None:
    """A framework hands its human's answer back after a restart (LangGraph's ``interrupt()``): recorded again
    under the same answer id, it decides nothing, so the expired approval stays expired; a new answer runs."""
    refunds, key = Refunds(ledger), new_key()
    with SteppedClock() as clock:
        asked(refunds, key)
        first = approvals.approve(key, by="ana", expires_in=60, ledger=ledger, answer="interrupt-1")
        clock.advance(61)
        with pytest.raises(ApprovalExpiredError):
            refunds.call(key)
        again = approvals.approve(key, by="ana", expires_in=60, ledger=ledger, answer="interrupt-1")
        assert (again.attempt, again.result) == (first.attempt, first.result)  # nothing written
        with pytest.raises(ApprovalExpiredError):
            refunds.call(key)
        assert refunds.made == []
        approvals.approve(key, by="ana", expires_in=60, ledger=ledger, answer="interrupt-2")
        assert refunds.call(key) == "re_A1_30"
    assert refunds.made == [("A1", 30)]
    assert [e.kind for e in events].count(EventKind.APPROVED) == 2
    with pytest.raises(ValueError, match="not paused"):  # finished: no answer decides it any more
        approvals.approve(key, by="ana", ledger=ledger, answer="interrupt-1")


def test_an_answer_handed_back_after_its_run_stopped_in_doubt_does_not_run_it_again(ledger: Ledger) -> None:
    """The answer that approved a run that stopped in doubt, handed back: not a new approval (the call keeps
    waiting for one, on every later look), even after the record went through the run and its pause."""
    refund_order, key, made = interrupted_on_its_approval(ledger, answer="first")
    in_doubt = approvals.approve(key, by="ana", ledger=ledger, answer="first")  # the in-doubt record, as it is
    assert in_doubt.status is Status.IN_DOUBT
    for _ in range(2):
        approvals.approve(key, by="ana", ledger=ledger, answer="first")  # paused for a new decision: none made
        with tool_call(*key), pytest.raises(ApprovalRequiredError) as refused:
            refund_order(30)
        assert refused.value.may_have_run is True
    assert made == [30]
    status, state = state_of(ledger, key)
    assert status is Status.PAUSED and state.answers == ("first",) and state.decision is None


def test_an_answer_a_call_raised_on_does_not_approve_its_retry(ledger: Ledger, events: list[Event]) -> None:
    """A run that raised (an error not recorded) on its approval is kept paused, keeping the ids of the answers it
    ran on: the same answer handed back (LangGraph's ``interrupt()`` on a retried task) decides nothing, so one
    answer is one run; the retry runs on a new answer, and the approver is told the first may have taken effect."""
    made: list[int] = []
    AMOUNT = 987654321  # noqa: N806  # an argument value no message may carry (nine digits: not in a hex digest)

    @replay_safe(ledger=ledger, needs_approval=True)
    def refund_order(amount: int) -> str:
        made.append(amount)  # the side effect, then the error: the provider charged, then timed out
        if len(made) == 1:
            raise TimeoutError("the provider timed out")
        return "ok"

    key = new_key()
    with tool_call(*key), pytest.raises(ApprovalRequiredError) as first:
        refund_order(AMOUNT)
    approvals.approve(key, by="ana", ledger=ledger, answer="interrupt-1")
    with tool_call(*key), pytest.raises(TimeoutError):
        refund_order(AMOUNT)
    status, state = state_of(ledger, key)
    assert status is Status.PAUSED and state.answers == ("interrupt-1",) and state.may_have_run
    [raised] = [e for e in events if e.kind is EventKind.APPROVAL_REQUESTED and "TimeoutError" in e.message]
    assert raised.key == key and "may have happened" in raised.message and str(AMOUNT) not in raised.message
    for _ in range(2):
        approvals.approve(key, by="ana", ledger=ledger, answer="interrupt-1")  # handed back: decides nothing
        with tool_call(*key), pytest.raises(ApprovalRequiredError) as refused:
            refund_order(AMOUNT)
        assert refused.value.may_have_run is True
        # The question names the paused record's attempt: another than the first question's (an answer to
        # that one, handed back, cannot pass for an answer to this one).
        paused = ledger.get(key)
        assert paused is not None and refused.value.attempt == paused.attempt != first.value.attempt
    assert first.value.attempt is not None
    assert made == [AMOUNT]
    approvals.approve(key, by="ana", ledger=ledger, answer="interrupt-2")
    with tool_call(*key):
        assert refund_order(AMOUNT) == "ok"
    assert made == [AMOUNT, AMOUNT]


def test_a_rerun_by_hand_of_a_call_decided_on_answers_waits_for_a_new_one(ledger: Ledger) -> None:
    """``resolve(rerun=True)`` of a call in doubt on an approval: it runs again, on a new decision; the answer it
    ran on, handed back, is not one (removed, the record would have forgotten it)."""
    refund_order, key, made = interrupted_on_its_approval(ledger, answer="first")
    settled = ledger.resolve(key, rerun=True)
    assert settled is not None and settled.status is Status.PAUSED
    status, state = state_of(ledger, key)
    assert status is Status.PAUSED
    assert state.answers == ("first",) and state.decision is None and state.spent is None
    approvals.approve(key, by="ana", ledger=ledger, answer="first")
    with tool_call(*key), pytest.raises(ApprovalRequiredError):
        refund_order(30)
    assert made == [30]
    approvals.approve(key, by="ana", ledger=ledger, answer="second")
    with tool_call(*key), pytest.raises(Interrupted):
        refund_order(30)
    assert made == [30, 30]


def test_a_rejection_handed_back_does_not_undo_a_later_approval(ledger: Ledger) -> None:
    refunds, key = Refunds(ledger), new_key()
    asked(refunds, key)
    approvals.reject(key, by="ana", reason="wrong order", ledger=ledger, answer="no")
    approvals.approve(key, by="ben", ledger=ledger, answer="yes")
    approvals.reject(key, by="ana", reason="wrong order", ledger=ledger, answer="no")  # handed back
    assert refunds.call(key) == "re_A1_30"
    assert refunds.made == [("A1", 30)]


@pytest.mark.parametrize("answer", ["", 7])
def test_an_answer_id_is_a_non_empty_str(ledger: Ledger, answer: Any) -> None:
    refunds, key = Refunds(ledger), new_key()
    asked(refunds, key)
    with pytest.raises(ValueError, match="answer="):
        approvals.approve(key, by="ana", ledger=ledger, answer=answer)
    with pytest.raises(ValueError, match="answer="):
        approvals.reject(key, by="ana", reason="no", ledger=ledger, answer=answer)
