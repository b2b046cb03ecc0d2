"""A real crash: the agent process is SIGKILLed inside a tool and a new process resumes the thread.

The model emits ``refund_order`` and ``send_email`` as two parallel calls. The refund
returns; the process kills itself inside ``send_email`` before sending; a new process
continues the same thread with ``invoke(None, config)`` / ``ainvoke(None, config)``.
LangGraph re-runs the tools step, so without the adapter the refund runs twice; with
it the refund's recorded result is replayed and it ran once. The email, whose call
died mid-way, is in doubt and runs again (attempt 2): it never sent before the kill.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from replaysafe import CallKey, SqliteLedger, Status

from _langgraph_harness import AgentRun, run_agent


def crash_and_resume(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    *,
    graph: str,
    checkpointer: str,
    mode: str,
    tools: str,
    thread: str,
    resume_options: dict[str, str] | None = None,
    resume_ok: bool = True,
    kill_when: str = "returned",
) -> tuple[AgentRun, list[str]]:
    """Run the crash and the resume; the resumed run's result and the side effects, in order."""
    if checkpointer == "sqlite":
        checkpoint_url = str(tmp_path / "checkpoints.db")
    else:
        checkpoint_url = request.getfixturevalue("postgres_url")
    effects = tmp_path / "effects.log"
    options = {
        "graph": graph,
        "checkpointer": checkpointer,
        "mode": mode,
        "tools": tools,
        "checkpoint_url": checkpoint_url,
        "ledger": str(tmp_path / "ledger.db"),
        "effects": str(effects),
        "thread": thread,
    }
    crashed = run_agent("crash", **options, kill_when=kill_when)
    assert crashed.returncode == -signal.SIGKILL, crashed.describe()
    assert effects.read_text().splitlines() == ["refund_order A1"], crashed.describe()
    resumed = run_agent("resume", **options, **(resume_options or {}))
    if resume_ok:
        assert resumed.returncode == 0, resumed.describe()
    return resumed, effects.read_text().splitlines()


def check_conversation(resumed: AgentRun) -> None:
    """The resumed thread holds the one model turn, both tool results and the final answer."""
    messages = json.loads(resumed.stdout)
    assert [m[0] for m in messages] == ["human", "ai", "tool", "tool", "ai"], resumed.describe()
    assert [m[1] for m in messages if m[0] == "ai"] == ["msg-turn1-tools", "msg-turn1-final"]
    results = {m[2]: m[3] for m in messages if m[0] == "tool"}
    assert results == {"call_1": "refunded A1", "call_2": "sent to customer@example.com"}


def check_ledger(tmp_path: Path, thread: str) -> None:
    """The refund completed on its first attempt; the killed email call was taken over once."""
    with SqliteLedger(tmp_path / "ledger.db") as ledger:
        refund = ledger.get(CallKey(thread, "msg-turn1-tools", "call_1"))
        email = ledger.get(CallKey(thread, "msg-turn1-tools", "call_2"))
        assert len(list(ledger.records(thread_id=thread))) == 2
    assert refund is not None
    assert (refund.status, refund.attempt) == (Status.COMPLETED, 1)
    assert email is not None
    assert (email.status, email.attempt) == (Status.COMPLETED, 2)


# SQLite, sync is the conformance kit's sibling_pending scenario, on both graphs (tests/test_langgraph_conformance.py).
@pytest.mark.parametrize(("checkpointer", "mode"), [("sqlite", "async"), ("postgres", "sync"), ("postgres", "async")])
@pytest.mark.parametrize("graph", ["toolnode", "agent"])
@pytest.mark.parametrize(("tools", "refunds"), [("plain", 1), ("off", 2)], ids=["adapter", "no-adapter"])
def test_kill_after_refund_then_resume(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    thread_id: str,
    graph: str,
    checkpointer: str,
    mode: str,
    tools: str,
    refunds: int,
) -> None:
    """SIGKILL inside send_email after the refund returned: 1 refund with the adapter, 2 without it."""
    resumed, effects = crash_and_resume(
        tmp_path, request, graph=graph, checkpointer=checkpointer, mode=mode, tools=tools, thread=thread_id
    )
    assert effects.count("refund_order A1") == refunds, resumed.describe()
    assert effects.count("send_email customer@example.com") == 1
    assert len(effects) == refunds + 1
    check_conversation(resumed)
    if tools != "off":
        check_ledger(tmp_path, thread_id)


