"""`replaysafe ledger` and the signing key it is given, on every durable ledger: a key is refused only where it
would seal a result (never for reading), it must be the key that signs, forged seals cannot lock the right key
out, and without a key any sealed record tells that the ledger seals."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from replaysafe import CallKey, Ledger, Record, Status, open_ledger, replay_safe, tool_call
from replaysafe._sealing import Sealer

from .cli import cli as in_process_cli
from .test_ledger_cli import _write, assert_replays_the_settled_result

RIGHT = "a-signing-key-of-32-bytes-000000"  # the key the application signs with
WRONG = "b-signing-key-of-32-bytes-111111"
NEW = "c-signing-key-of-32-bytes-222222"  # a key just rotated in: nothing is sealed with it yet
NO_KEY = {"REPLAYSAFE_SIGNING_KEY": ""}
#: A seal anyone who can write the store can write: it checks with no key.
FORGED = "rs-seal-1:" + "0" * 64 + ':"refunded 9"'
OVERRIDE = "--seal-with-unchecked-key"


def cli(url: str, *args: str, keys: tuple[str, ...] = (), by: str = "env", tmp: Path | None = None) -> Any:
    """``replaysafe ledger ... --ledger url``, given ``keys`` (comma-separated, the first signs) in
    $REPLAYSAFE_SIGNING_KEY (``by="env"``) or in a ``--signing-key-file`` (``by="file"``)."""
    env = dict(NO_KEY)
    options = ["--ledger", url]
    if keys and by == "env":
        env["REPLAYSAFE_SIGNING_KEY"] = ",".join(keys)
    elif keys:
        assert tmp is not None
        key_file = tmp / f"keys-{uuid.uuid4().hex[:8]}"
        key_file.write_text("\n".join(keys) + "\n")
        options += ["--signing-key-file", str(key_file)]
    return in_process_cli("ledger", *options, *args, env=env)


def _thread() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def genuine(ledger: Ledger) -> CallKey:
    """A real call of ``refund_order`` (no arguments), completed and sealed by ``ledger``'s key."""
    key = CallKey(_thread(), "msg_1", "call_1")
    with tool_call(*key):
        replay_safe(ledger=ledger, name="refund_order")(lambda: "refunded 1")()
    return key


def in_doubt(ledger: Ledger, thread: str | None = None) -> tuple[CallKey, Record]:
    """A call of ``refund_order`` (no arguments) left in doubt, and its record as it is now."""
    digest = ledger.get(genuine(ledger)).args_digest  # type: ignore[union-attr]
    key = CallKey(thread or _thread(), "msg_7", "call_1")
    _write(ledger, key, Status.IN_DOUBT, None, digest=digest)
    record = ledger.get(key)
    assert record is not None
    return key, record


def in_doubt_only(ledger: Ledger) -> tuple[CallKey, Record]:
    """As ``in_doubt``, on a ledger left without any sealed record: the completed call that gave the argument
    digest is deleted."""
    probe = genuine(ledger)
    digest = ledger.get(probe).args_digest  # type: ignore[union-attr]
    assert ledger.delete(probe)
    key = CallKey(_thread(), "msg_7", "call_1")
    _write(ledger, key, Status.IN_DOUBT, None, digest=digest)
    record = ledger.get(key)
    assert record is not None
    return key, record


def resolve(url: str, key: CallKey, *extra: str, **how: Any) -> Any:
    return cli(url, "resolve", *key, "--result", '"re_1"', "--yes", *extra, **how)


def show(url: str, key: CallKey, **how: Any) -> tuple[dict[str, Any], str]:
    """``show --json``: the document and what went to stderr (exit 0 asserted)."""
    shown = cli(url, "show", *key, "--json", **how)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    return json.loads(shown.stdout), shown.stderr


def assert_replays(url: str, keys: list[str], key: CallKey) -> None:
    """The application, signing with ``keys``, replays the settled ``"re_1"`` without running the tool."""
    with open_ledger(url, signing_key=keys) as app:
        assert_replays_the_settled_result(app, key)


