"""What replaysafe-mcp records, told to ``replaysafe ledger resolve`` without the MCP SDK.

Both sides record a call's ``CallToolResult`` as the JSON the protocol sends (``model_dump_json(by_alias=True)``),
and a replay reads it back with ``CallToolResult.model_validate_json``: a JSON string such as ``"refunded"``
cannot be read. The command loads ``SHAPE`` through the ``replaysafe.result_shapes`` entry point, in a process
that never imports ``mcp``: this module imports only the standard library and replaysafe's public API, and
checks the outline of a ``CallToolResult`` on JSON data. The check is stricter than the SDK's validation (the
protocol's field names only, every field of its own type, no field the protocol does not define), so that what
it accepts, the SDK reads; ``tests/test_shape.py`` checks that against the SDK.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replaysafe import ResultShape

#: The thread id of a server's calls is this prefix plus the server's name (``ReplaySafeMiddleware``).
THREAD_PREFIX = "mcp-server:"

_RESULT_FIELDS = frozenset({"content", "isError", "structuredContent", "_meta", "resultType"})
#: Every one of these is written when a CallToolResult is recorded, whatever it holds: the form that tells an
#: MCP record from a tool's own data.
_ALWAYS_RECORDED = frozenset({"content", "isError", "structuredContent", "_meta"})
_ROLES = ("user", "assistant")
_THEMES = ("light", "dark")

#: Per content block type: its required fields and their JSON types; then the optional ones (each may be null).
_REQUIRED: dict[str, dict[str, type]] = {
    "text": {"text": str},
    "image": {"data": str, "mimeType": str},
    "audio": {"data": str, "mimeType": str},
    "resource_link": {"uri": str, "name": str},
    "resource": {"resource": dict},
}
_OPTIONAL: dict[str, dict[str, type]] = {
    "resource_link": {"title": str, "description": str, "mimeType": str, "size": int, "icons": list},
}
_BLOCK_COMMON = frozenset({"type", "annotations", "_meta"})


def text_result(text: str, recorded: Sequence[Any] = ()) -> dict[str, Any]:
    """A ``CallToolResult`` holding one text block, as JSON data: what ``--text`` records.

    When every finished call of the tool found holds its text result wrapped as structured content too
    (``{"result": "..."}``, as fastmcp answers for a tool returning a string), the text is wrapped alike (with
    fastmcp's ``wrap_result`` mark, if they all carry it; nothing else of theirs): a client checks structured
    content against the tool's output schema.
    """
    structured = {"result": text} if recorded and all(_wrapped(result) for result in recorded) else None
    marked = structured is not None and all(_marked(result) for result in recorded)
    meta = {"fastmcp": {"wrap_result": True}} if marked else None
    content = [{"type": "text", "text": text}]
    return {"_meta": meta, "content": content, "structuredContent": structured, "isError": False}


def _marked(result: Any) -> bool:
    """Whether a result carries fastmcp's mark of structured content that wraps a value not an object."""
    meta = result.get("_meta")
    fastmcp = meta.get("fastmcp") if isinstance(meta, dict) else None
    return isinstance(fastmcp, dict) and fastmcp.get("wrap_result") is True


def _wrapped(result: Any) -> bool:
    structured = result.get("structuredContent") if isinstance(result, dict) else None
    return isinstance(structured, dict) and list(structured) == ["result"] and isinstance(structured["result"], str)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (int, float)):
        return "a number"
    return "an array" if isinstance(value, list) else "an object"


def _is(value: Any, kind: type) -> bool:
    """A JSON value of ``kind``: ``bool`` is no number, a float no integer, and ``float`` any number."""
    if kind in (int, float) and isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _fields(value: dict[str, Any], what: str, required: dict[str, type], optional: dict[str, type]) -> str | None:
    extra = len(set(value) - set(required) - set(optional))
    if extra:
        allowed = ", ".join(sorted({*required, *optional}))
        return f"{what} holds {extra} field(s) it cannot have (its fields: {allowed})"
    for name, kind in required.items():
        if name not in value:
            return f"{what} has no {name}"
        if not _is(value[name], kind):
            return f"the {name} of {what} is {_kind(value[name])}, not {_kind(kind())}"
    for name, kind in optional.items():
        if value.get(name) is not None and not _is(value[name], kind):
            return f"the {name} of {what} is {_kind(value[name])}, not {_kind(kind())} or null"
    return None


def _annotations_problem(annotations: Any, what: str) -> str | None:
    if annotations is None:
        return None
    if not isinstance(annotations, dict):
        return f"the annotations of {what} are {_kind(annotations)}, not an object"
    optional: dict[str, type] = {"audience": list, "priority": float, "lastModified": str}
    why = _fields(annotations, f"the annotations of {what}", {}, optional)
    if why is not None:
        return why
    if any(role not in _ROLES for role in annotations.get("audience") or []):
        return f"the audience of the annotations of {what} names a role other than user and assistant"
    priority = annotations.get("priority")
    if priority is not None and not 0 <= priority <= 1:
        return f"the priority of the annotations of {what} is not from 0 to 1"
    return None


