"""Streaming tools: chunks flow to the caller between the protocol's two phases.

``begin`` claims the call (or replays its recorded chunks); the chunks are passed on
as they come, each under ``current_call()``; ``settle_result`` records them all when
the stream ends, ``settle_error`` when it fails or is closed early.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from typing import Any

from ._context import _current
from ._core import Replay, ToolSpec, begin, settle_error, settle_result
from ._deadlines import past, timeout_error
from ._drivers import Plan, _lease, adrive, drive, start
from ._leases import Lease
from ._renewer import renewer, start_renewing


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


def stream(
    spec: ToolSpec, plan: Plan, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Iterator[Any]:
    """Yield a streaming tool's chunks as they come; record them all when it ends.

    Its deadline is checked between chunks: a stream cannot be interrupted mid-chunk.
    """
    protocol, driving = start(begin, spec, plan, wrapped, args, kwargs)
    decision = drive(protocol, driving)
    if isinstance(decision, Replay):
        yield from decision.value
        return
    run = decision
    source = _leased(wrapped(*args, **kwargs), _lease(run, driving))
    chunks: list[Any] = []
    try:
        while True:
            # current_call() is set around each step only: the consumer runs in between.
            token = _current.set(run.call)
            try:
                chunk = next(source)
            except StopIteration:
                break
            finally:
                _current.reset(token)
            chunks.append(chunk)
            if past(run):
                raise timeout_error(spec.name, run, still_running=False)
            yield chunk
    except BaseException as exc:
        source.close()
        drive(settle_error(spec, plan.scope, run, exc), driving)
        raise
    drive(settle_result(spec, run, chunks), driving)


async def astream(
    spec: ToolSpec, plan: Plan, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> AsyncIterator[Any]:
    """``stream`` for async generator tools."""
    protocol, driving = start(begin, spec, plan, wrapped, args, kwargs)
    decision = await adrive(protocol, driving)
    if isinstance(decision, Replay):
        for chunk in decision.value:
            yield chunk
        return
    run = decision
    source = _aleased(wrapped(*args, **kwargs), _lease(run, driving))
    chunks: list[Any] = []
    try:
        while True:
            token = _current.set(run.call)
            try:
                chunk = await source.__anext__()
            except StopAsyncIteration:
                break
            finally:
                _current.reset(token)
            chunks.append(chunk)
            if past(run):
                raise timeout_error(spec.name, run, still_running=False)
            yield chunk
    except BaseException as exc:
        await source.aclose()
        await adrive(settle_error(spec, plan.scope, run, exc), driving)
        raise
    await adrive(settle_result(spec, run, chunks), driving)