# --- 1. the first key signs: it must check a seal itself --------------------------------------------------


@pytest.mark.parametrize("by", ["file", "env"])
def test_a_wrong_key_listed_before_the_right_one_is_refused(durable_ledger_url: str, tmp_path: Path, by: str) -> None:
    """``WRONG,RIGHT`` passed the check (the second key checks a seal) while ``resolve`` sealed with the first,
    so the application's replay raised TamperedRecordError. The signing key must check a seal itself: refused
    (exit 6, nothing written) with a message saying the first key signs; reading with later keys still works."""
    url = durable_ledger_url
    with open_ledger(url, signing_key=RIGHT) as app:
        done = genuine(app)
        target, before = in_doubt(app)
        refused = resolve(url, target, keys=(WRONG, RIGHT), by=by, tmp=tmp_path)
        assert refused.returncode == 6, refused.stdout + refused.stderr
        assert "the first signing key given seals" in refused.stderr and "key 2 does" in refused.stderr
        assert "put the key the application signs with first" in refused.stderr
        assert "settled" not in refused.stdout
        assert app.get(target) == before  # nothing written

        record, warned = show(url, done, keys=(WRONG, RIGHT), by=by, tmp=tmp_path)
        assert (record["result_check"], record["result"]) == ("ok", "refunded 1")  # later keys read
        assert "the first signing key given, the one that seals, checks none" in warned

        settled = resolve(url, target, keys=(RIGHT, WRONG), by=by, tmp=tmp_path)
        assert settled.returncode == 0, settled.stdout + settled.stderr
    assert_replays(url, [RIGHT], target)


def test_a_new_first_key_nothing_was_sealed_with_yet_is_used_knowingly(durable_ledger_url: str) -> None:
    """Just after a rotation nothing is sealed with the new key: ``NEW,RIGHT`` is refused like a wrong first key,
    and ``--seal-with-unchecked-key`` seals with NEW, which the application (``[NEW, RIGHT]``) replays."""
    url = durable_ledger_url
    with open_ledger(url, signing_key=RIGHT) as app:
        genuine(app)
        target, before = in_doubt(app)
        refused = resolve(url, target, keys=(NEW, RIGHT))
        assert refused.returncode == 6, refused.stdout + refused.stderr
        assert OVERRIDE in refused.stderr
        assert app.get(target) == before
        overridden = resolve(url, target, OVERRIDE, keys=(NEW, RIGHT))
        assert overridden.returncode == 0, overridden.stdout + overridden.stderr
        assert OVERRIDE in overridden.stdout  # the confirmation says what it does
        settled = app.get(target)
        assert settled is not None and settled.status is Status.COMPLETED
        assert Sealer([NEW]).key_of(settled) == 0  # sealed with the first key given
    assert_replays(url, [NEW, RIGHT], target)


# --- 2. forged seals cannot lock the right key out; reading never refuses ----------------------------------


def test_forged_seals_do_not_lock_the_right_key_out(durable_ledger_url: str) -> None:
    """25 forged seals before the ledger's only genuine one (and 25 in the settled call's own thread, after it)
    made the right key fail the check (it tried the first 20 seals): `show` and `resolve` exited 6 just when the
    store needed inspecting. The key now passes when any seal of the ledger checks with it."""
    url = durable_ledger_url
    with open_ledger(url, signing_key=RIGHT) as app:
        junk = _thread()
        for n in range(25):
            _write(app, CallKey(junk, "m", f"old-{n}"), Status.COMPLETED, FORGED)
        target, _ = in_doubt(app)  # its genuine completed call is in another thread
        for n in range(25):
            _write(app, CallKey(target.thread_id, "m", f"new-{n}"), Status.COMPLETED, FORGED)

        record, warned = show(url, CallKey(junk, "m", "old-0"), keys=(RIGHT,))
        assert (record["result_check"], record["result"]) == ("tampered", None)
        assert warned == ""  # the key checks a genuine seal: nothing to warn of
        settled = resolve(url, target, keys=(RIGHT,))
        assert settled.returncode == 0, settled.stdout + settled.stderr
    assert_replays(url, [RIGHT], target)