@pytest.mark.parametrize("tools", ["plain", "off"], ids=["adapter", "no-adapter"])
def test_create_agent_keeps_a_result_langgraph_saved_with_or_without_the_adapter(
    tmp_path: Path, request: pytest.FixtureRequest, thread_id: str, tools: str
) -> None:
    """create_agent runs each call as a task of its own and saves its result when it ends: killed after that
    (tools side by side, as LangGraph runs them), the resume runs the refund once even without the adapter."""
    resumed, effects = crash_and_resume(
        tmp_path,
        request,
        graph="agent",
        checkpointer="sqlite",
        mode="sync",
        tools=tools,
        thread=thread_id,
        kill_when="saved",
    )
    assert effects == ["refund_order A1", "send_email customer@example.com"], resumed.describe()
    check_conversation(resumed)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("graph", ["toolnode", "agent"])
def test_kill_after_refund_then_resume_decorated_tools(
    tmp_path: Path, request: pytest.FixtureRequest, thread_id: str, graph: str, mode: str
) -> None:
    """@replay_safe tools keyed by the adapter: the same crash runs the refund once."""
    resumed, effects = crash_and_resume(
        tmp_path, request, graph=graph, checkpointer="sqlite", mode=mode, tools="decorated", thread=thread_id
    )
    assert effects == ["refund_order A1", "send_email customer@example.com"], resumed.describe()
    check_conversation(resumed)
    check_ledger(tmp_path, thread_id)
    with SqliteLedger(tmp_path / "ledger.db") as ledger:
        refund = ledger.get(CallKey(thread_id, "msg-turn1-tools", "call_1"))
    # The tool recorded its own return value, not the adapter its ToolMessage: one record, not two.
    assert refund is not None
    assert refund.result == '"refunded A1"'


@pytest.mark.parametrize("graph", ["toolnode", "agent"])
def test_in_doubt_raise_from_the_run_config_then_settle_by_hand(
    tmp_path: Path, request: pytest.FixtureRequest, thread_id: str, graph: str
) -> None:
    """configurable in_doubt='raise' stops the resume at the killed call; ledger.resolve() then settles it."""
    resumed, effects = crash_and_resume(
        tmp_path,
        request,
        graph=graph,
        checkpointer="sqlite",
        mode="sync",
        tools="plain",
        thread=thread_id,
        resume_options={"in_doubt": "raise"},
        resume_ok=False,
    )
    assert resumed.returncode == 1, resumed.describe()
    assert "CallInDoubtError" in resumed.stderr
    assert "send_email" in resumed.stderr
    assert effects == ["refund_order A1"]
    # Someone checks with the mail provider, finds the email was sent after all, and says so.
    with SqliteLedger(tmp_path / "ledger.db") as ledger:
        ledger.resolve(CallKey(thread_id, "msg-turn1-tools", "call_2"), result="sent to customer@example.com")
    settled = run_agent(
        "resume",
        graph=graph,
        checkpointer="sqlite",
        mode="sync",
        tools="plain",
        checkpoint_url=str(tmp_path / "checkpoints.db"),
        ledger=str(tmp_path / "ledger.db"),
        effects=str(tmp_path / "effects.log"),
        thread=thread_id,
    )
    assert settled.returncode == 0, settled.describe()
    assert (tmp_path / "effects.log").read_text().splitlines() == ["refund_order A1"]
    check_conversation(settled)
