"""Result shapes: how the adapter that records a call writes its result, told to ``replaysafe ledger resolve``.

A call settled by hand is replayed by the adapter that claimed it, through that adapter's serializer: an MCP
call reads back a ``CallToolResult``, a tool recorded by replaysafe's JSON codec any JSON value. The command
runs in another process than the tool: it cannot import the tool, and the library never imports an agent
framework. So an adapter states its shape as a ``ResultShape`` (data, and plain functions over JSON data) in
a module that imports no framework, and names it by an entry point of the group ``replaysafe.result_shapes``::

    [project.entry-points."replaysafe.result_shapes"]
    mcp = "replaysafe_mcp._shape:SHAPE"

The JSON codec's own shape, ``json``, is built in. Which shape a record was written in is told by ``evidence``:
an in-doubt record holds no result and names no adapter, so only the call's key space (a thread id prefix one
adapter alone writes) or finished records of the same tool that a shape recognizes as its own can tell it;
otherwise it cannot be known, and the command says so.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ._json import TAG_KEY

#: The entry point group an adapter names its ``ResultShape`` in.
ENTRY_POINTS = "replaysafe.result_shapes"
#: The built-in shape's name: what replaysafe's JSON codec records.
JSON_NAME = "json"
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}")
#: A class or field name read from a record, shown only if it looks like one (never arbitrary stored text).
_SHOWN_NAME = re.compile(r"[\w.<>\[\], ]{1,200}")
_FIELDS_SHOWN = 12


def _no_problem(value: Any, recorded: Sequence[Any], /) -> str | None:
    return None


def _recognizes_nothing(value: Any, /) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class ResultShape:
    """How an adapter records a tool's result, for ``replaysafe ledger resolve``: no framework needed to read it.

    Every function takes and returns JSON data (what ``json.loads`` gives), never a framework's objects, and
    no message it returns quotes a value: it names fields, positions and JSON types. ``recorded`` is the JSON
    data of the finished calls of the same tool found in the ledger that this shape ``recognizes`` (often none):
    what the tool returned before, to write and check a result like it.
    """

    #: What ``--shape`` calls it: lowercase letters, digits, ``-`` and ``_``.
    name: str
    #: Which calls record it, for a person: ``"MCP calls (replaysafe-mcp)"``.
    who: str
    #: What a replay reads, for a person, with an example of the form and no real value.
    expects: str
    #: ``text(text, recorded)``: the JSON data a plain text result is recorded as (``--text``).
    text: Callable[[str, Sequence[Any]], Any]
    #: ``problem(value, recorded)``: why a replay could not read this JSON data, or ``None`` when it can.
    problem: Callable[[Any, Sequence[Any]], str | None] = _no_problem
    #: Whether a finished record's result (its JSON data) was written in this shape: the evidence that tells
    #: which shape a call of the same tool is read in. Only a form no other shape writes.
    recognizes: Callable[[Any], bool] = _recognizes_nothing
    #: Thread id prefixes under which only this shape's adapter records calls (its own key space).
    threads: tuple[str, ...] = ()
    #: What ``problem`` cannot check when no finished call of the tool is found, said to the operator then.
    unchecked: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"a result shape's name is lowercase letters, digits, - and _ (max 40): {self.name!r}")


def _codec_tagged(value: Any) -> bool:
    """A value replaysafe's JSON codec tagged at the top (a dataclass, a model, a tuple, a datetime...)."""
    return isinstance(value, dict) and len(value) == 2 and isinstance(value.get(TAG_KEY), str) and "v" in value


JSON = ResultShape(
    name=JSON_NAME,
    who="tools recorded by replaysafe's JSON codec (@replay_safe, and the LangGraph, Pydantic AI, OpenAI Agents "
    "SDK, sdk_loops and 10xGraph adapters)",
    expects="any JSON value, returned as it is (a tool whose return annotation names a class rebuilds it from an "
    "object holding its fields)",
    text=lambda text, recorded: text,
    recognizes=_codec_tagged,
)


@dataclasses.dataclass(frozen=True)
class Installed:
    """The shapes this environment knows, by name (``json`` first), and why any entry point was left out."""

    shapes: dict[str, ResultShape]
    skipped: tuple[str, ...] = ()

    def adapters(self) -> list[ResultShape]:
        return [shape for name, shape in self.shapes.items() if name != JSON_NAME]


def installed() -> Installed:
    """``json`` and every shape an installed package names in the ``replaysafe.result_shapes`` entry points.

    An entry point that fails to load, or that is not a ``ResultShape`` of its own name, is left out and
    said so; it never stops the command.
    """
    from importlib.metadata import entry_points

    shapes: dict[str, ResultShape] = {JSON_NAME: JSON}
    skipped: list[str] = []
    for point in sorted(entry_points(group=ENTRY_POINTS), key=lambda p: (p.name, p.value)):
        package = point.dist.name if point.dist is not None else "an unnamed package"
        try:
            shape = point.load()
        except Exception as exc:  # a broken plugin: say which, go on without it
            skipped.append(f"the result shape {point.name!r} of {package} does not load ({type(exc).__name__})")
            continue
        if not isinstance(shape, ResultShape) or shape.name != point.name:
            skipped.append(f"the entry point {point.name!r} of {package} is not a ResultShape named {point.name!r}")
        elif point.name in shapes:
            skipped.append(f"the result shape {point.name!r} of {package} is named twice; the first one is used")
        else:
            shapes[point.name] = shape
    return Installed(shapes, tuple(skipped))


