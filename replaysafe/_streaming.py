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

import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from typing import Any, NamedTuple

from ._context import _current
from ._core import Effect, Phase, Replay, begin, settle_error, settle_result
from ._deadlines import past, timeout_error
from ._drivers import Driving, Planned, _lease, adrive, drive
from ._leases import Lease
from ._owners import owner_token
from ._renewer import renewer

# What ``_flow`` asks for, each with its value: call this (awaiting what it returns in async code)
# and send back its result, hand this chunk to the consumer, hand these recorded chunks out.
_CALL, _HAND_OUT, _HAND_OUT_ALL = "call", "hand out", "hand out all"

Flow = Generator[tuple[str, Any], Any, None]


class _Flavor(NamedTuple):
    """What differs between sync and async streams: names and functions, no steps."""

    #: The tool's chunks with the call's lease kept alive while they flow.
    leased: Callable[[Any, Lease | None], Any]
    drive: Callable[[Any, Driving], Any]
    #: The source's method giving its next chunk, and what it raises at the end.
    next: str
    end: type[BaseException]
    close: str


def _flow(
    planned: Planned,
    wrapped: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    flavor: _Flavor,
) -> Flow:
    """A streaming call, once for sync and async.

    Its deadline is checked between chunks: a stream cannot be interrupted mid-chunk.
    """
    protocol, driving = planned
    spec, scope = driving.spec, driving.scope
    assert spec is not None
    assert scope is not None
    decision = yield _CALL, functools.partial(flavor.drive, protocol, driving)
    if isinstance(decision, Replay):
        yield _HAND_OUT_ALL, decision.value
        return
    run = decision
    source = flavor.leased(wrapped(*args, **kwargs), _lease(run, driving))
    fetch = getattr(source, flavor.next)
    chunks: list[Any] = []
    try:
        while True:
            # current_call() is set around each step only: the consumer runs in between.
            token = _current.set(run.call)
            try:
                chunk = yield _CALL, fetch
            except flavor.end:
                break
            finally:
                _current.reset(token)
            chunks.append(chunk)
            if past(run):
                raise timeout_error(spec.name, run, still_running=False)
            yield _HAND_OUT, chunk
    except BaseException as exc:
        yield _CALL, getattr(source, flavor.close)
        yield _CALL, functools.partial(flavor.drive, settle_error(spec, scope, run, exc), driving)
        raise
    yield _CALL, functools.partial(flavor.drive, settle_result(spec, run, chunks), driving)


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
    """``_leased`` for async streams: renewed by the renewer thread too (the stream may block its loop)."""
    renewer.add(lease)
    try:
        async for chunk in source:
            yield chunk
    finally:
        renewer.remove(lease)
        await source.aclose()


_SYNC = _Flavor(_leased, drive, "__next__", StopIteration, "close")
_ASYNC = _Flavor(_aleased, adrive, "__anext__", StopAsyncIteration, "aclose")


def begun_when_read(*planned: Any) -> Generator[Effect, Any, Any]:
    """``begin`` for a sync stream, given ``begin``'s arguments: planned when the stream is made but
    claimed when it is first read, under the owner token of the process that reads it then (a fork
    may come in between, and a token of the parent would keep a child's dead claim alive for as
    long as the parent lives), not the one taken when it was made (``begin``'s ``owner``, next to
    last)."""
    *before_owner, _made_by, host = planned
    claim: Phase = begin
    return (yield from claim(*before_owner, owner_token(), host))


def stream(
    planned: Planned, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Iterator[Any]:
    """Yield a streaming tool's chunks as they come (``planned``: its ``begun_when_read``); record them all
    when it ends."""
    return _iterate(_flow(planned, wrapped, args, kwargs, _SYNC))


def astream(
    planned: Planned, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> AsyncIterator[Any]:
    """``stream`` for async generator tools."""
    return _aiterate(_flow(planned, wrapped, args, kwargs, _ASYNC))


def _iterate(flow: Flow) -> Iterator[Any]:
    """Do what ``flow`` asks, with plain calls; hand its chunks to the consumer."""
    send, throw = flow.send, flow.throw
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            what, value = send(reply) if error is None else throw(error)
        except StopIteration:
            return
        try:
            if what is _CALL:
                reply, error = value(), None
            else:
                reply, error = (yield value) if what is _HAND_OUT else (yield from value), None
        except BaseException as exc:
            reply, error = None, exc


async def _aiterate(flow: Flow) -> AsyncIterator[Any]:
    """``_iterate`` with awaits (and no ``yield from``, which async generators lack)."""
    reply: Any = None
    error: BaseException | None = None
    while (step := _advance(flow, reply, error)) is not None:
        try:
            if step[0] is _CALL:
                reply, error = await step[1](), None
                continue
            for chunk in step[1] if step[0] is _HAND_OUT_ALL else (step[1],):
                yield chunk
            reply, error = None, None
        except BaseException as exc:
            reply, error = None, exc
