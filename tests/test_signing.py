"""Tamper-evident records: a forged or altered record is never returned as a result."""

from __future__ import annotations

import hmac
import sqlite3
import types
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from psycopg import sql

from replaysafe import (
    CallKey,
    Event,
    EventKind,
    MemoryLedger,
    Record,
    RecordedToolError,
    ReplayMismatchError,
    SqliteLedger,
    Status,
    TamperedRecordError,
    _sealing,
    on_event,
    open_ledger,
    replay_safe,
    tool_call,
)
from replaysafe.ledgers import Ledger

from . import servers

KEY_A = "a-signing-key-of-32-bytes-000000"
KEY_B = "b-signing-key-of-32-bytes-111111"
NOW = datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc)
Tamper = Callable[[Ledger, CallKey, dict[str, Any]], None]


def tamper_sqlite(ledger: Ledger, key: CallKey, fields: dict[str, Any]) -> None:
    """Write straight into the SQLite file, as anyone with access to it could."""
    assert isinstance(ledger, SqliteLedger)
    with closing(sqlite3.connect(ledger.path)) as db, db:
        for column, value in fields.items():
            db.execute(
                f"UPDATE tool_executions SET {column} = ? WHERE thread_id = ? AND message_id = ? AND tool_call_id = ?",
                (value, *key),
            )


def tamper_memory(ledger: Ledger, key: CallKey, fields: dict[str, Any]) -> None:
    """Replace the record in the memory ledger's own store."""
    assert isinstance(ledger, MemoryLedger)
    changes = {("status" if k == "status" else k): (Status(v) if k == "status" else v) for k, v in fields.items()}
    ledger._records[key] = ledger._records[key]._replace(**changes)


def tamper_postgres(server_url: str) -> Tamper:
    def tamper(ledger: Ledger, key: CallKey, fields: dict[str, Any]) -> None:
        """UPDATE the row with a plain psycopg connection, as a database user could."""
        table = sql.Identifier(ledger.table.schema, ledger.table.name)  # type: ignore[attr-defined]
        with psycopg.connect(servers.libpq_url(server_url), autocommit=True) as db:
            for column, value in fields.items():
                db.execute(
                    sql.SQL(
                        "UPDATE {} SET {} = %s WHERE thread_id = %s AND message_id = %s AND tool_call_id = %s"
                    ).format(table, sql.Identifier(column)),
                    (value, *key),
                )

    return tamper


def tamper_redis(server_url: str) -> Tamper:
    def tamper(ledger: Ledger, key: CallKey, fields: dict[str, Any]) -> None:
        """Rewrite the record's packed value with a plain client, as anyone with access to Redis could."""
        from replaysafe.ledgers.redis import _pack, _unpack

        client = redis.Redis.from_url(server_url)
        name = ledger._ops.keys(key)[0]  # type: ignore[attr-defined]
        try:
            record = _unpack(key, client.get(name))  # type: ignore[arg-type]
            if "status" in fields:
                fields = {**fields, "status": Status(fields["status"])}
            client.set(name, _pack(record._replace(**fields)), keepttl=True)
        finally:
            client.close()

    return tamper


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis"])
def signed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Ledger, Tamper, Callable[..., Ledger]]]:
    """A signing ledger, a way to alter its store directly, and a way to reopen it with other keys."""
    if request.param == "memory":
        memory = MemoryLedger(signing_key=KEY_A)

        def reopen_memory(signing_key: Any) -> Ledger:
            memory.sealer = MemoryLedger(signing_key=signing_key).sealer
            return memory

        yield memory, tamper_memory, reopen_memory
        return
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'signed.db'}"
        tamper = tamper_sqlite
    else:
        url = request.getfixturevalue(f"{request.param}_url")
        server = request.getfixturevalue(f"{request.param}_server_url")
        tamper = tamper_postgres(server) if request.param == "postgres" else tamper_redis(server)
    opened: list[Ledger] = []

    def reopen(signing_key: Any) -> Ledger:
        opened.append(open_ledger(url, signing_key=signing_key))
        return opened[-1]

    yield reopen(KEY_A), tamper, reopen
    for ledger in opened:
        ledger.close()


