"""A worker process for lease tests, run as ``python -m tests.lease_worker``.

``KIND LEDGER_URL EFFECTS THREAD LEASE SECONDS WAIT``: call ``send_invitations`` once
under fixed ids and print what it returned (or the name of the error it raised).
The tool appends ``ran <pid>`` to EFFECTS, then works for SECONDS. KIND is ``sync``
(no timeout), ``sync-worker`` (a timeout, called off the main thread, so it runs in
the worker pool), ``async``, ``async-blocking`` (an async tool that blocks its event loop),
``stream`` or ``astream``. LEASE is the lease in seconds
(``none``: derived from the timeout); WAIT the seconds a replay waits for a live owner.

Files are created world-writable: the hidepid test runs workers as two users.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from replaysafe import ReplaySafeError, open_ledger, replay_safe, tool_call


def append(path: str, line: str) -> None:
    # O_APPEND writes of one short line are atomic across processes.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def main(kind: str, url: str, effects: str, thread: str, lease_text: str, seconds_text: str, wait_text: str) -> None:
    os.umask(0)
    ledger = open_ledger(url)
    lease = None if lease_text == "none" else float(lease_text)
    seconds, wait = float(seconds_text), float(wait_text)
    # Fail closed: a ledger error must not pass for a second execution or its absence.
    options: dict[str, Any] = {
        "ledger": ledger,
        "lease": lease,
        "wait_timeout": wait,
        "timeout": None,
        "on_ledger_error": "raise",
    }
    outcome: list[Any] = []

    def record(call: Any) -> None:
        try:
            with tool_call(thread, "msg_1", "call_1"):
                outcome.append(call())
        except ReplaySafeError as exc:
            outcome.append(type(exc).__name__)

    if kind == "sync":

        @replay_safe(**options)
        def send_invitations(count: int) -> str:
            append(effects, f"ran {os.getpid()}")
            time.sleep(seconds)
            return f"sent {count} by {os.getpid()}"

        record(lambda: send_invitations(3))
    elif kind == "sync-worker":

        @replay_safe(**{**options, "timeout": seconds * 10})
        def send_invitations(count: int) -> str:
            append(effects, f"ran {os.getpid()}")
            time.sleep(seconds)
            return f"sent {count} by {os.getpid()}"

        # Off the main thread a sync tool with a timeout runs in the worker pool.
        caller = threading.Thread(target=record, args=(lambda: send_invitations(3),))
        caller.start()
        caller.join()
    elif kind == "async":

        @replay_safe(**options)
        async def send_invitations(count: int) -> str:
            append(effects, f"ran {os.getpid()}")
            await asyncio.sleep(seconds)
            return f"sent {count} by {os.getpid()}"

        async def call_async() -> None:
            try:
                with tool_call(thread, "msg_1", "call_1"):
                    outcome.append(await send_invitations(3))
            except ReplaySafeError as exc:
                outcome.append(type(exc).__name__)

        asyncio.run(call_async())
    elif kind == "async-blocking":

        @replay_safe(**options)
        async def send_invitations(count: int) -> str:
            append(effects, f"ran {os.getpid()}")
            time.sleep(seconds)  # sync work inside an async tool: its event loop is blocked meanwhile  # noqa: ASYNC251
            return f"sent {count} by {os.getpid()}"

        async def call_blocking() -> None:
            try:
                with tool_call(thread, "msg_1", "call_1"):
                    outcome.append(await send_invitations(3))
            except ReplaySafeError as exc:
                outcome.append(type(exc).__name__)

        asyncio.run(call_blocking())
    elif kind == "stream":

        @replay_safe(**options)
        def send_invitations(count: int) -> Iterator[str]:
            append(effects, f"ran {os.getpid()}")
            for n in range(count):
                time.sleep(seconds / count)
                yield f"sent {n} by {os.getpid()}"

        record(lambda: list(send_invitations(3)))
    elif kind == "astream":

        @replay_safe(**options)
        async def send_invitations(count: int) -> AsyncIterator[str]:
            append(effects, f"ran {os.getpid()}")
            for n in range(count):
                await asyncio.sleep(seconds / count)
                yield f"sent {n} by {os.getpid()}"

        async def consume() -> None:
            try:
                with tool_call(thread, "msg_1", "call_1"):
                    outcome.append([chunk async for chunk in send_invitations(3)])
            except ReplaySafeError as exc:
                outcome.append(type(exc).__name__)

        asyncio.run(consume())
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    ledger.close()
    print(json.dumps(outcome[0]), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:8])
