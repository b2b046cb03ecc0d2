"""The first example of docs/adapters.md runs as written, in a real graph, and protects a tool."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode

from replaysafe import CallKey, Status, replay_safe

from _langgraph_fakes import ask, before_tools, config, final_answer, scripted, state_graph, tool_call_message

ADAPTERS_DOC = Path(__file__).parents[3] / "docs" / "adapters.md"


def first_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", ADAPTERS_DOC.read_text(), flags=re.DOTALL)
    assert blocks, f"no python example in {ADAPTERS_DOC}"
    return str(blocks[0])


def test_the_first_example_of_the_adapter_guide_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Executed as written (its ledger file in a temporary directory), its wrap/awrap key a decorated tool."""
    monkeypatch.chdir(tmp_path)
    example: dict[str, Any] = {}
    exec(compile(first_example(), str(ADAPTERS_DOC), "exec"), example)  # the guide's code, nothing else
    effects: list[str] = []

    @tool
    @replay_safe
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        effects.append(f"refund_order {order_id}")
        return f"refunded {order_id}"

    model = scripted(tool_call_message(1, "refund_order", {"order_id": "A1"}), final_answer(1), final_answer(2))
    node = ToolNode([refund_order], wrap_tool_call=example["wrap"], awrap_tool_call=example["awrap"])
    graph = state_graph(model, node, InMemorySaver())
    graph.invoke(ask(1), config("docs-thread"))
    graph.invoke(None, before_tools(graph, "docs-thread"))
    assert effects == ["refund_order A1"]
    with example["ledger"] as ledger:
        record = ledger.get(CallKey("docs-thread", "msg-turn1-tools", "call_1"))
    assert record is not None
    assert record.status is Status.COMPLETED
    assert (tmp_path / "ledger.db").exists()