def _block_problem(block: Any, what: str) -> str | None:
    if not isinstance(block, dict):
        return f"{what} is {_kind(block)}, not a content block (an object)"
    kind = block.get("type")
    if kind not in _REQUIRED:
        return f"{what} has no type of text, image, audio, resource_link or resource"
    if block.get("_meta") is not None and not isinstance(block["_meta"], dict):
        return f"the _meta of {what} is {_kind(block['_meta'])}, not an object or null"
    optional = {**_OPTIONAL.get(kind, {}), **dict.fromkeys(_BLOCK_COMMON - {"type"}, object)}
    why = _fields(block, f"{what} ({kind})", {"type": str, **_REQUIRED[kind]}, optional)
    if why is not None:
        return why
    why = _annotations_problem(block.get("annotations"), what)
    if why is not None:
        return why
    if kind == "resource":
        return _resource_problem(block["resource"], f"the resource of {what}")
    for n, icon in enumerate(block.get("icons") or []):
        why = _icon_problem(icon, f"icons[{n}] of {what}")
        if why is not None:
            return why
    return None


def _resource_problem(resource: dict[str, Any], what: str) -> str | None:
    body = [name for name in ("text", "blob") if name in resource]
    if len(body) != 1:
        return f"{what} holds {'both text and blob' if body else 'neither text nor blob'}: it holds one of them"
    optional: dict[str, type] = {"mimeType": str, "_meta": dict}
    return _fields(resource, what, {"uri": str, body[0]: str}, optional)


def _icon_problem(icon: Any, what: str) -> str | None:
    if not isinstance(icon, dict):
        return f"{what} is {_kind(icon)}, not an object"
    why = _fields(icon, what, {"src": str}, {"mimeType": str, "sizes": list, "theme": str})
    if why is not None:
        return why
    if any(not isinstance(size, str) for size in icon.get("sizes") or []):
        return f"the sizes of {what} hold something other than strings"
    if icon.get("theme") is not None and icon["theme"] not in _THEMES:
        return f"the theme of {what} is neither light nor dark"
    return None


def problem(value: Any, recorded: Sequence[Any] = ()) -> str | None:
    """Why a replay could not read ``value`` (JSON data) as a ``CallToolResult``, or ``None`` when it can.

    ``recorded`` are the finished calls of the same tool found in the ledger: when every one of them holds
    structured content, the tool declares an output schema, which an MCP client checks the result against, so a
    result without structured content is refused. Names fields and types, never a value.
    """
    why = _outline_problem(value)
    if why is not None or not recorded or value.get("structuredContent") is not None:
        return why
    if all(isinstance(result, dict) and result.get("structuredContent") is not None for result in recorded):
        return (
            f"the {len(recorded)} finished call(s) of this tool found return structuredContent, and this result has "
            "none: an MCP client checks it against the tool's output schema, so it needs structuredContent as they "
            "hold it (replaysafe ledger show prints one)"
        )
    return None


def _outline_problem(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"it is {_kind(value)}, not a CallToolResult (an object)"
    extra = len(set(value) - _RESULT_FIELDS)
    if extra:
        fields = ", ".join(sorted(_RESULT_FIELDS))
        return f"it holds {extra} field(s) a CallToolResult does not have (its fields: {fields})"
    if "content" not in value:
        return "it has no content (an array of content blocks)"
    content = value["content"]
    if not isinstance(content, list):
        return f"its content is {_kind(content)}, not an array of content blocks"
    for n, block in enumerate(content):
        why = _block_problem(block, f"content[{n}]")
        if why is not None:
            return why
    if "isError" in value and not isinstance(value["isError"], bool):
        return f"its isError is {_kind(value['isError'])}, not true or false"
    if value.get("_meta") is not None and not isinstance(value["_meta"], dict):
        return f"its _meta is {_kind(value['_meta'])}, not an object or null"
    if "resultType" in value and value["resultType"] != "complete":
        return 'its resultType is not "complete" (a recorded result is final)'
    return None


def recognizes(value: Any) -> bool:
    """Whether a finished record's result is a recorded ``CallToolResult``: every field the protocol's JSON
    always writes is there, and content is an array. (A tool's own data rarely has all four.)"""
    return isinstance(value, dict) and value.keys() >= _ALWAYS_RECORDED and isinstance(value["content"], list)


SHAPE = ResultShape(
    name="mcp",
    who="MCP calls (replaysafe-mcp: replay_safe_session and ReplaySafeMiddleware)",
    expects='a CallToolResult, such as {"content": [{"type": "text", "text": "..."}], "isError": false} (content '
    "blocks of type text, image, audio, resource_link or resource; structuredContent and _meta optional)",
    text=text_result,
    problem=problem,
    recognizes=recognizes,
    threads=(THREAD_PREFIX,),
    unchecked="An MCP client checks structuredContent against the tool's output schema, if the tool declares one "
    "(fastmcp declares one for a tool with a return annotation): for such a tool, give --result a CallToolResult "
    'with structuredContent (--text writes none when no finished call shows it wrapped as {"result": ...}).',
)
