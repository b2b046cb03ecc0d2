"""Undo (issue #32 §4): ``@replay_safe(undo=...)``, ``ledger.undo(key)``, ``replaysafe.aundo`` and
``replaysafe ledger undo``: a completed call's compensation runs once, recorded under a key of its own.

The decisions (``judge_undo``, ``plan_undo``) are tested directly; the rest on every ledger, the CLI in a
real process, and a compensation killed mid-run (SIGKILL) resumed in a new process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import replaysafe
from replaysafe import (
    CallKey,
    Event,
    EventKind,
    InvalidCallIdError,
    Ledger,
    MemoryLedger,
    Record,
    ReplayMismatchError,
    Status,
    current_call,
    replay_safe,
    tool_call,
)
from replaysafe._identity import call_idempotency_key
from replaysafe._keys import reserved_id, step_key, step_parent, undo_key, undone_call
from replaysafe._owners import owner_token
from replaysafe._undo import Planned, UndoVerdict, judge_undo, plan_undo, steps_of

from .cli import subprocess_cli
from .conftest import DURABLE_BACKENDS
from .ledgers.conftest import BACKENDS

CHILD = str(Path(__file__).with_name("undo_child.py"))
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(params=list(BACKENDS))
def ledger_url(request: pytest.FixtureRequest) -> str:
    """Every ledger, as the ledger suite has them: the backends, PostgreSQL on asyncpg, and the tiered ledger."""
    return BACKENDS[request.param](request)


@pytest.fixture(params=DURABLE_BACKENDS)
def durable_ledger_url(request: pytest.FixtureRequest) -> str:
    """Each ledger that survives a process, for the tests that kill one: a crash test per backend (the
    drivers of one backend, asyncpg and the tiered ledger, are proven by the in-process tests above)."""
    return BACKENDS[request.param](request)


@pytest.fixture(params=["sqlite", "redis"])
def cli_ledger_url(request: pytest.FixtureRequest) -> str:
    """The command's own path is the same on every ledger (the in-process tests prove undo on each): a file
    ledger and a server one, each command a real new process."""
    return BACKENDS[request.param](request)


def unique(name: str) -> str:
    """A tool name of this test's own: the registry of compensations is by tool name, for the whole process."""
    return f"{name}_{uuid.uuid4().hex[:8]}"


def new_key() -> CallKey:
    return CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")


# --- keys ---------------------------------------------------------------------------------------------


def test_the_undo_key_is_the_calls_with_a_reserved_suffix_and_never_a_steps() -> None:
    key = CallKey("thread-1", "msg_1", "call_1")
    undo = undo_key(key)
    assert undo == CallKey("thread-1", "msg_1", "call_1>#undo")
    assert undone_call(undo) == key and undone_call(key) is None
    # Never a step's key, whatever the step's name: a step's id ends in #<n>.
    assert step_parent(undo, "") is None and step_parent(undo, "#undo") is None
    assert all(step_key(key, name, 1) != undo for name in ("", "#undo", "undo", ">"))
    # The undo of a step, and the steps made inside an undo, have keys of their own.
    step = step_key(key, "charge", 1)
    assert undo_key(step) == CallKey("thread-1", "msg_1", "call_1>charge#1>#undo")
    assert step_parent(step_key(undo, "charge", 1), "charge") == undo


def test_tool_call_refuses_an_id_of_the_undo_form() -> None:
    """A framework's id can never be an undo's: ``tool_call`` refuses it, naming the form."""
    assert reserved_id(CallKey("t", "m", "call_1>#undo")) is not None
    with pytest.raises(InvalidCallIdError, match="undo"):
        tool_call("t", "m", "call_1>#undo")
    assert reserved_id(CallKey("t", "m", "call_1>#undone")) is None
    assert reserved_id(CallKey("t", "m", "call_1#undo")) is None


# --- decisions, without I/O ---------------------------------------------------------------------------


def record(
    status: Status,
    *,
    key: CallKey | None = None,
    tool: str = "refund",
    owner: str = "elsewhere:1:1#1",
    lease: timedelta = timedelta(seconds=-1),
    created: datetime = NOW,
) -> Record:
    return Record(key or CallKey("t", "m", "c"), tool, "0" * 64, status, None, owner, 1, created, created, NOW + lease)


