"""The pytest plugin, used by a small sample project run by pytest in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SAMPLE = """
from replaysafe import current_call, replay_safe, tool_call
from replaysafe.testing import kill_point, run_in_child

RUNS = []


@replay_safe
def refund_order(order_id):
    RUNS.append(order_id)
    return current_call().idempotency_key


def test_the_default_ledger_is_fresh_and_counted(replaysafe_ledger, replaysafe_calls):
    with tool_call("t1", "m1", "c1"):
        first = refund_order("o-1")
    with tool_call("t1", "m1", "c1"):
        assert refund_order("o-1") == first
    replaysafe_calls.assert_ran_once(refund_order)
    assert replaysafe_calls.replays(refund_order) == 1
    assert len(list(replaysafe_ledger.records())) == 1


def test_each_test_gets_its_own_ledger(replaysafe_ledger, replaysafe_calls):
    with tool_call("t1", "m1", "c1"):
        refund_order("o-1")
    replaysafe_calls.assert_ran_once(refund_order)  # not a replay of the first test's call


def test_without_the_fixture_nothing_is_set():
    from replaysafe import _config
    assert _config.default_ledger() is None


def test_the_application_sets_its_default_ledger():
    from replaysafe import MemoryLedger, set_default_ledger
    global APP_LEDGER
    APP_LEDGER = MemoryLedger()
    set_default_ledger(APP_LEDGER)


def test_the_fixture_replaces_it_for_one_test(replaysafe_ledger):
    from replaysafe import _config
    assert _config.default_ledger() is replaysafe_ledger


def test_the_application_ledger_protects_the_tests_after_it():
    from replaysafe import _config, set_default_ledger
    assert _config.default_ledger() is APP_LEDGER
    with tool_call("t2", "m1", "c1"):
        refund_order("o-2")
    assert len(list(APP_LEDGER.records())) == 1
    set_default_ledger(None)


def test_the_clock_moves_when_the_test_steps_it(replaysafe_ledger, replaysafe_clock):
    from datetime import timedelta
    from replaysafe import CallKey

    started = replaysafe_clock.now()

    @replay_safe(lease=30, timeout=None)
    def export():
        replaysafe_clock.advance(600)  # the lease is renewed meanwhile
        return replaysafe_ledger.get(CallKey("t3", "m1", "c1")).lease_expires_at

    with tool_call("t3", "m1", "c1"):
        assert export() == started + timedelta(seconds=630)


def test_the_machines_clocks_are_back_after_it():
    from replaysafe import _drivers
    from replaysafe._clock import MACHINE
    assert (_drivers.HOST.now, _drivers.HOST.monotonic) == (MACHINE.now, MACHINE.monotonic)


def agent(url, path):
    from replaysafe import open_ledger
    @replay_safe(ledger=open_ledger(url))
    def charge():
        with open(path, "a") as effects:
            effects.write("charged\\n")
    with tool_call("t1", "m1", "c1"):
        charge()
    kill_point("after_charge")


def test_the_events_of_the_test_are_seen_in_order(replaysafe_ledger, replaysafe_events):
    with tool_call("t1", "msg_1", "call_2"):
        refund_order("o-2")
    with tool_call("t1", "msg_1", "call_2"):
        refund_order("o-2")
    kinds = [event.kind.value for event in replaysafe_events]
    assert kinds.index("started") < kinds.index("executed") < kinds.index("replayed"), kinds


def test_crash_and_resume(tmp_path):
    url, path = f"sqlite:///{tmp_path}/l.db", str(tmp_path / "effects")
    assert run_in_child(agent, url, path, kill_at="after_charge").killed
    run_in_child(agent, url, path)
    with open(path) as effects:
        assert effects.read() == "charged\\n"
"""


def test_a_sample_project_uses_the_fixtures_without_configuration(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(SAMPLE), encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")  # its own rootdir, none of ours
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_ADDOPTS")}
    done = subprocess.run(
        # Only this project's plugins matter here: not pytest-asyncio, installed beside it for our own tests.
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:asyncio", "-W", "error"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "10 passed" in done.stdout
