"""10xGraph runs SIGKILLed in a child process and resumed in new ones, through its own PgCheckpointer."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replaysafe import CallKey, Record, Status, open_ledger
from replaysafe_tenxgraph import PAUSE_REASON

from conftest import POSTGRES_URL
from tenxgraph_scenario import REFUND_OUTPUT, Spec, lines, refund_effects

CHILD = Path(__file__).with_name("tenxgraph_child.py")
MODES = ["invoke", "astream"]


def start(spec: Spec) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), json.dumps(dataclasses.asdict(spec))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(spec: Spec) -> tuple[int, dict[str, Any], str]:
    """Run the child to its end: (exit code, the thread's tool results and pending interrupt, stderr)."""
    child = start(spec)
    try:
        out, err = child.communicate(timeout=240)
    finally:
        child.kill()
    return child.returncode, (json.loads(out) if child.returncode == 0 else {}), err


def records(spec: Spec) -> list[Record]:
    ledger = open_ledger(spec.ledger_url)
    try:
        return list(ledger.records())
    finally:
        ledger.close()


def crash(spec: Spec) -> None:
    code, _, err = run(dataclasses.replace(spec, first=True))
    assert code == -signal.SIGKILL, err


def ok(spec: Spec) -> dict[str, Any]:
    code, outcome, err = run(dataclasses.replace(spec, first=False))
    assert code == 0, err
    return outcome


def done(spec: Spec) -> list[dict[str, Any]]:
    """Resume the thread to its end; its tool results."""
    outcome = ok(spec)
    assert outcome["interrupt"] is None
    results: list[dict[str, Any]] = outcome["results"]
    return results


@pytest.mark.parametrize("mode", MODES)
def test_a_crash_inside_the_tool_is_in_doubt_and_raise_pauses_the_run_until_it_is_settled(
    mode: str, make_spec: Callable[..., Spec]
) -> None:
    """SIGKILL inside refund_order; resumed with in_doubt="raise", the run pauses instead of refunding again.

    The operator records the refund the provider confirms; resuming the pause replays that result.
    """
    spec = make_spec(mode=mode)
    crash(dataclasses.replace(spec, kill="in_tool"))
    assert len(refund_effects(spec.effects)) == 1

    paused = ok(dataclasses.replace(spec, in_doubt="raise"))

    assert len(refund_effects(spec.effects)) == 1  # the refund did not run again
    assert paused["results"] == []  # nothing reached the model
    pause = paused["interrupt"]
    assert pause["reason"] == PAUSE_REASON
    assert pause["tool_call_id"] == "call_1"
    assert "is in doubt" in pause["message"]
    assert "replaysafe ledger resolve" in pause["message"]  # the message names the next step
    assert pause["value"]["error"] == "CallInDoubtError"
    [record] = records(spec)
    assert record.status is not Status.COMPLETED
    assert record.owner not in pause["message"]  # the dead owner's host and pid are an operator's, not the model's
    assert pause["value"] == {
        "error": "CallInDoubtError",
        "tool_name": "refund_order",
        "thread_id": spec.thread_id,
        "message_id": record.key.message_id,
        "tool_call_id": "call_1",
    }

    ledger = open_ledger(spec.ledger_url)
    try:
        ledger.resolve(record.key, result=REFUND_OUTPUT)  # the provider says the refund went through
    finally:
        ledger.close()
    results = done(dataclasses.replace(spec, resume=True))

    assert len(refund_effects(spec.effects)) == 1
    assert results == [{"call_id": "call_1", "output": REFUND_OUTPUT, "is_error": False}]


@pytest.mark.parametrize("mode", MODES)
def test_a_refused_call_resumed_without_settling_reaches_the_model_as_a_failed_tool_result(
    mode: str, make_spec: Callable[..., Spec]
) -> None:
    """Resuming the pause without resolving the ledger: the model is told, and the tool still does not run."""
    spec = make_spec(mode=mode, in_doubt="raise")
    crash(dataclasses.replace(spec, kill="in_tool"))
    assert ok(spec)["interrupt"]["reason"] == PAUSE_REASON

    [result] = done(dataclasses.replace(spec, resume=True))

    assert len(refund_effects(spec.effects)) == 1
    assert result["is_error"] is True
    assert "is in doubt" in result["output"]


@pytest.mark.parametrize("mode", MODES)
def test_a_crash_inside_the_tool_reruns_it_by_default_with_the_same_idempotency_key(
    mode: str, make_spec: Callable[..., Spec]
) -> None:
    """The default policy runs the in-doubt refund again, as attempt 2, under the same idempotency key."""
    spec = make_spec(mode=mode)
    crash(dataclasses.replace(spec, kill="in_tool"))

    results = done(spec)

    first, second = refund_effects(spec.effects)
    assert first.startswith("refund A1 attempt=1 key=rs-")
    key = first.rsplit("key=", 1)[1]
    assert second == f"refund A1 attempt=2 key={key}"
    assert results == [{"call_id": "call_1", "output": REFUND_OUTPUT, "is_error": False}]
    [record] = records(spec)
    assert (record.status, record.attempt) == (Status.COMPLETED, 2)


@pytest.mark.parametrize("variant", ["adapter", "unprotected"])
@pytest.mark.parametrize("mode", MODES)
def test_a_crash_after_the_tool_returned_does_not_run_it_again(
    mode: str, variant: str, make_spec: Callable[..., Spec]
) -> None:
    """SIGKILL once the ToolNode got the refund's result; the resumed run replays it.

    Without the adapter the refund runs twice: under ``ainvoke`` the kill lands in the gap before
    10xGraph's own ledger records the call, and under ``astream`` 10xGraph has no ledger at all.
    """
    spec = make_spec(mode=mode, variant=variant)
    crash(dataclasses.replace(spec, kill="after_tool"))
    assert len(refund_effects(spec.effects)) == 1

    results = done(spec)

    assert len(refund_effects(spec.effects)) == (1 if variant == "adapter" else 2)
    assert results == [{"call_id": "call_1", "output": REFUND_OUTPUT, "is_error": False}]
    if variant == "adapter":
        [record] = records(spec)
        assert (record.status, record.attempt, record.tool_name) == (Status.COMPLETED, 1, "refund_order")
        assert record.key == CallKey(spec.thread_id, record.key.message_id, "call_1")
        assert record.key.message_id  # the assistant message's id, stored with the thread's state


@pytest.mark.parametrize(("variant", "refunds"), [("adapter", 1), ("unprotected", 2)])
def test_two_workers_resuming_one_thread_run_the_tool_once(
    variant: str, refunds: int, make_spec: Callable[..., Spec], schema: str, tmp_path: Path
) -> None:
    """Two processes resume the same crashed thread at once, on a shared Postgres ledger."""
    spec = make_spec(
        variant=variant,
        # 10xGraph names its own ledger table tool_executions too: replaysafe takes another name.
        ledger_url=f"{POSTGRES_URL}?schema={schema}&table=replaysafe_calls",
        arrivals=str(tmp_path / "arrivals.txt"),
        seen=str(tmp_path / "seen.txt"),
    )
    crash(dataclasses.replace(spec, kill="before_tool"))  # the model's message is saved; no tool ran
    Path(spec.arrivals or "").unlink()

    workers = [start(dataclasses.replace(spec, first=False)) for _ in range(2)]
    outcomes = []
    for worker in workers:
        try:
            outcomes.append(worker.communicate(timeout=240))
        finally:
            worker.kill()

    assert len(refund_effects(spec.effects)) == refunds
    assert len(lines(spec.arrivals or "")) == 2  # both workers reached the ToolNode
    # Both ToolNodes got the refund's result: one ran it, the other waited for its record.
    assert lines(spec.seen or "") == [REFUND_OUTPUT, REFUND_OUTPUT]
    # The worker that writes the thread's state second loses 10xGraph's versioned write, after its
    # ToolNode finished: that is 10xGraph protecting the state, as replaysafe protects the refund.
    assert any(worker.returncode == 0 for worker in workers), [err for _, err in outcomes]
    for worker, (_, err) in zip(workers, outcomes, strict=True):
        assert worker.returncode == 0 or "StaleStateError" in err, err
    if variant == "adapter":
        [record] = records(spec)
        assert (record.status, record.attempt) == (Status.COMPLETED, 1)