def alive(owner: str) -> bool | None:
    return owner == "live"


@pytest.mark.parametrize(
    ("status", "owner", "lease", "force", "verdict"),
    [
        (Status.COMPLETED, "x", timedelta(0), False, UndoVerdict.UNDO),
        (Status.COMPLETED, "x", timedelta(0), True, UndoVerdict.UNDO),
        (Status.FAILED, "x", timedelta(0), False, UndoVerdict.NOTHING),
        (Status.FAILED, "x", timedelta(0), True, UndoVerdict.NOTHING),
        (Status.RUNNING, "live", timedelta(0), False, UndoVerdict.RUNNING),
        (Status.RUNNING, "other-machine", timedelta(minutes=5), False, UndoVerdict.RUNNING),  # the lease decides
        (Status.RUNNING, "other-machine", timedelta(minutes=-5), False, UndoVerdict.IN_DOUBT),
        (Status.RUNNING, "live", timedelta(0), True, UndoVerdict.FORCED),
        (Status.IN_DOUBT, "x", timedelta(0), False, UndoVerdict.IN_DOUBT),
        (Status.IN_DOUBT, "x", timedelta(0), True, UndoVerdict.FORCED),
        (Status.PAUSED, "x", timedelta(0), False, UndoVerdict.PAUSED),
        (Status.PAUSED, "x", timedelta(0), True, UndoVerdict.FORCED),
    ],
)
def test_judge_undo(status: Status, owner: str, lease: timedelta, force: bool, verdict: UndoVerdict) -> None:
    def owner_alive(token: str) -> bool | None:
        return True if token == "live" else None  # elsewhere: the lease decides

    assert judge_undo(record(status, owner=owner, lease=lease), NOW, owner_alive, force) is verdict


def _undoers(*names: str) -> Callable[[str], Any]:
    """A registry holding a stand-in compensation for each of ``names``."""
    return lambda name: ("undoer", name) if name in names else None


def test_plan_undo_refuses_a_missing_record_naming_the_key() -> None:
    key = CallKey("thread-9", "msg_9", "call_9")
    with pytest.raises(LookupError, match=r"thread-9.*nothing to undo"):
        plan_undo(None, key, [], _undoers("refund"), now=NOW, owner_alive=alive, force=True)


@pytest.mark.parametrize("force", [False, True])
def test_plan_undo_refuses_a_failed_call_even_forced(force: bool) -> None:
    failed = record(Status.FAILED)
    with pytest.raises(ValueError, match=r"failed.*nothing to undo"):
        plan_undo(failed, failed.key, [], _undoers("refund"), now=NOW, owner_alive=alive, force=force)


@pytest.mark.parametrize(
    ("status", "owner", "words"),
    [(Status.RUNNING, "live", "still running"), (Status.IN_DOUBT, "x", "in doubt"), (Status.PAUSED, "x", "paused")],
)
def test_plan_undo_refuses_running_paused_and_in_doubt_unless_forced(status: Status, owner: str, words: str) -> None:
    held = record(status, owner=owner)
    with pytest.raises(ValueError, match=f"{words}.*--force"):
        plan_undo(held, held.key, [], _undoers("refund"), now=NOW, owner_alive=alive, force=False)
    forced = plan_undo(held, held.key, [], _undoers("refund"), now=NOW, owner_alive=alive, force=True)
    assert forced == [Planned(held, ("undoer", "refund"), with_result=False)]  # type: ignore[arg-type]


def test_plan_undo_refuses_a_tool_with_no_undo_naming_it_and_the_fix() -> None:
    done = record(Status.COMPLETED, tool="send_email")
    with pytest.raises(ValueError, match=r"'send_email'.*@replay_safe\(undo=\.\.\.\).*--app MODULE"):
        plan_undo(done, done.key, [], _undoers("refund"), now=NOW, owner_alive=alive, force=False)


