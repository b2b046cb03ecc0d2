"""Streaming tools: chunks flow to the caller between the protocol's two phases.

``begin`` claims the call (or replays its recorded chunks); the chunks are passed on
as they come, each under ``current_call()``; ``settle_result`` records them all when
the stream ends, ``settle_error`` when it fails or is closed early.

That sequence is written once, as a generator (``_flow``) that yields what is to be
done next: drive a phase of the protocol, take the source's next chunk, hand a chunk
to the consumer, close the source. ``stream`` and ``astream`` only do it, one with
plain calls and one with awaits, and send the outcome back (or throw its exception in).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import Any

from ._context import _current
from ._core import Replay, ToolSpec, begin, settle_error, settle_result
from ._deadlines import past, timeout_error
from ._drivers import Plan, _lease, adrive, drive, start
from ._leases import Lease
from ._renewer import renewer, start_renewing

# What ``_flow`` asks for, each with its value: drive this protocol phase (its result comes back),
# take the source's next chunk (the chunk comes back, or ``_END``), hand this chunk to the
# consumer, close the source.
_DRIVE, _NEXT, _HAND_OUT, _CLOSE = "drive", "next", "hand out", "close"

#: The source has no more chunks.
_END: Any = object()

Flow = Generator[tuple[str, Any], Any, None]


def _flow(
    spec: ToolSpec,
    plan: Plan,
    wrapped: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    leased: Callable[[Any, Lease | None], Any],
) -> Flow:
    """A streaming call, once for sync and async: ``leased`` keeps the lease of the tool's chunks.

    Its deadline is checked between chunks: a stream cannot be interrupted mid-chunk.
    """
    protocol, driving = start(begin, spec, plan, wrapped, args, kwargs)
    decision = yield _DRIVE, (protocol, driving)
    if isinstance(decision, Replay):
        for chunk in decision.value:
            yield _HAND_OUT, chunk
        return
    run = decision
    source = leased(wrapped(*args, **kwargs), _lease(run, driving))
    chunks: list[Any] = []
    try:
        while True:
            # current_call() is set around each step only: the consumer runs in between.
            token = _current.set(run.call)
            try:
                chunk = yield _NEXT, source
            finally:
                _current.reset(token)
            if chunk is _END:
                break
            chunks.append(chunk)
            if past(run):
                raise timeout_error(spec.name, run, still_running=False)
            yield _HAND_OUT, chunk
    except BaseException as exc:
        yield _CLOSE, source
        yield _DRIVE, (settle_error(spec, plan.scope, run, exc), driving)
        raise
    yield _DRIVE, (settle_result(spec, run, chunks), driving)


def _advance(flow: Flow, reply: Any, error: BaseException | None) -> tuple[str, Any] | None:
    """What ``flow`` asks for next, given the last outcome; ``None`` once it ended."""
    try:
        return flow.send(reply) if error is None else flow.throw(error)
    except StopIteration:
        return None


def _leased(source: Iterator[Any], lease: Lease | None) -> Generator[Any, None, None]:
    """``source``'s chunks, with the call's lease renewed from the first chunk until the
    stream ends or is closed (the consumer's time between chunks included)."""
    renewer.add(lease)
    try:
        yield from source
    finally:
        renewer.remove(lease)


async def _aleased(source: AsyncGenerator[Any, None], lease: Lease | None) -> AsyncGenerator[Any, None]:
    """``_leased`` for async streams: a renewal task in this loop."""
    renewing = start_renewing(lease)
    try:
        async for chunk in source:
            yield chunk
    finally:
        if renewing is not None:
            renewing.cancel()
        await source.aclose()


#: How each request of ``_flow`` other than handing out a chunk is done, sync and async.
_SYNC: dict[str, Callable[[Any], Any]] = {
    _DRIVE: lambda job: drive(*job),
    _NEXT: lambda source: next(source, _END),
    _CLOSE: lambda source: source.close(),
}
_ASYNC: dict[str, Callable[[Any], Awaitable[Any]]] = {
    _DRIVE: lambda job: adrive(*job),
    _NEXT: lambda source: anext(source, _END),
    _CLOSE: lambda source: source.aclose(),
}


def stream(
    spec: ToolSpec, plan: Plan, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Iterator[Any]:
    """Yield a streaming tool's chunks as they come; record them all when it ends."""
    return _iterate(_flow(spec, plan, wrapped, args, kwargs, _leased))


def astream(
    spec: ToolSpec, plan: Plan, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> AsyncIterator[Any]:
    """``stream`` for async generator tools."""
    return _aiterate(_flow(spec, plan, wrapped, args, kwargs, _aleased))


def _iterate(flow: Flow) -> Iterator[Any]:
    """Do what ``flow`` asks, with plain calls; hand its chunks to the consumer."""
    reply: Any = None
    error: BaseException | None = None
    while (step := _advance(flow, reply, error)) is not None:
        try:
            reply, error = (yield step[1]) if step[0] is _HAND_OUT else _SYNC[step[0]](step[1]), None
        except BaseException as exc:
            reply, error = None, exc


async def _aiterate(flow: Flow) -> AsyncIterator[Any]:
    """``_iterate`` with awaits."""
    reply: Any = None
    error: BaseException | None = None
    while (step := _advance(flow, reply, error)) is not None:
        try:
            if step[0] is _HAND_OUT:
                reply, error = (yield step[1]), None
            else:
                reply, error = await _ASYNC[step[0]](step[1]), None
        except BaseException as exc:
            reply, error = None, exc
