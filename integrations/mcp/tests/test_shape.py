"""The MCP result shape the ledger command checks `--result` against, held to the SDK's own reading of it.

``replaysafe_mcp._shape`` checks JSON data without the SDK. What it accepts, ``CallToolResult`` must read (a
replay reads the record with ``CallToolResult.model_validate_json``); what it refuses is either unreadable or
outside the protocol's own field names and types (stricter than the SDK, never looser). Its messages name
fields and types, never a value.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp.types import (
    Annotations,
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    Icon,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)
from pydantic import ValidationError

from replaysafe_mcp._shape import SHAPE, problem, recognizes, text_result

VALUE = "VALUE-7731"  # stands for a real value: never in a message

#: Results as servers send them, recorded as the adapter records them (the protocol's JSON).
RECORDED = [
    CallToolResult(content=[TextContent(type="text", text=VALUE)]),
    CallToolResult(content=[], structured_content={"refund": VALUE}, is_error=False, _meta={"trace": VALUE}),
    CallToolResult(content=[TextContent(type="text", text=VALUE)], is_error=True),
    CallToolResult(
        content=[
            TextContent(
                type="text",
                text=VALUE,
                annotations=Annotations(audience=["user"], priority=0.5, last_modified="2026-01-01T00:00:00Z"),
                _meta={"k": VALUE},
            ),
            ImageContent(type="image", data="aGk=", mime_type="image/png"),
            AudioContent(type="audio", data="aGk=", mime_type="audio/wav"),
            ResourceLink(
                type="resource_link",
                uri="file:///r.txt",
                name="r",
                title="R",
                size=3,
                icons=[Icon(src="https://x/i.png", sizes=["16x16"], theme="dark")],
            ),
            EmbeddedResource(type="resource", resource=TextResourceContents(uri="file:///a", text=VALUE)),
            EmbeddedResource(
                type="resource", resource=BlobResourceContents(uri="file:///b", blob="aGk=", mime_type="x/y")
            ),
        ]
    ),
]

#: JSON data a hand-settled result may be, and why the shape refuses it (the message's start).
REFUSED: list[tuple[Any, str]] = [
    (VALUE, "it is a string, not a CallToolResult"),
    (7, "it is a number"),
    ([VALUE], "it is an array"),
    (None, "it is null"),
    ({}, "it has no content"),
    ({"contents": []}, "it holds 1 field(s) a CallToolResult does not have"),
    ({"content": VALUE}, "its content is a string, not an array of content blocks"),
    ({"content": [VALUE]}, "content[0] is a string, not a content block"),
    ({"content": [{"text": VALUE}]}, "content[0] has no type of text"),
    ({"content": [{"type": "text"}]}, "content[0] (text) has no text"),
    ({"content": [{"type": "text", "text": 1}]}, "the text of content[0] (text) is a number, not a string"),
    ({"content": [{"type": "html", "text": VALUE}]}, "content[0] has no type of text"),
    ({"content": [{"type": "text", "text": VALUE, "note": VALUE}]}, "content[0] (text) holds 1 field(s)"),
    ({"content": [{"type": "image", "data": "aGk="}]}, "content[0] (image) has no mimeType"),
    ({"content": [{"type": "resource_link", "uri": "u", "name": "n", "size": 1.5}]}, "the size of content[0]"),
    ({"content": [{"type": "resource", "resource": {"uri": "u"}}]}, "the resource of content[0] holds neither"),
    (
        {"content": [{"type": "resource", "resource": {"uri": "u", "text": VALUE, "blob": "aGk="}}]},
        "the resource of content[0] holds both text and blob",
    ),
    (
        {"content": [{"type": "text", "text": VALUE, "annotations": {"priority": 2}}]},
        "the priority of the annotations of content[0] is not from 0 to 1",
    ),
    (
        {"content": [{"type": "text", "text": VALUE, "annotations": {"audience": ["model"]}}]},
        "the audience of the annotations of content[0] names a role",
    ),
    ({"content": [], "isError": "yes"}, "its isError is a string, not true or false"),
    ({"content": [], "_meta": [VALUE]}, "its _meta is an array, not an object or null"),
    ({"content": [], "resultType": "input_required"}, 'its resultType is not "complete"'),
]


@pytest.mark.parametrize("result", RECORDED, ids=range(len(RECORDED)))
def test_what_the_adapter_records_is_accepted_and_recognized(result: CallToolResult) -> None:
    data = json.loads(result.model_dump_json(by_alias=True))
    assert problem(data) is None
    assert recognizes(data)  # a finished record of the tool tells the next one's shape
    assert CallToolResult.model_validate(data) == result


@pytest.mark.parametrize(("value", "why"), REFUSED, ids=range(len(REFUSED)))
def test_what_the_shape_refuses_it_says_why_without_the_value(value: Any, why: str) -> None:
    found = problem(value)
    assert found is not None
    assert found.startswith(why), found
    assert VALUE not in found


def test_what_the_sdk_cannot_read_is_refused() -> None:
    """Every refused value the SDK cannot read either: the refusals of a string, a missing or mistyped field."""
    unreadable = 0
    for value, _ in REFUSED:
        try:
            CallToolResult.model_validate(value)
        except ValidationError:
            unreadable += 1
            assert problem(value) is not None
    assert unreadable >= 12  # the rest the SDK coerces or ignores; the shape keeps to the protocol's form


def test_text_is_one_text_block_the_sdk_reads_and_the_next_call_recognizes() -> None:
    data = text_result(VALUE)
    assert SHAPE.text is text_result
    assert SHAPE.problem(data, ()) is None  # with no finished call to compare with: the outline only
    assert SHAPE.recognizes(data)
    assert CallToolResult.model_validate(data) == CallToolResult(content=[TextContent(type="text", text=VALUE)])
    assert not recognizes({"content": []})  # a tool's own data with a content field is not taken for one


#: What fastmcp 4.2 answers for a tool returning a string (`tag` of the test server), as the adapter records it.
WRAPPED = {
    "_meta": {"fastmcp": {"wrap_result": True}},
    "content": [{"type": "text", "text": "tagged A1", "annotations": None, "_meta": None}],
    "structuredContent": {"result": "tagged A1"},
    "isError": False,
    "resultType": "complete",
}


def test_text_is_wrapped_as_the_finished_calls_of_the_tool_hold_it() -> None:
    """A tool whose finished calls wrap their text as structured content (its output schema asks for it) gets its
    text wrapped alike; one whose calls return other structured content cannot be settled by text alone."""
    data = text_result(VALUE, [WRAPPED, WRAPPED])
    assert data["structuredContent"] == {"result": VALUE}
    assert data["_meta"] == {"fastmcp": {"wrap_result": True}}
    assert problem(data, [WRAPPED]) is None
    assert CallToolResult.model_validate(data).structured_content == {"result": VALUE}

    structured = json.loads(RECORDED[1].model_dump_json(by_alias=True))
    alone = text_result(VALUE, [structured])
    assert alone["structuredContent"] is None
    why = problem(alone, [structured])
    assert why is not None
    assert why.startswith("the 1 finished call(s) of this tool found return structuredContent, and this result")
    assert VALUE not in why
    assert problem(text_result(VALUE), [json.loads(RECORDED[0].model_dump_json(by_alias=True))]) is None