def test_plan_undo_runs_steps_newest_first_then_the_parent_skipping_what_it_cannot_undo() -> None:
    parent = record(Status.COMPLETED, tool="checkout")
    charge = record(Status.COMPLETED, key=step_key(parent.key, "charge", 1), tool="charge", created=NOW)
    email = record(Status.COMPLETED, key=step_key(parent.key, "email", 1), tool="email", created=NOW + timedelta(1))
    failed = record(Status.FAILED, key=step_key(parent.key, "charge", 2), tool="charge", created=NOW + timedelta(2))
    other = record(Status.COMPLETED, key=CallKey("t", "m", "other>charge#1"), tool="charge")
    steps = steps_of(parent.key, [other, charge, email, failed, parent])
    assert steps == [failed, email, charge]
    planned = plan_undo(parent, parent.key, steps, _undoers("charge"), now=NOW, owner_alive=alive, force=False)
    assert [(p.record.tool_name, p.undoer is not None, p.note) for p in planned] == [
        ("charge", False, "it failed: nothing to undo"),
        ("email", False, "no undo is registered for 'email' in this process"),
        ("charge", True, ""),
        ("checkout", False, "no undo is registered for 'checkout' in this process"),
    ]


def test_plan_undo_refuses_a_step_in_doubt_before_anything_runs() -> None:
    parent = record(Status.COMPLETED, tool="checkout")
    step = record(Status.IN_DOUBT, key=step_key(parent.key, "charge", 1), tool="charge")
    with pytest.raises(ValueError, match=r"a step of checkout.*in doubt"):
        plan_undo(parent, parent.key, [step], _undoers("charge", "checkout"), now=NOW, owner_alive=alive, force=False)


def test_steps_of_reaches_steps_of_steps_newest_first_and_not_undo_records() -> None:
    parent = record(Status.COMPLETED, tool="outer")
    inner = record(Status.COMPLETED, key=step_key(parent.key, "inner", 1), tool="inner", created=NOW)
    deep = record(Status.COMPLETED, key=step_key(inner.key, "charge", 1), tool="charge", created=NOW + timedelta(1))
    after = record(Status.COMPLETED, key=step_key(parent.key, "email", 1), tool="email", created=NOW + timedelta(2))
    undone = record(Status.COMPLETED, key=undo_key(inner.key), tool="inner.undo", created=NOW + timedelta(3))
    in_undo = record(Status.COMPLETED, key=step_key(undo_key(inner.key), "x", 1), tool="x", created=NOW + timedelta(4))
    assert steps_of(parent.key, [parent, inner, deep, after, undone, in_undo]) == [after, deep, inner]


# --- on every ledger ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Receipt:
    id: str
    amount: float


def test_undo_runs_the_compensation_once_and_a_second_undo_replays(ledger: Ledger, events: list[Event]) -> None:
    """Handed the recorded result as a replay returns it (a dataclass rebuilt from the return annotation); inside
    it, current_call() is the undo's own call: its key, its tool name, its idempotency key."""
    seen: list[tuple[Any, Any]] = []
    name = unique("refund")

    def cancel_refund(receipt: Receipt) -> str:
        seen.append((receipt, current_call()))
        return f"cancelled {receipt.id}"

    @replay_safe(ledger=ledger, name=name, undo=cancel_refund)
    def refund(order_id: str) -> Receipt:
        return Receipt(f"re_{order_id}", 59.0)

    key = new_key()
    with tool_call(*key):
        refund("1042")
    first = ledger.undo(key)
    assert first == [replaysafe.Undone(key, name, "undone", "cancelled re_1042")]
    [(receipt, info)] = seen
    assert receipt == Receipt("re_1042", 59.0)
    assert info.key == undo_key(key) and info.tool_name == f"{name}.undo" and info.attempt == 1
    assert info.idempotency_key != call_idempotency_key(*key, name)
    again = ledger.undo(key)
    assert again == [replaysafe.Undone(key, name, "already_undone", "cancelled re_1042")]
    assert len(seen) == 1
    undone = [e for e in events if e.kind is EventKind.UNDONE]
    assert [(e.tool_name, e.key) for e in undone] == [(name, key)]
    assert "re_1042" not in undone[0].message  # never a result value in a message
    recorded = ledger.get(undo_key(key))
    assert recorded is not None and recorded.status is Status.COMPLETED and recorded.tool_name == f"{name}.undo"
    with tool_call(*key):
        assert refund("1042") == Receipt("re_1042", 59.0)  # the call itself still replays