def test_a_store_whose_every_seal_is_forged(durable_ledger_url: str) -> None:
    """With no genuine seal left, `show` and `list` still answer (each record tampered) and warn, naming how many
    seals were tried and that a forged store does this; `resolve` refuses (exit 6, nothing written) and
    says so, and ``--seal-with-unchecked-key`` seals with the key as given, which the application replays."""
    url = durable_ledger_url
    with open_ledger(url, signing_key=RIGHT) as app:
        target, before = in_doubt_only(app)
        junk = _thread()
        for n in range(3):
            _write(app, CallKey(junk, "m", f"forged-{n}"), Status.COMPLETED, FORGED)

        record, warned = show(url, CallKey(junk, "m", "forged-1"), keys=(RIGHT,))
        assert (record["result_check"], record["result"]) == ("tampered", None)
        assert "checks none of the 3 sealed record(s)" in warned and "forged" in warned
        human = cli(url, "show", junk, "m", "forged-1", keys=(RIGHT,))
        assert human.returncode == 0 and "result_check: tampered" in human.stdout
        listed = cli(url, "list", keys=(RIGHT,))
        assert listed.returncode == 0, listed.stderr
        assert "forged-1" in listed.stdout and "checks none of the 3 sealed record(s)" in listed.stderr

        refused = resolve(url, target, keys=(RIGHT,))
        assert refused.returncode == 6, refused.stdout + refused.stderr
        assert "checks none of the 3 sealed record(s)" in refused.stderr
        assert "forged" in refused.stderr and OVERRIDE in refused.stderr
        assert app.get(target) == before

        overridden = resolve(url, target, OVERRIDE, keys=(RIGHT,))
        assert overridden.returncode == 0, overridden.stdout + overridden.stderr
    assert_replays(url, [RIGHT], target)


def test_a_wrong_key_is_refused_only_where_it_would_seal(durable_ledger_url: str, tmp_path: Path) -> None:
    """A wrong key reads (intact records tampered, with a warning) and deletes (it seals nothing there), but
    neither `--result` nor `--text` is sealed with it (exit 6, nothing written)."""
    url = durable_ledger_url
    with open_ledger(url, signing_key=RIGHT) as app:
        done = genuine(app)
        target, before = in_doubt(app)
        record, warned = show(url, done, keys=(WRONG,))
        assert record["result_check"] == "tampered"
        assert "checks none of the" in warned
        for how in (["--result", '"re_1"'], ["--text", "re_1", "--shape", "json"]):
            refused = cli(url, "resolve", *target, *how, "--yes", keys=(WRONG,), by="file", tmp=tmp_path)
            assert refused.returncode == 6, refused.stdout + refused.stderr
            assert app.get(target) == before
        deleted = cli(url, "delete", *done, "--yes", keys=(WRONG,))
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        assert app.get(done) is None


def test_a_wrong_key_is_found_past_a_thousand_unsealed_records(tmp_path: Path) -> None:
    """The check read the first 1000 records: with more unsealed ones before the first seal, a wrong key was
    taken as given and sealed a result the application refused. Every record is looked at now, whichever
    side of the seals the unsealed ones are. (On SQLite only: the scan reads ``records()``, the same on every
    ledger, and 2,000 records on each server ledger cost CI half a minute.)"""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with open_ledger(url, signing_key=RIGHT) as app:
        filler = _thread()
        for n in range(1001):
            _write(app, CallKey(filler, "m", f"old-{n}"), Status.RUNNING, None)
        target, before = in_doubt(app)
        for n in range(1001):
            _write(app, CallKey(filler, "m", f"new-{n}"), Status.RUNNING, None)
        refused = resolve(url, target, keys=(WRONG,))
        assert refused.returncode == 6, refused.stdout + refused.stderr
        assert app.get(target) == before


