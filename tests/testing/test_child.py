"""run_in_child + kill_point: real SIGKILLs in real child processes, resumed in new ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from replaysafe.testing import ChildError, kill_point, run_in_child

from . import crash_scenario


def _effects(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def test_killed_after_the_tool_then_resumed_replays(tmp_path: Path) -> None:
    """The process dies after the tool's result was recorded: the resumed run replays it."""
    url, effects = f"sqlite:///{tmp_path / 'ledger.db'}", tmp_path / "effects.txt"
    first = run_in_child(crash_scenario.refund_step, url, str(effects), kill_at="after_the_tool")
    assert first.killed and first.killed_at == "after_the_tool" and first.value is None
    assert first.returncode == -9
    second = run_in_child(crash_scenario.refund_step, url, str(effects))
    assert not second.killed
    assert second.value == "refunded o-1"
    assert len(_effects(effects)) == 1  # counted outside both processes


def test_killed_inside_the_tool_is_in_doubt(tmp_path: Path) -> None:
    """Killed after the side effect, before the record: the resume applies the in-doubt policy."""
    url, effects = f"sqlite:///{tmp_path / 'ledger.db'}", tmp_path / "effects.txt"
    run_in_child(
        crash_scenario.refund_step, url, str(effects), "raise", kill_inside=True, kill_at="after_the_side_effect"
    )
    with pytest.raises(ChildError) as raised:
        run_in_child(crash_scenario.refund_step, url, str(effects), "raise")
    assert raised.value.type_name == "replaysafe.CallInDoubtError"
    assert "CallInDoubtError" in raised.value.child_traceback
    assert len(_effects(effects)) == 1
    # The default policy runs it again, with the same idempotency key for the provider.
    assert run_in_child(crash_scenario.refund_step, url, str(effects)).value == "refunded o-1"
    first, second = _effects(effects)
    assert first.split()[-1] == second.split()[-1]


def test_an_async_function_runs_under_asyncio() -> None:
    assert run_in_child(crash_scenario.async_step, 21).value == 42


@pytest.mark.parametrize("fork", ["1", "0"])
def test_a_child_says_nothing_of_its_own_even_with_warnings_as_errors(
    fork: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child starts clean, a new interpreter or forked: no warning of how it was started in its stderr,
    and it runs when every warning is an error."""
    monkeypatch.setenv("REPLAYSAFE_CRASHTEST_FORK", fork)
    monkeypatch.setenv("PYTHONWARNINGS", "error")
    runs = [run_in_child(crash_scenario.async_step, 21) for _ in range(3)]
    assert [(run.value, run.stderr) for run in runs] == [(42, "")] * 3


def test_an_error_in_the_child_is_raised_with_its_traceback() -> None:
    with pytest.raises(ChildError, match=r"raised builtins\.ValueError") as raised:
        run_in_child(crash_scenario.failing_step)
    assert raised.value.type_name == "builtins.ValueError"
    assert "the step failed" in raised.value.child_traceback


def test_a_value_json_cannot_carry_is_an_error() -> None:
    with pytest.raises(ChildError, match="TypeError"):
        run_in_child(crash_scenario.returns_a_set)


def test_a_kill_point_never_reached_is_an_error(tmp_path: Path) -> None:
    url, effects = f"sqlite:///{tmp_path / 'ledger.db'}", tmp_path / "effects.txt"
    with pytest.raises(ChildError, match="without reaching kill_point\\('nowhere'\\)"):
        run_in_child(crash_scenario.refund_step, url, str(effects), kill_at="nowhere")


def test_a_function_the_child_cannot_import_is_refused() -> None:
    def local() -> None:
        pass

    with pytest.raises(TypeError, match="top level of a module"):
        run_in_child(local)
    with pytest.raises(TypeError, match="top level of a module"):
        run_in_child(lambda: None)


def test_a_kill_point_not_named_does_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only the point run_in_child named kills: any other (or none) returns, and reports nothing."""
    from replaysafe.testing._child import KILL_AT_ENV, OUTCOME_ENV

    outcome = tmp_path / "outcome.json"
    monkeypatch.setenv(OUTCOME_ENV, str(outcome))
    monkeypatch.setenv(KILL_AT_ENV, "another_point")
    kill_point("after_the_tool")
    monkeypatch.delenv(KILL_AT_ENV)
    kill_point("another_point")
    assert not outcome.exists()  # a kill would have written it first (and this line not run)


SCRIPT = """
import sys
from replaysafe import SqliteLedger, replay_safe, tool_call
from replaysafe.testing import kill_point, run_in_child

def agent(ledger_path: str, effects: str) -> str:
    @replay_safe(ledger=SqliteLedger(ledger_path))
    def charge() -> str:
        with open(effects, "a") as file:
            file.write("charged\\n")
        return "charged"

    with tool_call("t1", "m1", "c1"):
        result = charge()
    kill_point("after_charge")
    return result


if __name__ == "__main__":
    ledger_path, effects = sys.argv[1], sys.argv[2]
    with open(effects, "a") as file:
        file.write("script ran\\n")  # the script's own main block: run once, in the parent only
    assert run_in_child(agent, ledger_path, effects, kill_at="after_charge").killed
    print(run_in_child(agent, ledger_path, effects).value)
    missing = agent
    missing.__qualname__ = "renamed_away"
    try:
        run_in_child(missing, ledger_path, effects)
    except Exception as exc:
        print(type(exc).__name__, str(exc).splitlines()[0])
"""


def test_a_function_of_a_script_run_as_python_x_py_runs_in_the_child(tmp_path: Path) -> None:
    """`python x.py` defines its functions in __main__: the child loads the script from its file (without running
    its main block again), and a function it cannot find is reported as not found, not as raising."""
    script = tmp_path / "agent.py"
    script.write_text(SCRIPT, encoding="utf-8")
    effects = tmp_path / "effects"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ledger.db"), str(effects)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "charged"  # the resume replayed the recorded result
    assert lines[1].startswith("ChildError run_in_child(renamed_away): the child could not find the function")
    assert "raised" not in lines[1]
    assert _effects(effects) == ["script ran", "charged"]