# --- what a record's neighbours tell --------------------------------------------------------------


class Form(NamedTuple):
    """What a JSON value is, for a person (its JSON type, or the class or type the JSON codec tagged), and
    whether it is a class that a return annotation rebuilds from an object holding its fields."""

    text: str
    from_object: bool = False

    def __str__(self) -> str:
        return self.text


def form_of(value: Any) -> Form:
    """What a JSON value is: its JSON type, or the class or type replaysafe's JSON codec tagged it as."""
    if _codec_tagged(value):
        tag, payload = value[TAG_KEY], value["v"]
        if tag in ("dataclass", "model", "enum", "flag") and isinstance(payload, list) and len(payload) >= 2:
            name = f"{payload[0]}.{payload[1]}"
            shown = name if _SHOWN_NAME.fullmatch(name) else "a class"
            kind = {"model": "pydantic model", "flag": "Flag", "enum": "Enum"}.get(tag, tag)
            fields = _field_names(payload[2]) if tag in ("dataclass", "model") and len(payload) > 2 else ""
            return Form(f"a {shown} ({kind}{fields})", from_object=tag in ("dataclass", "model"))
        return Form(f"a {tag}" if _SHOWN_NAME.fullmatch(str(tag)) else "a tagged value")
    return Form(_json_type(value))


def _field_names(fields: Any) -> str:
    if not isinstance(fields, dict):
        return ""
    names = [name for name in fields if isinstance(name, str) and _SHOWN_NAME.fullmatch(name)]
    more = len(fields) - len(names[:_FIELDS_SHOWN])
    listed = ", ".join(names[:_FIELDS_SHOWN]) + (f" and {more} more" if more else "")
    return f"; fields {listed}" if listed else ""


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    if value is None:
        return "null"
    for kind, name in ((str, "a JSON string"), ((int, float), "a JSON number"), (list, "a JSON array")):
        if isinstance(value, kind):
            return name
    return "a JSON object"


@dataclasses.dataclass(frozen=True)
class Evidence:
    """Which shape a replay of the call reads, and what said so."""

    #: The shape, or ``None`` when nothing tells it.
    shape: ResultShape | None
    #: What told it (or why nothing does), for a person.
    told_by: str
    #: The forms of the finished records of the same tool that were read, each with how many hold it.
    forms: Counter[Form]
    #: The JSON data of those the shape recognizes as its own: what the tool returned before, in its shape.
    recorded: tuple[Any, ...] = ()
    #: A shape the ledger shows that ``--shape`` contradicts, and the ledger's evidence for it.
    contradicted: tuple[ResultShape, str] | None = None


def evidence(
    tool: str,
    thread_id: str,
    finished: Iterable[str],
    shapes: Mapping[str, ResultShape],
    given: str | None = None,
) -> Evidence:
    """Which shape a replay of a call of ``tool`` under ``thread_id`` reads.

    ``finished`` is the result text of finished records of the same tool (unsealed, real results only);
    ``given`` the shape the operator named. Told, in this order: by the operator, by the call's key space
    (a shape's ``threads``), by finished records a shape recognizes (all of those recognized, by one shape).
    """
    forms: Counter[Form] = Counter()
    recognized: dict[str, list[Any]] = {}
    read = 0
    for text in finished:
        read += 1
        try:
            data = json.loads(text)
        except ValueError:
            forms[Form("text that is not JSON (another serializer's)")] += 1
            continue
        forms[form_of(data)] += 1
        for shape in shapes.values():
            if shape.recognizes(data):
                recognized.setdefault(shape.name, []).append(data)
                break
    votes = {name: len(found) for name, found in recognized.items()}
    ledger_shape, ledger_says = _told_by_the_ledger(tool, thread_id, votes, read, shapes)
    if given is not None:
        shape = shapes[given]
        contradicted = None
        if ledger_shape is not None and ledger_shape is not shape:
            contradicted = (ledger_shape, ledger_says)
        return Evidence(shape, "--shape", forms, tuple(recognized.get(shape.name, ())), contradicted)
    mine = tuple(recognized.get(ledger_shape.name, ())) if ledger_shape is not None else ()
    return Evidence(ledger_shape, ledger_says, forms, mine)


def _told_by_the_ledger(
    tool: str, thread_id: str, votes: Mapping[str, int], read: int, shapes: Mapping[str, ResultShape]
) -> tuple[ResultShape | None, str]:
    for shape in shapes.values():
        prefix = next((p for p in shape.threads if thread_id.startswith(p)), None)
        if prefix is not None:
            return shape, f"its thread id is in the key space {prefix!r}, where only {shape.who} record calls"
    if len(votes) == 1:
        ((name, count),) = votes.items()
        return shapes[name], f"{count} of the {read} finished record(s) of {tool} read here are {name}-shaped"
    if votes:
        listed = ", ".join(f"{count} {name}" for name, count in sorted(votes.items()))
        return None, f"the finished records of {tool} read here disagree ({listed})"
    if read:
        return None, (
            f"the record does not say which adapter wrote it, and none of the {read} finished record(s) of {tool} "
            "read here is in a form only one shape writes"
        )
    return None, f"the record does not say which adapter wrote it, and no finished record of {tool} was found"
