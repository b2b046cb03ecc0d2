"""current_call() outside a call, REPLAYSAFE_DISABLED, disabled(), reset(), record_calls()."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import replaysafe
from replaysafe import (
    MemoryLedger,
    NoCurrentCallError,
    UnprotectedCallWarning,
    current_call,
    current_call_or_none,
    replay_safe,
    set_default_ledger,
    set_default_timeouts,
    tool_call,
)
from replaysafe._constants import UNSET
from replaysafe.testing import disabled, record_calls, reset


def _ids() -> tuple[str, str, str]:
    return (f"t-{uuid.uuid4().hex[:8]}", "msg_1", "call_1")


def test_current_call_outside_a_call_names_the_fix() -> None:
    with pytest.raises(NoCurrentCallError, match=r"outside a protected call.*tool_call\(.*current_call_or_none"):
        current_call()
    assert current_call_or_none() is None
    assert issubclass(NoCurrentCallError, LookupError)


def test_current_call_inside_a_call(memory_ledger: MemoryLedger) -> None:
    seen: list[object] = []

    @replay_safe(ledger=memory_ledger)
    def refund(order_id: str) -> str:
        seen.append(current_call_or_none())
        return current_call().idempotency_key

    key = _ids()
    with tool_call(*key):
        idempotency_key = refund("o-1")
    (call,) = seen
    assert isinstance(call, replaysafe.CallInfo) and call.key == key
    assert idempotency_key == call.idempotency_key


def test_a_tool_run_plainly_gets_the_clear_error() -> None:
    """No ledger: the tool runs as a plain function, and asking for its call identity says why there is none."""

    @replay_safe
    def refund(order_id: str) -> str:
        return current_call().idempotency_key

    with pytest.warns(UnprotectedCallWarning), tool_call(*_ids()), pytest.raises(NoCurrentCallError):
        refund("o-1")


def test_disabled_runs_tools_plainly_and_warns_once(memory_ledger: MemoryLedger) -> None:
    runs: list[bool] = []  # whether each run was protected

    @replay_safe(ledger=memory_ledger)
    def refund(order_id: str) -> str:
        runs.append(current_call_or_none() is not None)
        return order_id

    key = _ids()
    with disabled(), tool_call(*key):
        with pytest.warns(UnprotectedCallWarning, match="REPLAYSAFE_DISABLED=1"):
            refund("o-1")
        refund("o-1")  # no second warning: filterwarnings=error would fail the test
    assert runs == [False, False]
    assert list(memory_ledger.records()) == []
    with tool_call(*key):
        refund("o-1")
        refund("o-1")
    assert runs == [False, False, True]  # protected again once the block ended: ran once, then replayed


def test_the_environment_variable_disables_a_whole_process(tmp_path: Path) -> None:
    """REPLAYSAFE_DISABLED=1: tools run plainly, the ledger is never touched, one warning per process."""
    script = textwrap.dedent(
        f"""
        import warnings
        from replaysafe import SqliteLedger, replay_safe, tool_call
        ledger = SqliteLedger({str(tmp_path / "ledger.db")!r})
        runs = []

        @replay_safe(ledger=ledger)
        def refund(order_id):
            runs.append(order_id)

        @replay_safe(ledger=ledger)
        def email(order_id):
            runs.append(order_id)

        with tool_call("t1", "m1", "c1"):
            refund("o-1"); refund("o-1"); email("o-1")
        print(len(runs), len(list(ledger.records())))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"REPLAYSAFE_DISABLED": "1", "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert done.stdout.split() == ["3", "0"]
    assert done.stderr.count("UnprotectedCallWarning") == 1
    assert "REPLAYSAFE_DISABLED=1" in done.stderr