def refund(ledger: Ledger, runs: list[str]) -> Any:
    @replay_safe(ledger=ledger, record_errors=True)
    def refund_order(order_id: str) -> str:
        runs.append(order_id)
        if order_id == "bad":
            raise ValueError("declined")
        return f"refunded {order_id}"

    return refund_order


def new_key() -> CallKey:
    return CallKey(f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")


def test_sealed_records_replay(signed: Any) -> None:
    """With a signing key, results are stored sealed and replay as usual."""
    ledger, _, _ = signed
    runs: list[str] = []
    key = new_key()
    for _ in range(2):
        with tool_call(*key):
            assert refund(ledger, runs)("1") == "refunded 1"
    assert runs == ["1"]
    record = ledger.get(key)
    assert record is not None
    assert record.result.startswith("rs-seal-1:")


def test_an_altered_result_is_refused(signed: Any) -> None:
    """A result changed in the store raises TamperedRecordError (and an event); nothing runs."""
    ledger, tamper, _ = signed
    runs: list[str] = []
    key = new_key()
    with tool_call(*key):
        refund(ledger, runs)("1")
    record = ledger.get(key)
    assert record is not None
    forged = record.result.replace("refunded 1", "refunded 9")
    tamper(ledger, key, {"result": forged})
    seen: list[Event] = []
    stop = on_event(seen.append)
    try:
        with tool_call(*key), pytest.raises(TamperedRecordError) as raised:
            refund(ledger, runs)("1")
    finally:
        stop()
    assert key.thread_id in str(raised.value)
    assert runs == ["1"]
    assert [e.kind for e in seen] == [EventKind.TAMPERED]


def test_a_forged_unsealed_result_is_refused(signed: Any) -> None:
    """Plain JSON written by someone without the key is refused."""
    ledger, tamper, _ = signed
    runs: list[str] = []
    key = new_key()
    with tool_call(*key):
        refund(ledger, runs)("1")
    tamper(ledger, key, {"result": '"refund done (forged)"'})
    with tool_call(*key), pytest.raises(TamperedRecordError, match="without a seal"):
        refund(ledger, runs)("1")


class NeedsApproval(Exception):
    """A pause: the tool stops for a human."""


def approval_gated(ledger: Ledger, runs: list[str], approved: list[bool]) -> Any:
    @replay_safe(ledger=ledger, pause_on=NeedsApproval, in_doubt="raise")
    def refund_order(order_id: str) -> str:
        if not approved:
            raise NeedsApproval(order_id)
        runs.append(order_id)
        return f"refunded {order_id}"

    return refund_order


def test_a_paused_record_is_sealed_and_resumes(signed: Any) -> None:
    """A pause is sealed like a finished record; the approved resume checks it and runs the tool once."""
    ledger, _, _ = signed
    runs: list[str] = []
    approved: list[bool] = []
    key = new_key()
    with tool_call(*key), pytest.raises(NeedsApproval):
        approval_gated(ledger, runs, approved)("1")
    paused = ledger.get(key)
    assert paused is not None
    assert paused.status is Status.PAUSED
    assert paused.result is not None and paused.result.startswith("rs-seal-1:")
    approved.append(True)
    with tool_call(*key):
        assert approval_gated(ledger, runs, approved)("1") == "refunded 1"
    assert runs == ["1"]


@pytest.mark.parametrize(
    "forgery",
    [
        pytest.param({"status": "paused"}, id="completed-flipped-to-paused"),
        pytest.param({"status": "paused", "result": None}, id="completed-replaced-by-an-unsealed-pause"),
    ],
)
def test_a_completed_call_forged_paused_is_refused_and_never_runs_again(signed: Any, forgery: dict[str, Any]) -> None:
    """A store writer who marks a completed call paused would make the next replay run the tool again without
    asking the in-doubt policy (here "raise"): the pause's seal does not check, so nothing runs."""
    ledger, tamper, _ = signed
    runs: list[str] = []
    approved = [True]
    key = new_key()
    with tool_call(*key):
        assert approval_gated(ledger, runs, approved)("1") == "refunded 1"
    tamper(ledger, key, forgery)
    seen: list[Event] = []
    unsubscribe = on_event(seen.append)
    try:
        with tool_call(*key), pytest.raises(TamperedRecordError, match="fails its seal check"):
            approval_gated(ledger, runs, approved)("1")
    finally:
        unsubscribe()
    assert runs == ["1"]
    assert [event.kind for event in seen] == [EventKind.TAMPERED]
    stored = ledger.get(key)
    assert stored is not None
    assert stored.status is Status.PAUSED  # left as found, for an operator to inspect


def stepped(ledger: Ledger, runs: list[str], step: str, interrupt: bool) -> Any:
    """A call with one step (named ``step``); with ``interrupt``, interrupted after it: left in doubt."""

    @replay_safe(ledger=ledger, name=step)
    def charge(order_id: str) -> str:
        runs.append(step)
        return f"ch_{order_id}"

    @replay_safe(ledger=ledger)
    def checkout(order_id: str) -> str:
        charged = charge(order_id)
        if interrupt:
            raise KeyboardInterrupt
        return charged

    return checkout


def test_the_steps_kept_in_an_in_doubt_record_are_sealed_and_checked(signed: Any) -> None:
    """An in-doubt record that keeps its call's steps is sealed like a finished one: a renamed step is
    refused against it, and a list of steps rewritten without the key is refused before anything runs."""
    ledger, tamper, _ = signed
    runs: list[str] = []
    key = new_key()
    with tool_call(*key), pytest.raises(KeyboardInterrupt):
        stepped(ledger, runs, "charge", interrupt=True)("1")
    kept = ledger.get(key)
    assert kept is not None and kept.status is Status.IN_DOUBT
    assert kept.result is not None and kept.result.startswith("rs-seal-1:") and kept.result.endswith('["charge"]')
    with tool_call(*key), pytest.raises(ReplayMismatchError, match="'charge'"):
        stepped(ledger, runs, "capture", interrupt=False)("1")
    tamper(ledger, key, {"result": 'rs-steps-1:["capture"]'})  # as if capture had been the step there
    with tool_call(*key), pytest.raises(TamperedRecordError, match="without a seal"):
        stepped(ledger, runs, "capture", interrupt=False)("1")
    assert runs == ["charge"]


def test_a_status_flip_is_refused(signed: Any) -> None:
    """Turning a recorded failure into a success breaks the seal (status is covered)."""
    ledger, tamper, _ = signed
    runs: list[str] = []
    key = new_key()
    with tool_call(*key), pytest.raises(ValueError, match="declined"):
        refund(ledger, runs)("bad")
    tamper(ledger, key, {"status": "completed"})
    with tool_call(*key), pytest.raises(TamperedRecordError):
        refund(ledger, runs)("bad")


def test_a_seal_moved_to_another_call_is_refused(signed: Any) -> None:
    """A valid sealed result copied onto another key does not check (the key is covered)."""
    ledger, tamper, _ = signed
    runs: list[str] = []
    one, two = new_key(), new_key()
    with tool_call(*one):
        refund(ledger, runs)("1")
    with tool_call(*two):
        refund(ledger, runs)("1")
    sealed = ledger.get(one).result  # type: ignore[union-attr]
    tamper(ledger, two, {"result": sealed})
    with tool_call(*two), pytest.raises(TamperedRecordError):
        refund(ledger, runs)("1")


@pytest.mark.parametrize("status", ["completed", "failed"])
def test_a_finished_record_without_result_or_seal_is_refused(signed: Any, status: str) -> None:
    """A call marked finished with a NULL result, straight in the store, is tampering: the tool is not
    skipped with ``None`` handed to the caller, nor a failure replayed; nothing runs."""
    ledger, tamper, _ = signed
    runs: list[str] = []
    key = new_key()
    with tool_call(*key):
        refund(ledger, runs)("1")
    tamper(ledger, key, {"status": status, "result": None})
    forged = ledger.get(key)
    assert forged is not None and (forged.status.value, forged.result) == (status, None)
    seen: list[Event] = []
    stop = on_event(seen.append)
    try:
        with tool_call(*key), pytest.raises(TamperedRecordError, match="without a seal or a result") as raised:
            refund(ledger, runs)("1")
    finally:
        stop()
    assert key.thread_id in str(raised.value)
    assert runs == ["1"]
    assert [e.kind for e in seen] == [EventKind.TAMPERED]


@pytest.mark.parametrize("status", ["completed", "failed"])
def test_an_in_doubt_call_forged_finished_without_a_result_is_refused(signed: Any, status: str) -> None:
    """The attack of issue 10: a call in doubt (its owner died) is marked finished in the store, with no
    result to seal. The tool must neither be skipped nor its 'failure' replayed."""
    ledger, tamper, _ = signed
    key = new_key()
    ledger.claim(
        key,
        tool_name="refund_order",
        args_digest=_digest(ledger, "1"),
        owner="gone:1:1#1",
        now=_now(),
        lease_expires_at=_now(),
    )
    ledger.complete(key, owner="gone:1:1#1", status=Status.IN_DOUBT, result=None, now=_now())
    tamper(ledger, key, {"status": status})
    runs: list[str] = []
    with tool_call(*key), pytest.raises(TamperedRecordError):
        refund(ledger, runs)("1")
    assert runs == []


def test_a_recorded_failure_replayed_without_its_seal_check(signed: Any) -> None:
    """A failed record is trusted only through its seal: altered, forged without a seal, or stripped of
    its result, it raises TamperedRecordError, never RecordedToolError."""
    ledger, tamper, _ = signed
    runs: list[str] = []
    key = new_key()
    with tool_call(*key), pytest.raises(ValueError, match="declined"):
        refund(ledger, runs)("bad")
    sealed = ledger.get(key).result  # type: ignore[union-attr]
    with tool_call(*key), pytest.raises(RecordedToolError) as replayed:
        refund(ledger, runs)("bad")
    assert "declined" in replayed.value.error_message  # kept on the error, never in its text
    forgeries = [
        sealed.replace("declined", "approved"),
        '{"type": "builtins.ValueError", "message": "forged"}',
        None,
    ]
    for forged in forgeries:
        tamper(ledger, key, {"result": forged})
        with tool_call(*key), pytest.raises(TamperedRecordError):
            refund(ledger, runs)("bad")
    assert runs == ["bad"]


def test_a_sealed_absent_result_is_accepted(signed: Any) -> None:
    """A finished record sealed with no result (the seal covers its absence) replays as None; the same
    seal moved onto a record that has a result, or onto another status, does not check."""
    ledger, tamper, _ = signed
    key = new_key()
    digest = _digest(ledger, "1")
    owner = "gone:1:1#1"
    ledger.claim(key, tool_name="refund_order", args_digest=digest, owner=owner, now=_now(), lease_expires_at=_now())
    sealed_none = ledger.sealer.seal(key, "refund_order", digest, Status.COMPLETED, None)
    assert ":" not in sealed_none.removeprefix("rs-seal-1:")
    ledger.complete(key, owner=owner, status=Status.COMPLETED, result=sealed_none, now=_now())
    runs: list[str] = []
    with tool_call(*key):
        assert refund(ledger, runs)("1") is None
    tamper(ledger, key, {"result": sealed_none + ":null"})
    with tool_call(*key), pytest.raises(TamperedRecordError):
        refund(ledger, runs)("1")
    tamper(ledger, key, {"result": sealed_none, "status": "failed"})
    with tool_call(*key), pytest.raises(TamperedRecordError):
        refund(ledger, runs)("1")
    assert runs == []


def _digest(ledger: Ledger, order_id: str) -> str:
    """The argument digest refund_order(order_id) records, read from a real call's record."""
    key = new_key()
    with tool_call(*key):
        refund(ledger, [])(order_id)
    return ledger.get(key).args_digest  # type: ignore[union-attr]


def test_seals_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every comparison of a stored seal with the one expected goes through ``hmac.compare_digest``: an ``==`` stops
    at the first differing character, and its timing tells a forger how much of a seal was right."""
    compared: list[tuple[str, str]] = []

    def compare_digest(a: str, b: str) -> bool:
        compared.append((a, b))
        return hmac.compare_digest(a, b)

    monkeypatch.setattr(_sealing, "hmac", types.SimpleNamespace(new=hmac.new, compare_digest=compare_digest))
    sealer = _sealing.Sealer([KEY_B, KEY_A])
    key = new_key()
    stored = _sealing.Sealer([KEY_A]).seal(key, "refund_order", "d" * 64, Status.COMPLETED, '"refunded"')

    def record(result: str) -> Record:
        return Record(
            key=key,
            tool_name="refund_order",
            args_digest="d" * 64,
            status=Status.COMPLETED,
            result=result,
            owner="a#1",
            attempt=1,
            created_at=NOW,
            updated_at=NOW,
            lease_expires_at=NOW,
        )

    assert sealer.open(record(stored)) == '"refunded"'
    assert len(compared) == 2  # KEY_B's seal did not match, KEY_A's did: both compared in constant time
    compared.clear()
    forged = stored[: len("rs-seal-1:")] + "0" * 64 + stored[len("rs-seal-1:") + 64 :]
    with pytest.raises(TamperedRecordError):
        sealer.open(record(forged))
    assert [a for a, _ in compared] == ["0" * 64, "0" * 64]


def test_key_rotation(signed: Any) -> None:
    """A new first key signs; the old one, still listed, is accepted; dropped, it is not."""
    ledger, _, reopen = signed
    runs: list[str] = []
    key = new_key()
    with tool_call(*key):
        refund(ledger, runs)("1")
    rotated = reopen([KEY_B, KEY_A])
    with tool_call(*key):
        assert refund(rotated, runs)("1") == "refunded 1"
    only_new = reopen(KEY_B)
    with tool_call(*key), pytest.raises(TamperedRecordError):
        refund(only_new, runs)("1")
    assert runs == ["1"]


def test_key_of_names_the_key_that_made_a_seal() -> None:
    """``Sealer.key_of`` gives the position of the key a seal checks with (0: the first, the one that seals), and
    ``None`` for a forged seal or a result without one: the CLI refuses to seal with a first key that is the
    position of no seal, even when a later key checks one (tests/test_ledger_cli_keys.py)."""
    key = new_key()

    def record(result: str | None, status: Status = Status.COMPLETED) -> Record:
        return Record(key, "refund_order", "d" * 64, status, result, "a#1", 1, NOW, NOW, NOW)

    by_a = _sealing.Sealer([KEY_A]).seal(key, "refund_order", "d" * 64, Status.COMPLETED, '"refunded"')
    assert _sealing.Sealer([KEY_A, KEY_B]).key_of(record(by_a)) == 0
    assert _sealing.Sealer([KEY_B, KEY_A]).key_of(record(by_a)) == 1
    assert _sealing.Sealer([KEY_B]).key_of(record(by_a)) is None
    assert _sealing.Sealer([KEY_A]).key_of(record(by_a, Status.FAILED)) is None  # the status is sealed too
    forged = "rs-seal-1:" + "0" * 64 + ':"refunded"'
    for result in (forged, '"refunded"', None):
        assert _sealing.Sealer([KEY_A, KEY_B]).key_of(record(result)) is None
    steps = _sealing.Sealer([KEY_A]).seal(key, "refund_order", "d" * 64, Status.IN_DOUBT, 'rs-steps-1:["charge"]')
    assert _sealing.Sealer([KEY_B, KEY_A]).key_of(record(steps, Status.IN_DOUBT)) == 1  # an in-doubt seal counts


def test_resolve_seals_its_result(signed: Any) -> None:
    """A result settled by hand is sealed like any other."""
    ledger, _, _ = signed
    key = new_key()
    ledger.claim(
        key, tool_name="refund_order", args_digest="x", owner="gone:1:1#1", now=_now(), lease_expires_at=_now()
    )
    ledger.complete(key, owner="gone:1:1#1", status=Status.IN_DOUBT, result=None, now=_now())
    settled = ledger.resolve(key, result="confirmed by hand")
    assert settled.result.startswith("rs-seal-1:")
    assert ledger.sealer.open(settled) == '"confirmed by hand"'


def _now() -> Any:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc)


def test_signing_key_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """REPLAYSAFE_SIGNING_KEY (comma-separated, first signs) applies to ledgers opened without one."""
    monkeypatch.setenv("REPLAYSAFE_SIGNING_KEY", f"{KEY_B},{KEY_A}")
    ledger = open_ledger(f"sqlite:///{tmp_path}/env.db")
    assert ledger.sealer is not None
    runs: list[str] = []
    key = new_key()
    with tool_call(*key):
        refund(ledger, runs)("1")
    assert SqliteLedger(tmp_path / "env.db", signing_key=KEY_B).sealer.open(ledger.get(key)) is not None  # type: ignore[union-attr, arg-type]


def test_short_keys_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signing key under 16 bytes is a configuration error naming which key (by position, never its value)."""
    with pytest.raises(ValueError, match=r"signing key 1 of 1 in signing_key= is shorter than 16 bytes") as error:
        MemoryLedger(signing_key="short")
    assert "short" not in str(error.value).replace("shorter", "")
    with pytest.raises(ValueError, match=r"signing key 2 of 2 in signing_key= is shorter") as error:
        MemoryLedger(signing_key=[KEY_A, "key-2026-06"])
    assert "key-2026-06" not in str(error.value)
    monkeypatch.setenv("REPLAYSAFE_SIGNING_KEY", f"{KEY_A},tiny")
    with pytest.raises(ValueError, match=r"signing key 2 of 2 in \$REPLAYSAFE_SIGNING_KEY is shorter") as error:
        MemoryLedger()
    assert "tiny" not in str(error.value)


def _move_sqlite(ledger: Ledger, source: CallKey, target: CallKey) -> None:
    """Put ``source``'s row under ``target``'s lookup key, its id columns (and seal) left as they were."""
    assert isinstance(ledger, SqliteLedger)
    from replaysafe._identity import key_digest

    with closing(sqlite3.connect(ledger.path)) as db, db:
        db.execute("DELETE FROM tool_executions WHERE call_key = ?", (key_digest(*target),))
        db.execute(
            "UPDATE tool_executions SET call_key = ? WHERE call_key = ?", (key_digest(*target), key_digest(*source))
        )


def _move_memory(ledger: Ledger, source: CallKey, target: CallKey) -> None:
    assert isinstance(ledger, MemoryLedger)
    ledger._records[target] = ledger._records.pop(source)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_record_moved_to_another_calls_key_is_refused(backend: str, tmp_path: Path) -> None:
    """A sealed record copied under another call's key carries a seal that checks for its own
    call: the store answering one call with another's record is tampering, not a replay."""
    ledger: Ledger
    if backend == "memory":
        ledger, move = MemoryLedger(signing_key=KEY_A), _move_memory
    else:
        ledger, move = SqliteLedger(tmp_path / "moved.db", signing_key=KEY_A), _move_sqlite
    runs: list[str] = []
    first, second = new_key(), new_key()
    with tool_call(*first):
        refund(ledger, runs)("1")
    move(ledger, first, second)
    with tool_call(*second), pytest.raises(TamperedRecordError, match="record of another call"):
        refund(ledger, runs)("1")
    assert runs == ["1"]