def test_a_ledger_without_any_seal_takes_the_key_as_given(durable_ledger_url: str) -> None:
    """With no sealed record anywhere there is nothing to check a key on: it is taken as given, and `resolve`
    says so before sealing with it (SECURITY.md)."""
    url = durable_ledger_url
    with open_ledger(url, signing_key=RIGHT) as app:
        target, _ = in_doubt_only(app)
        settled = resolve(url, target, keys=(WRONG,))
        assert settled.returncode == 0, settled.stdout + settled.stderr
        assert "no record of this ledger carries a seal" in settled.stdout
    assert_replays(url, [WRONG], target)


def test_the_override_goes_with_a_key_and_a_result(durable_ledger_url: str) -> None:
    url = durable_ledger_url
    with open_ledger(url, signing_key=RIGHT) as app:
        target, before = in_doubt(app)
        without_key = resolve(url, target, OVERRIDE)
        assert without_key.returncode == 2 and "signing key" in without_key.stderr
        rerun = cli(url, "resolve", *target, "--rerun", "--yes", OVERRIDE, keys=(RIGHT,))
        assert rerun.returncode == 2 and "--rerun" in rerun.stderr
        assert app.get(target) == before


# --- 3. without a key, any sealed record tells the ledger seals -----------------------------------------------


class NeedsApproval(Exception):
    pass


def paused(ledger: Ledger) -> None:
    """A call paused for approval: its record is sealed, and no finished record is."""
    key = CallKey(_thread(), "msg_1", "call_1")
    with tool_call(*key), pytest.raises(NeedsApproval):
        replay_safe(ledger=ledger, name="approve", pause_on=NeedsApproval)(_needs_approval)()
    assert ledger.get(key).status is Status.PAUSED  # type: ignore[union-attr]


def _needs_approval() -> None:
    raise NeedsApproval


def in_doubt_with_steps(ledger: Ledger) -> None:
    """A call interrupted after a step: its in-doubt record keeps the step's name, sealed. The step's own
    (finished, sealed) record is deleted, so that the in-doubt one is the only sealed record."""
    key = CallKey(_thread(), "msg_1", "call_1")

    @replay_safe(ledger=ledger, name="charge")
    def charge() -> str:
        return "ch_1"

    @replay_safe(ledger=ledger, name="checkout")
    def checkout() -> None:
        charge()
        raise KeyboardInterrupt

    with tool_call(*key), pytest.raises(KeyboardInterrupt):
        checkout()
    kept = ledger.get(key)
    assert kept is not None and kept.status is Status.IN_DOUBT and kept.result.startswith("rs-seal-1:")  # type: ignore[union-attr]
    for record in list(ledger.records(thread_id=key.thread_id)):
        if record.key != key:
            assert ledger.delete(record.key)


def sealed_after_unsealed(ledger: Ledger) -> None:
    """An unsealed finished record written before signing was turned on, then a sealed one."""
    _write(ledger, CallKey(_thread(), "m", "before-signing"), Status.COMPLETED, '"sent"')
    genuine(ledger)


@pytest.mark.parametrize("evidence", [paused, in_doubt_with_steps, sealed_after_unsealed])
def test_without_a_key_any_sealed_record_tells_the_ledger_seals(durable_ledger_url: str, evidence: Any) -> None:
    """The CLI told a sealing ledger by the first finished record only: a ledger whose only seals are on a paused
    record or an in-doubt one that kept its steps, or whose oldest finished record predates signing, got an
    unsealed result (exit 0) that the application refused. Any sealed record tells now: exit 5, nothing written."""
    url = durable_ledger_url
    with open_ledger(url, signing_key=RIGHT) as app:
        target, before = in_doubt_only(app)
        evidence(app)
        refused = resolve(url, target)
        assert refused.returncode == 5, refused.stdout + refused.stderr
        assert "REPLAYSAFE_SIGNING_KEY" in refused.stderr and "carries a seal" in refused.stderr
        assert app.get(target) == before
