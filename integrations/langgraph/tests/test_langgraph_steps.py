"""Steps, pauses and chosen keys through LangGraph, across real SIGKILLs and new processes.

Each scenario runs a graph in a child process (``replaysafe.testing.run_in_child``) on a SQLite
checkpointer and a SQLite ledger, both files, and resumes it in another child through LangGraph's
own persistence (``invoke(None)``, ``Command(resume=...)``, or a new run when nothing was saved).
Side effects are lines appended to a file, counted by the test process. Each scenario has a
control, the same run without replaysafe, that repeats the side effect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt

from replaysafe import CallKey, SqliteLedger, Status, replay_safe
from replaysafe.testing import kill_point, run_in_child
from replaysafe_langgraph import replay_safe_tool_node

from _langgraph_fakes import ask, config, final_answer, scripted, state_graph, tool_call_message

THREAD = "steps-thread"


def append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def refund_tool(effects: str, *, protected: bool, decorated: bool, pause: bool, key: str = "call") -> Any:
    """``refund_order``: a ``charge`` step, then (optionally) ``interrupt()``, then a ``notify`` step."""

    def charge(order_id: str) -> str:
        append(effects, f"charge {order_id}")
        return f"ch_{order_id}"

    def notify(order_id: str) -> str:
        append(effects, f"notify {order_id}")
        return "notified"

    if protected:
        charge, notify = replay_safe(charge), replay_safe(notify)

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        receipt = charge(order_id)
        kill_point("between-steps")
        answer = interrupt({"approve_refund": order_id}) if pause else "auto"
        return f"{receipt} {notify(order_id)} {answer}"

    if decorated:
        refund_order = replay_safe(key=key)(refund_order)  # type: ignore[call-overload]
    return tool(refund_order)


def run_graph(
    checkpoints: str,
    ledger_path: str,
    effects: str,
    replies: list[dict[str, Any]],
    request: str,
    *,
    protected: bool = True,
    decorated: bool = False,
    pause: bool = False,
    key: str = "call",
    durability: str = "sync",
) -> dict[str, Any]:
    """One ``invoke`` of the graph: ``request`` is ``"ask"``, ``"continue"`` or ``"resume:<value>"``.

    Returns the tool results and whether the run stopped at an interrupt.
    """
    model = scripted(*(AIMessage(**reply) for reply in replies))
    refund = refund_tool(effects, protected=protected, decorated=decorated, pause=pause, key=key)
    with SqliteLedger(ledger_path) as ledger, SqliteSaver.from_conn_string(checkpoints) as saver:
        node = replay_safe_tool_node([refund], ledger=ledger) if protected else ToolNode([refund])
        graph = state_graph(model, node, saver)
        inputs: Any = ask(1) if request == "ask" else None
        if request.startswith("resume:"):
            inputs = Command(resume=request.removeprefix("resume:"))
        state = graph.invoke(inputs, config(THREAD), durability=durability)  # type: ignore[arg-type]
    results = {m.tool_call_id: m.content for m in state["messages"] if isinstance(m, ToolMessage)}
    return {"results": results, "paused": bool(state.get("__interrupt__"))}


def reply(message: AIMessage) -> dict[str, Any]:
    return {"id": message.id, "content": message.content, "tool_calls": message.tool_calls}


ASK = [reply(tool_call_message(1, "refund_order", {"order_id": "A1"})), reply(final_answer(1))]
FINAL = [reply(final_answer(1))]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    return {
        "checkpoints": str(tmp_path / "checkpoints.db"),
        "ledger_path": str(tmp_path / "ledger.db"),
        "effects": str(tmp_path / "effects.log"),
    }


def test_a_decorated_tool_killed_between_two_steps_resumes_with_the_first_step_replayed(files: dict[str, str]) -> None:
    """SIGKILL after the charge step; invoke(None) in a new process replays the charge and runs notify once.

    The tool is decorated with ``@replay_safe`` itself; undecorated (protected by the adapter) and without
    replaysafe (the control: two charges), this is the conformance kit's ``steps`` scenario on a ToolNode
    (``tests/test_langgraph_conformance.py``).
    """
    options = {"protected": True, "decorated": True}
    crashed = run_in_child(run_graph, *files.values(), ASK, "ask", kill_at="between-steps", **options)
    assert crashed.killed
    effects = Path(files["effects"])
    assert lines(effects) == ["charge A1"]

    resumed = run_in_child(run_graph, *files.values(), FINAL, "continue", **options)
    assert resumed.value["results"] == {"call_1": "ch_A1 notified auto"}
    assert lines(effects) == ["charge A1", "notify A1"]
    with SqliteLedger(files["ledger_path"]) as ledger:
        parent = ledger.get(CallKey(THREAD, "msg-turn1-tools", "call_1"))
    assert parent is not None
    assert (parent.status, parent.attempt) == (Status.COMPLETED, 2)


@pytest.mark.parametrize(
    ("variant", "charges"), [("adapter", 1), ("decorated", 1), ("unprotected", 2)], ids=lambda v: str(v)
)
def test_a_step_then_interrupt_then_resume_charges_once(variant: str, charges: int, files: dict[str, str]) -> None:
    """charge, interrupt(), then Command(resume="yes") in a new process: the charge replays, notify runs once."""
    options = {"protected": variant != "unprotected", "decorated": variant == "decorated", "pause": True}
    paused = run_in_child(run_graph, *files.values(), ASK[:1], "ask", **options)
    assert paused.value == {"results": {}, "paused": True}
    effects = Path(files["effects"])
    assert lines(effects) == ["charge A1"]
    if variant != "unprotected":
        with SqliteLedger(files["ledger_path"]) as ledger:
            parent = ledger.get(CallKey(THREAD, "msg-turn1-tools", "call_1"))
        assert parent is not None
        assert parent.status is Status.PAUSED

    resumed = run_in_child(run_graph, *files.values(), FINAL, "resume:yes", **options)
    assert resumed.value == {"results": {"call_1": "ch_A1 notified yes"}, "paused": False}
    assert lines(effects) == ["charge A1"] * charges + ["notify A1"]


@pytest.mark.parametrize(("key", "charges"), [("args", 1), ("call", 2)])
def test_key_args_replays_a_call_the_model_planned_again_under_new_ids(
    key: str, charges: int, files: dict[str, str]
) -> None:
    """durability="exit": a crash saves nothing, the model is asked again and answers with new ids.

    Under ``key="args"`` the re-planned refund (same thread, same arguments) replays; under the
    default key it is a new call and charges again.
    """
    options = {"decorated": True, "key": key, "durability": "exit"}
    crashed = run_in_child(run_graph, *files.values(), ASK, "ask", kill_at="between-steps", **options)
    assert crashed.killed
    effects = Path(files["effects"])
    assert lines(effects) == ["charge A1"]
    replanned = tool_call_message(1, "refund_order", {"order_id": "A1"}, call_id="call_9")
    replanned.id = "msg-turn1-tools-replanned"
    again = run_in_child(run_graph, *files.values(), [reply(replanned), *FINAL], "ask", **options)
    assert again.value["results"] == {"call_9": "ch_A1 notified auto"}
    assert lines(effects) == ["charge A1"] * charges + ["notify A1"]
