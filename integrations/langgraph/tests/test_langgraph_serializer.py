"""MessageSerializer: what a protected call produced, recorded with langchain-core's serialization."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.types import Command, Send

from replaysafe import ResultEncodingError
from replaysafe_langgraph import MessageSerializer


def round_trip(value: Any, serializer: MessageSerializer | None = None) -> Any:
    serializer = serializer or MessageSerializer()
    text = serializer.dumps(value)
    json.loads(text)  # the ledger stores plain JSON text
    return serializer.loads(text)


def test_tool_message_round_trips_with_artifact_and_status() -> None:
    """A ToolMessage comes back equal: content, artifact, status, name and ids."""
    message = ToolMessage(
        "refund failed",
        tool_call_id="call_1",
        name="refund_order",
        status="error",
        artifact={"lc": 1, "detail": ["card_declined"]},  # user data that looks like a LangChain stub
    )
    assert round_trip(message) == message


def test_command_round_trips_with_update_resume_and_sends() -> None:
    """A Command keeps its update (with messages), resume, graph and goto targets."""
    update = {"messages": [ToolMessage("refunded", tool_call_id="call_1")], "refund_status": "done"}
    command = Command(update=update, goto=[Send("audit", {"order_id": "A1"}), "notify"], resume={"ok": True})
    back = round_trip(command)
    assert isinstance(back, Command)
    assert (back.update, back.goto, back.resume, back.graph) == (command.update, command.goto, command.resume, None)


def test_command_update_pairs_stay_tuples() -> None:
    """An update given as (channel, value) pairs comes back as tuples, which Command requires."""
    command = Command(update=[("messages", [AIMessage("hi", id="m1")]), ("count", 2)], goto="next")
    back = round_trip(command)
    assert back.update == [("messages", [AIMessage("hi", id="m1")]), ("count", 2)]
    assert back.goto == "next"
    assert back._update_as_tuples() == command._update_as_tuples()


def test_parent_command_and_default_goto_round_trip() -> None:
    """Command.PARENT and the empty default goto survive."""
    command = Command(graph=Command.PARENT, update={"x": 1})
    assert round_trip(command) == command


def test_list_of_results_round_trips() -> None:
    """A tool's list of ToolMessages and Commands comes back in order, each its own type."""
    results = [ToolMessage("a", tool_call_id="call_1"), Command(update={"k": "v"})]
    assert round_trip(results) == results


def test_plain_data_round_trips() -> None:
    """Plain JSON data (a decorated tool's return value) comes back as is."""
    value = {"refund_id": "re_1", "amounts": [1, 2.5], "ok": True, "lc": "not a stub"}
    assert round_trip(value) == value


def test_unserializable_result_is_refused_naming_only_its_type() -> None:
    """A value langchain-core cannot serialize is refused at record time; the data stays out of the message."""
    message = ToolMessage("ok", tool_call_id="call_1", artifact={"when": dt.datetime(2026, 1, 2, 3, 4, 5)})
    with pytest.raises(ResultEncodingError, match=r"datetime\.datetime") as caught:
        MessageSerializer().dumps(message)
    assert "2026" not in str(caught.value)


def test_class_outside_the_allowlist_is_refused_at_record_time() -> None:
    """A Document is not a message: refused unless the allowlist names it."""
    message = ToolMessage("ok", tool_call_id="call_1", artifact=Document(page_content="secret customer note"))
    with pytest.raises(ResultEncodingError, match="allowed_objects") as caught:
        MessageSerializer().dumps(message)
    assert "secret" not in str(caught.value)
    back = round_trip(message, MessageSerializer(allowed_objects="core"))
    assert back.artifact == Document(page_content="secret customer note")


def test_send_with_a_timeout_is_refused() -> None:
    """A Send carrying a timeout policy cannot be recorded faithfully, so it is refused."""
    command = Command(goto=Send("audit", {"order_id": "A1"}, timeout=5.0))
    with pytest.raises(ResultEncodingError, match="audit"):
        MessageSerializer().dumps(command)


def test_plain_json_it_did_not_write_reads_as_data() -> None:
    """A record settled by hand (ledger.resolve with the default JSON) reads back as plain data."""
    serializer = MessageSerializer()
    assert serializer.loads('"sent to customer@example.com"') == "sent to customer@example.com"
    assert serializer.loads('{"message": "not an envelope"}') == {"message": "not an envelope"}