def test_reset_puts_back_a_fresh_import(monkeypatch: pytest.MonkeyPatch) -> None:
    from replaysafe import _config

    ledger = MemoryLedger()
    set_default_ledger(ledger)
    set_default_timeouts(tool_timeout=5, node_timeout=None)
    monkeypatch.setenv("REPLAYSAFE_DISABLED", "1")
    reset()
    assert _config.default_ledger() is None
    assert (_config.default_tool_timeout, _config.default_node_timeout) == (UNSET, UNSET)  # the built-in ones
    assert _config.disabled is True  # read again from the environment
    monkeypatch.delenv("REPLAYSAFE_DISABLED")
    reset()
    assert _config.disabled is False


def test_reset_closes_the_ledger_the_environment_opened(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from replaysafe import _config

    monkeypatch.setenv("REPLAYSAFE_LEDGER_URL", f"sqlite:///{tmp_path / 'ledger.db'}")
    opened = _config.default_ledger()
    assert opened is not None
    reset()
    reopened = _config.default_ledger()
    assert reopened is not None and reopened is not opened


def test_reset_lets_the_once_per_process_warning_fire_again() -> None:
    @replay_safe
    def refund(order_id: str) -> None:
        pass

    with pytest.warns(UnprotectedCallWarning):
        refund("o-1")
    refund("o-1")  # silent: once per tool
    reset()
    with pytest.warns(UnprotectedCallWarning):
        refund("o-1")


def test_record_calls_counts_runs_and_replays(memory_ledger: MemoryLedger) -> None:
    @replay_safe(ledger=memory_ledger)
    def refund(order_id: str) -> str:
        return order_id

    @replay_safe(ledger=memory_ledger, name="send_email")
    def email(order_id: str) -> None:
        pass

    key = _ids()
    with record_calls() as calls:
        for _ in range(3):
            with tool_call(*key):
                refund("o-1")
        with tool_call(key[0], "msg_2", "call_1"):
            email("o-1")
    assert calls.runs(refund) == 1 and calls.replays(refund) == 2
    assert calls.ran_once(refund) and calls.ran_once("send_email")
    calls.assert_ran_once(refund)
    calls.assert_runs(email, 1)
    with pytest.raises(
        AssertionError, match=r"refund: its body ran 1 time\(s\), expected 2 \(1 start\(s\), 2 replay\(s\) recorded\)"
    ):
        calls.assert_runs(refund, 2)
    with pytest.raises(TypeError, match="not a @replay_safe tool"):
        calls.runs(print)
    with tool_call(*key):
        refund("o-1")
    assert calls.replays(refund) == 2  # the block ended: no longer listening


def test_starts_count_every_execution_runs_only_those_that_returned(memory_ledger: MemoryLedger) -> None:
    """A body that raised after its side effect and ran again: two starts, one run. ``runs`` alone would
    say "once"; ``starts`` sees both executions. A paused body is a start and no run."""
    effects: list[str] = []

    class NeedsApproval(Exception):
        pass

    @replay_safe(ledger=memory_ledger)
    def refund(order: str) -> str:
        effects.append(order)
        if len(effects) == 1:
            raise ConnectionError("the provider's answer was lost")  # not recorded: the call runs again
        return f"re_{order}"

    @replay_safe(ledger=memory_ledger, pause_on=NeedsApproval)
    def wire(order: str) -> str:
        raise NeedsApproval(order)

    key = _ids()
    with record_calls() as calls:
        with tool_call(*key), pytest.raises(ConnectionError):
            refund("o-1")
        with tool_call(*key):
            assert refund("o-1") == "re_o-1"
        with tool_call(*_ids()), pytest.raises(NeedsApproval):
            wire("o-2")
    assert effects == ["o-1", "o-1"]
    assert (calls.starts(refund), calls.runs(refund)) == (2, 1)
    assert calls.ran_once(refund)  # what it returned: once; what began: twice
    calls.assert_starts(refund, 2)
    with pytest.raises(AssertionError, match=r"refund: its body began 2 time\(s\), expected 1 \(1 returned"):
        calls.assert_starts(refund, 1)
    assert (calls.starts(wire), calls.runs(wire)) == (1, 0)
