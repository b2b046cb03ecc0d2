"""The client side: ``replay_safe_session`` claims and records ``tools/call`` requests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

import anyio
from mcp import ClientSession
from mcp.types import CallToolResult, PaginatedRequestParams, Tool, ToolAnnotations

from replaysafe import InDoubt, Ledger, ResultEncodingError, current_call_or_none, replay_safe
from replaysafe.http import next_request_key

#: The request ``_meta`` entry that carries the call's idempotency key to the server.
META_KEY = "io.replaysafe/idempotency-key"

S = TypeVar("S")
Send = Callable[[str | None], Awaitable[CallToolResult]]

#: ``@replay_safe`` options the adapters set themselves: the tool's name, what is digested, how results are stored.
RESERVED_OPTIONS = frozenset({"name", "exclude_args", "serializer", "on_missing_ids"})
#: The most pages of tools/list read to find the tools' annotations.
_MAX_PAGES = 100


class CallToolResultSerializer:
    """Records a ``CallToolResult`` as the JSON the protocol sends, and rebuilds the same model from it.

    Every field is written (content blocks with their types, ``isError``, ``structuredContent``,
    ``_meta``), so a replay returns a result equal to the first one, of the same type.
    """

    def dumps(self, value: Any, /) -> str:
        if isinstance(value, Mapping):  # a reconciler may return the result as data
            value = CallToolResult.model_validate(value)
        if not isinstance(value, CallToolResult):
            raise ResultEncodingError(f"an MCP tool call records a CallToolResult, not {type(value).__name__}")
        return value.model_dump_json(by_alias=True)

    def loads(self, text: str, /) -> CallToolResult:
        return CallToolResult.model_validate_json(text)


_SERIALIZER = CallToolResultSerializer()


class ToolResultError(Exception):
    """An ``isError`` result, raised inside the protected call so that it follows the rule for a tool that raises.

    Such a result is the tool's failure: it is not recorded (the claim is released and a resume sends the call
    again), as every adapter treats a tool that raises, unless ``record_errors=`` covers this class
    (``record_errors=True`` does): then the result is recorded and replayed as it came. Either way the session
    returns the ``CallToolResult`` itself to its caller, never this exception.
    """

    def __init__(self, tool_name: str, result: CallToolResult) -> None:
        super().__init__(f"the MCP tool {tool_name} answered with an isError result")
        self.result = result


async def _call_tool(name: str, arguments: dict[str, Any], send: Send, record_error_results: bool) -> CallToolResult:
    """The body the session protects: one tools/call, keyed with the protected call's idempotency key.
    Outside ``tool_call(...)`` it runs unprotected (the decorator has warned): sent without a key."""
    call = current_call_or_none()
    result = await send(call.idempotency_key if call is not None else None)
    if result.is_error and not record_error_results:
        raise ToolResultError(name, result)
    return result


def _records_error_results(record_errors: Any) -> bool:
    """Whether ``record_errors=`` (as ``@replay_safe`` takes it) covers an ``isError`` result."""
    if isinstance(record_errors, bool):
        return record_errors
    classes = (record_errors,) if isinstance(record_errors, type) else tuple(record_errors or ())
    return issubclass(ToolResultError, classes)


def _with_key(meta: Mapping[str, Any] | None, key: str | None) -> dict[str, Any] | None:
    """``meta`` plus the key; a key the caller put there is kept."""
    if key is None:
        return dict(meta) if meta is not None else None
    return {META_KEY: key, **(meta or {})}


def in_doubt_default(annotations: ToolAnnotations | None) -> InDoubt | None:
    """``"raise"`` for a tool that is destructive and not idempotent; ``None`` (the library's default) otherwise.

    Absent hints take the protocol's defaults: ``destructiveHint`` true, ``idempotentHint`` false.
    """
    destructive = True if annotations is None or annotations.destructive_hint is None else annotations.destructive_hint
    idempotent = annotations is not None and bool(annotations.idempotent_hint)
    return "raise" if destructive and not idempotent else None


class ReplaySafeSession:
    """An MCP client session whose ``call_tool`` is claimed and recorded; everything else is the session's own.

    Made by :func:`replay_safe_session`.
    """

    def __init__(self, session: Any, ledger: Ledger | None, trust_annotations: bool, options: dict[str, Any]) -> None:
        self.__wrapped__ = session
        self._ledger = ledger
        self._trust_annotations = trust_annotations
        self._in_doubt: InDoubt | None = options.pop("in_doubt", None)
        self._record_error_results = _records_error_results(options.get("record_errors", False))
        self._options = options
        self._annotations: dict[str, ToolAnnotations | None] | None = None
        self._listing = anyio.Lock()
        self._protected: dict[tuple[str, object], Callable[..., Awaitable[CallToolResult]]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *args: Any,
        meta: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> CallToolResult:
        """The session's ``call_tool``: inside ``tool_call(...)``, claimed, keyed and recorded."""
        if kwargs.get("allow_input_required") or kwargs.get("allow_claimed"):
            raise TypeError(
                f"call_tool({name!r}): a replay-safe session records final results only; "
                "allow_input_required and allow_claimed are not supported. Use mcp.Client.call_tool, "
                "which completes input rounds itself, wrapped with replay_safe_session."
            )

        async def send(key: str | None) -> CallToolResult:
            result = await self.__wrapped__.call_tool(name, arguments, *args, meta=_with_key(meta, key), **kwargs)
            return cast(CallToolResult, result)

        if current_call_or_none() is not None:
            # Inside another protected tool: its record covers this call. The request still carries a key,
            # the enclosing call's key plus its ordinal, so that a keyed server dedupes it.
            return await send(next_request_key())
        annotations = await self._annotations_of(name) if self._trust_annotations else None
        if self._trust_annotations and annotations is not None and annotations.read_only_hint:
            return await send(None)  # reads need no claim
        in_doubt = self._in_doubt
        if in_doubt is None and self._trust_annotations:
            in_doubt = in_doubt_default(annotations)
        protected = self._protected_call(name, in_doubt)
        try:
            return await protected(name, dict(arguments or {}), send, self._record_error_results)
        except ToolResultError as error:
            return error.result  # the tool's failure, not recorded: the caller sees the result the server sent

    def _protected_call(self, name: str, in_doubt: InDoubt | None) -> Callable[..., Awaitable[CallToolResult]]:
        # One protected function per tool, so that a missing tool_call(...) warns once per tool.
        protected = self._protected.get((name, in_doubt))
        if protected is None:
            settings = dict(self._options)
            if in_doubt is not None:
                settings["in_doubt"] = in_doubt
            protected = replay_safe(
                ledger=self._ledger,
                name=name,
                exclude_args=("send", "record_error_results"),
                serializer=_SERIALIZER,
                **settings,
            )(_call_tool)
            self._protected[(name, in_doubt)] = protected
        return protected

    async def _annotations_of(self, name: str) -> ToolAnnotations | None:
        """The tool's annotations from ``tools/list``, read once per session (again for a tool not listed)."""
        if self._annotations is None or name not in self._annotations:
            async with self._listing:
                if self._annotations is None or name not in self._annotations:
                    listed = {tool.name: tool.annotations for tool in await _list_tools(self.__wrapped__)}
                    listed.setdefault(name, None)  # not listed: no hints, and no second listing for it
                    self._annotations = {**(self._annotations or {}), **listed}
        return self._annotations[name]


async def _list_tools(session: Any) -> list[Tool]:
    """Every tool the server lists, page by page (``ClientSession`` and ``mcp.Client`` page differently)."""
    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        if cursor is None:
            page = await session.list_tools()
        elif isinstance(session, ClientSession):
            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        else:
            page = await session.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def replay_safe_session(
    session: S, *, ledger: Ledger | None = None, trust_annotations: bool = True, **options: Any
) -> S:
    """Wrap an MCP client session so that ``call_tool`` made inside ``tool_call(...)`` runs at most once.

    ``session`` is the SDK's ``ClientSession`` or ``Client`` (or anything with the same ``call_tool``).
    Each call is claimed in the ledger before it is sent, carries the call's idempotency key in its
    ``_meta`` under ``"io.replaysafe/idempotency-key"``, and its ``CallToolResult`` is recorded;
    a replay returns the recorded result without sending anything. ``options`` are ``@replay_safe``
    options (``in_doubt=``, ``record_errors=``, ``lease=``...).

    An ``isError`` result is the tool's failure and follows the rule for a tool that raises: it is
    returned to the caller but not recorded, so a resume sends the call again, unless ``record_errors=``
    covers it (``True``, or a tuple holding ``ToolResultError`` or a base of it): then it is recorded and
    a replay returns it without sending.

    The tools' annotations (read once with ``tools/list``) set the defaults: a ``readOnlyHint`` tool
    is called without a claim, and a tool that is destructive and not idempotent (the protocol's
    defaults for a tool without hints) is ``in_doubt="raise"``. ``in_doubt=`` overrides the latter;
    ``trust_annotations=False`` ignores the hints (every call is claimed), for servers you do not trust.
    """
    reserved = sorted(RESERVED_OPTIONS.intersection(options))
    if reserved:
        raise TypeError(f"replay_safe_session(): {', '.join(reserved)} is set by the session itself")
    return cast(S, ReplaySafeSession(session, ledger, trust_annotations, dict(options)))