def test_a_call_with_no_record_is_refused_naming_its_key(ledger: Ledger) -> None:
    name = unique("refund")
    replay_safe(ledger=ledger, name=name, undo=lambda receipt: None)(lambda order_id: order_id)
    key = new_key()
    with pytest.raises(LookupError, match=key.thread_id):
        ledger.undo(key)
    assert ledger.get(undo_key(key)) is None


def test_a_failed_call_has_nothing_to_undo(ledger: Ledger) -> None:
    ran: list[Any] = []
    name = unique("refund")

    @replay_safe(ledger=ledger, name=name, record_errors=True, undo=ran.append)
    def refund(order_id: str) -> str:
        raise RuntimeError("declined")

    key = new_key()
    with tool_call(*key), pytest.raises(RuntimeError):
        refund("1042")
    with pytest.raises(ValueError, match="failed"):
        ledger.undo(key, force=True)
    assert ran == [] and ledger.get(undo_key(key)) is None


def _held(ledger: Ledger, key: CallKey, name: str, status: Status) -> None:
    """A record of ``name`` under ``key``: running in this (live) process, or ended ``status``."""
    now = datetime.now(timezone.utc)
    owner = owner_token()
    found = ledger.claim(
        key, tool_name=name, args_digest="0" * 64, owner=owner, now=now, lease_expires_at=now + timedelta(minutes=5)
    )
    assert found.claimed
    if status is not Status.RUNNING:
        assert ledger.complete(key, owner=owner, status=status, result=None, now=now)


@pytest.mark.parametrize("status", [Status.RUNNING, Status.IN_DOUBT, Status.PAUSED])
def test_running_paused_or_in_doubt_is_refused_unless_forced(ledger: Ledger, status: Status) -> None:
    """Refused, nothing run nor recorded; forced, the compensation runs once, handed None (no result)."""
    ran: list[Any] = []
    name = unique("refund")
    replay_safe(ledger=ledger, name=name, undo=lambda receipt: ran.append(receipt) or "cancelled")(
        lambda order_id: order_id
    )
    key = new_key()
    _held(ledger, key, name, status)
    with pytest.raises(ValueError, match="--force") as refused:
        ledger.undo(key)
    assert name in str(refused.value) and key.thread_id in str(refused.value)
    assert ran == [] and ledger.get(undo_key(key)) is None
    assert ledger.undo(key, force=True) == [replaysafe.Undone(key, name, "undone", "cancelled")]
    assert ran == [None]
    assert ledger.undo(key, force=True)[0].outcome == "already_undone"
    assert ran == [None]


def test_a_call_with_steps_is_undone_newest_step_first_each_once(ledger: Ledger) -> None:
    order: list[str] = []
    names = {tool: unique(tool) for tool in ("charge", "ship", "email", "checkout")}

    def undo_of(tool: str) -> Callable[[Any], str]:
        def compensate(result: Any) -> str:
            order.append(f"{tool}:{result}")
            return f"undid {tool}"

        return compensate

    @replay_safe(ledger=ledger, name=names["charge"], undo=undo_of("charge"))
    def charge(order_id: str, n: int) -> str:
        return f"ch_{order_id}_{n}"

    @replay_safe(ledger=ledger, name=names["ship"], undo=undo_of("ship"))
    def ship(order_id: str) -> str:
        return f"sh_{order_id}"

    @replay_safe(ledger=ledger, name=names["email"])  # no compensation: skipped, and said so
    def email(order_id: str) -> str:
        return f"em_{order_id}"

    @replay_safe(ledger=ledger, name=names["checkout"], undo=undo_of("checkout"))
    def checkout(order_id: str) -> str:
        return " ".join([charge(order_id, 1), ship(order_id), email(order_id), charge(order_id, 2)])

    key = new_key()
    with tool_call(*key):
        checkout("1042")
    done = ledger.undo(key)
    assert order == [
        "charge:ch_1042_2",
        "ship:sh_1042",
        "charge:ch_1042_1",
        "checkout:ch_1042_1 sh_1042 em_1042 ch_1042_2",
    ]
    assert [(d.tool_name, d.key.tool_call_id, d.outcome) for d in done] == [
        (names["charge"], f"call_1>{names['charge']}#2", "undone"),
        (names["email"], f"call_1>{names['email']}#1", "skipped"),
        (names["ship"], f"call_1>{names['ship']}#1", "undone"),
        (names["charge"], f"call_1>{names['charge']}#1", "undone"),
        (names["checkout"], "call_1", "undone"),
    ]
    assert "no undo is registered" in done[1].note
    again = ledger.undo(key)
    assert [d.outcome for d in again] == [
        "already_undone",
        "skipped",
        "already_undone",
        "already_undone",
        "already_undone",
    ]
    assert len(order) == 4


def test_an_undo_recorded_for_another_result_of_the_call_is_refused(ledger: Ledger) -> None:
    """The call deleted and run again: the undo recorded for its first result must not replay for the second."""
    ran: list[Any] = []
    results = iter(["re_1", "re_2"])
    name = unique("refund")

    @replay_safe(ledger=ledger, name=name, undo=ran.append)
    def refund(order_id: str) -> str:
        return next(results)

    key = new_key()
    with tool_call(*key):
        refund("1042")
    ledger.undo(key)
    ledger.delete(key)
    with tool_call(*key):
        refund("1042")
    with pytest.raises(ReplayMismatchError, match="another result") as refused:
        ledger.undo(key)
    assert "re_" not in str(refused.value)
    assert ran == ["re_1"]
    ledger.delete(undo_key(key))
    ledger.undo(key)
    assert ran == ["re_1", "re_2"]


def test_a_compensation_that_raises_is_not_recorded_and_runs_again_on_the_next_undo(ledger: Ledger) -> None:
    attempts: list[Any] = []
    name = unique("refund")

    def cancel(receipt: str) -> str:
        attempts.append(receipt)
        if len(attempts) == 1:
            raise ConnectionError("provider down")
        return "cancelled"

    tool = replay_safe(ledger=ledger, name=name, undo=cancel)(lambda order_id: "re_1")
    key = new_key()
    with tool_call(*key):
        tool("1042")
    with pytest.raises(ConnectionError):
        ledger.undo(key)
    assert ledger.get(undo_key(key)) is None
    assert ledger.undo(key)[0].outcome == "undone"
    assert attempts == ["re_1", "re_1"]


def test_a_call_whose_result_was_not_recorded_is_refused_unless_forced(ledger: Ledger) -> None:
    """Nothing to hand the compensation: refused, naming resolve; forced, it is handed None."""
    ran: list[Any] = []
    name = unique("export")

    @replay_safe(ledger=ledger, name=name, max_result_bytes=16, undo=ran.append)
    def export(order_id: str) -> str:
        return "x" * 100

    key = new_key()
    with tool_call(*key):
        export("1042")
    with pytest.raises(ValueError, match=r"not recorded.*resolve"):
        ledger.undo(key)
    assert ran == []
    assert ledger.undo(key, force=True)[0].outcome == "undone"
    assert ran == [None]


def test_on_a_signing_ledger_the_result_is_checked_and_the_undo_sealed() -> None:
    ran: list[Any] = []
    name = unique("refund")
    ledger = MemoryLedger(signing_key="k" * 32)
    tool = replay_safe(ledger=ledger, name=name, undo=lambda receipt: ran.append(receipt) or "cancelled")(
        lambda order_id: {"id": "re_1"}
    )
    key = new_key()
    with tool_call(*key):
        tool("1042")
    assert [d.outcome for d in ledger.undo(key)] == ["undone"]
    assert [d.outcome for d in ledger.undo(key)] == ["already_undone"]  # its own seal checks on replay
    assert ran == [{"id": "re_1"}]
    undo_record = ledger.get(undo_key(key))
    assert undo_record is not None and undo_record.result is not None and undo_record.result.startswith("rs-seal-1:")


async def test_aundo_awaits_an_async_compensation_once(ledger: Ledger) -> None:
    seen: list[Any] = []
    name = unique("refund")

    async def cancel_refund(receipt: dict[str, str]) -> str:
        seen.append((receipt, current_call().key))
        return "cancelled"

    @replay_safe(ledger=ledger, name=name, undo=cancel_refund)
    async def refund(order_id: str) -> dict[str, str]:
        return {"id": f"re_{order_id}"}

    key = new_key()
    with tool_call(*key):
        await refund("1042")
    with pytest.raises(TypeError, match="aundo"):
        ledger.undo(key)  # a sync undo cannot await it: refused before anything runs
    assert seen == [] and ledger.get(undo_key(key)) is None
    assert await replaysafe.aundo(ledger, key) == [replaysafe.Undone(key, name, "undone", "cancelled")]
    assert await replaysafe.aundo(ledger, key) == [replaysafe.Undone(key, name, "already_undone", "cancelled")]
    assert seen == [({"id": "re_1042"}, undo_key(key))]


async def test_aundo_runs_a_sync_compensation_in_a_thread_with_its_current_call(ledger: Ledger) -> None:
    seen: list[Any] = []
    name = unique("refund")
    key = new_key()
    tool = replay_safe(ledger=ledger, name=name, undo=lambda receipt: seen.append(current_call().key) or "ok")(
        lambda order_id: "re_1"
    )
    with tool_call(*key):
        tool("1042")
    assert [d.outcome for d in await replaysafe.aundo(ledger, key)] == ["undone"]
    assert seen == [undo_key(key)]


# --- the CLI, in a real process -----------------------------------------------------------------------


APP = """
    import os

    from child import append

    from replaysafe import current_call, open_ledger, replay_safe

    ledger = open_ledger(os.environ["UNDO_APP_LEDGER"])


    {kind}def cancel_refund(receipt):
        append(os.environ["UNDO_APP_EFFECTS"], "cancel " + receipt["id"] + " " + current_call().idempotency_key)
        return "cancelled"


    @replay_safe(ledger=ledger, name="{name}", undo=cancel_refund)
    def refund(order_id):
        append(os.environ["UNDO_APP_EFFECTS"], "refund re_" + order_id)
        return {{"id": "re_" + order_id}}
"""


@pytest.mark.parametrize("kind", ["", "async "], ids=["sync", "async"])
def test_the_cli_undoes_a_call_once_with_the_apps_compensation(cli_ledger_url: str, tmp_path: Path, kind: str) -> None:
    """`replaysafe ledger undo --app MODULE` in a new process: the compensation (sync, or async: the CLI runs
    either) runs once; without --app it is refused naming the tool and --app; show then says it was undone."""
    name, module = unique("refund"), f"undo_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(APP.format(name=name, kind=kind)))
    effects = tmp_path / "effects.log"
    env = {
        "PYTHONPATH": f"{tmp_path}:{Path(__file__).parent}",
        "UNDO_APP_LEDGER": cli_ledger_url,
        "UNDO_APP_EFFECTS": str(effects),
    }
    thread = f"t-{uuid.uuid4().hex[:8]}"
    script = (
        f"import {module}\nfrom replaysafe import tool_call\n"
        f"with tool_call({thread!r}, 'msg_1', 'call_1'):\n    {module}.refund('1042')\n"
    )
    made = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env={**_env(), **env}
    )
    assert made.returncode == 0, made.stderr
    ids = [thread, "msg_1", "call_1"]
    base = ["ledger", "--ledger", cli_ledger_url, "undo", *ids, "--yes"]

    without = subprocess_cli(*base, env=env)
    assert without.returncode == 1, without.stderr
    assert name in without.stderr and "--app" in without.stderr and "nothing was undone" in without.stderr
    assert not effects.read_text().count("cancel")

    undone = subprocess_cli(*base, "--app", module, env=env)
    assert undone.returncode == 0, undone.stderr
    assert f"undone: {name} (CALL call_1)" in undone.stdout
    again = subprocess_cli(*base, "--app", module, "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["undone"] == [
        {
            "thread_id": thread,
            "message_id": "msg_1",
            "tool_call_id": "call_1",
            "tool_name": name,
            "outcome": "already_undone",
            "note": None,
        }
    ]
    cancels = [line for line in effects.read_text().splitlines() if line.startswith("cancel")]
    assert len(cancels) == 1 and cancels[0].startswith("cancel re_1042 rs-")

    shown = subprocess_cli("ledger", "--ledger", cli_ledger_url, "show", *ids, "--json", env=env)
    assert json.loads(shown.stdout)["undone"].startswith(f"yes: its compensation {name}.undo ran")
    missing = subprocess_cli(
        "ledger", "--ledger", cli_ledger_url, "undo", thread, "msg_1", "nope", "--yes", "--app", module, env=env
    )
    assert missing.returncode == 1 and "no record" in missing.stderr
    bad = subprocess_cli(*base, "--app", "no_such_module_here", env=env)
    assert bad.returncode == 2 and "no_such_module_here" in bad.stderr


def test_the_cli_refuses_an_in_doubt_call_unless_forced(cli_ledger_url: str, tmp_path: Path) -> None:
    name, module = unique("refund"), f"undo_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(APP.format(name=name, kind="")))
    effects = tmp_path / "effects.log"
    env = {
        "PYTHONPATH": f"{tmp_path}:{Path(__file__).parent}",
        "UNDO_APP_LEDGER": cli_ledger_url,
        "UNDO_APP_EFFECTS": str(effects),
    }
    key = new_key()
    with replaysafe.open_ledger(cli_ledger_url) as ledger:
        _held(ledger, key, name, Status.IN_DOUBT)
    base = ["ledger", "--ledger", cli_ledger_url, "undo", *key, "--yes", "--app", module]
    refused = subprocess_cli(*base, env=env)
    assert refused.returncode == 1 and "in doubt" in refused.stderr and "--force" in refused.stderr
    assert not effects.exists()
    forced = subprocess_cli(*base, "--force", env=env)
    # The app's compensation reads receipt["id"]: handed None it raises, and the CLI says so by its type only.
    assert forced.returncode == 1 and "TypeError" in forced.stderr, forced.stderr


def _env() -> dict[str, str]:
    return dict(os.environ)


# --- a compensation killed mid-run ---------------------------------------------------------------------


def run_child(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, CHILD, *args], capture_output=True, text=True, timeout=120)


def effects_of(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def test_a_compensation_killed_mid_run_runs_again_once_in_a_new_process(
    durable_ledger_url: str, tmp_path: Path
) -> None:
    """In doubt (rerun, the default): the next undo runs the compensation again, as attempt 2 under the same
    idempotency key (the provider dedupes the cancel by it); the undo after that replays."""
    effects, thread = tmp_path / "effects.log", f"t-{uuid.uuid4().hex[:8]}"
    made = run_child("call", durable_ledger_url, str(effects), thread, "rerun")
    assert made.returncode == 0, made.stderr
    killed = run_child("undo", durable_ledger_url, str(effects), thread, "rerun", "inside-undo")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run_child("undo", durable_ledger_url, str(effects), thread, "rerun", "none")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == [["refund", "undone", "cancelled re_1042"]]
    again = run_child("undo", durable_ledger_url, str(effects), thread, "rerun", "none")
    assert json.loads(again.stdout) == [["refund", "already_undone", "cancelled re_1042"]]
    refund, first, second = effects_of(effects)
    assert refund[0] == "refund" and first[0] == second[0] == "cancel"
    assert first[1] == second[1] != refund[1]  # the undo's own idempotency key, the same on both attempts
    assert (first[2], second[2]) == ("1", "2")


def test_a_compensation_killed_mid_run_of_a_raise_tool_is_left_in_doubt(
    durable_ledger_url: str, tmp_path: Path
) -> None:
    """The tool's in_doubt="raise" holds for its compensation: the next undo raises CallInDoubtError, nothing runs."""
    effects, thread = tmp_path / "effects.log", f"t-{uuid.uuid4().hex[:8]}"
    assert run_child("call", durable_ledger_url, str(effects), thread, "raise").returncode == 0
    killed = run_child("undo", durable_ledger_url, str(effects), thread, "raise", "inside-undo")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run_child("undo", durable_ledger_url, str(effects), thread, "raise", "none")
    assert resumed.returncode == 1 and "CallInDoubtError" in resumed.stderr
    assert [e[0] for e in effects_of(effects)] == ["refund", "cancel"]


def test_ledger_undo_is_on_the_ledger_protocol() -> None:
    assert callable(MemoryLedger().undo)
    assert "undo" in dir(Ledger)
