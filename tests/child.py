"""A stand-alone agent-like process for crash and race tests, run as ``python tests/child.py``.

``crash LEDGER_URL EFFECTS THREAD POINT``: call ``refund_order`` once under fixed ids,
print its result as JSON, and SIGKILL itself at POINT (``inside-tool``: after the
side effect, before returning; ``after-record``: after the protected call returned,
so its record is written; ``none``: exit normally).

``race LEDGER_URL EFFECTS THREAD KEYS THREADS``: print ``ready``, wait for a line on
stdin (the parent's go, once every racer is ready), then THREADS threads each call
``refund_order`` for KEYS keys at once; print every result, and how many claims found
a call running under another owner (waits), as JSON. The owner of key 0 holds it until
a waiter of this process has found it running, so each race has at least one wait.

``matrix LEDGER_URL EFFECTS THREAD POINT``: call ``refund_order`` (whose side effect
is a line ``<idempotency key> <attempt>`` in EFFECTS) and SIGKILL itself at POINT:
``before-claim``, ``before-body`` (claimed, body not started), ``after-effect``
(inside the body, after the side effect), ``before-record`` (returned, record not
yet written), ``after-record``.

``hold LEDGER_URL THREAD``: claim ``refund_order`` and keep running inside it until
killed (a live owner); prints ``claimed`` once the claim is written.

``stream LEDGER_URL EFFECTS THREAD``: consume a streaming tool and SIGKILL itself
after its second chunk.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from waiting import SeesWaiting  # tests/, this script's own directory

from replaysafe import current_call, open_ledger, replay_safe, tool_call


def append(path: str, line: str) -> None:
    # O_APPEND writes of one short line are atomic across processes.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def crash(url: str, effects: str, thread: str, point: str) -> None:
    ledger = open_ledger(url)

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str, amount: float) -> str:
        append(effects, f"refund {order_id} pid={os.getpid()}")
        if point == "inside-tool":
            os.kill(os.getpid(), signal.SIGKILL)
        return f"Refunded {amount:.2f} for order {order_id}"

    with tool_call(thread, "msg_7", "call_1"):
        result = refund_order("1042", 59.0)
    print(json.dumps({"result": result, "pid": os.getpid()}), flush=True)
    if point == "after-record":
        os.kill(os.getpid(), signal.SIGKILL)


def race(url: str, effects: str, thread: str, keys: int, threads: int) -> None:
    observed = SeesWaiting(open_ledger(url))

    @replay_safe(ledger=observed, wait_timeout=120)
    def refund_order(order_id: str) -> str:
        append(effects, order_id)
        if order_id == "0":
            # The other threads of this process race for key 0 too: one of them finds it running.
            observed.waited.wait(60)
        time.sleep(0.01)  # hold the claim a moment so that others find it running
        return f"{order_id} by {os.getpid()}/{threading.get_ident()}"

    results: list[list[str]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads)

    def worker(n: int) -> None:
        start.wait()
        for key in range(keys):
            with tool_call(thread, f"msg_{key}", "call_1"):
                results[n].append(refund_order(str(key)))

    print("ready", flush=True)
    sys.stdin.readline()
    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(json.dumps({"results": results, "waits": observed.waits}), flush=True)


class KillBeforeRecord:
    """A ledger that dies (SIGKILL) when asked to write a call's result: the crash lands
    exactly between the tool's return and its record."""

    def __init__(self, ledger: Any) -> None:
        self._ledger = ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def complete(self, *args: Any, **kwargs: Any) -> bool:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


def refund_with_effect(ledger: Any, effects: str, kill_at: str) -> Any:
    """The matrix's tool: same name, parameters and side effect as the resuming test's."""

    @replay_safe(ledger=ledger)
    def refund_order(order_id: str, amount: float) -> str:
        info = current_call()
        assert info is not None
        if kill_at == "before-body":
            os.kill(os.getpid(), signal.SIGKILL)
        append(effects, f"{info.idempotency_key} {info.attempt}")
        if kill_at == "after-effect":
            os.kill(os.getpid(), signal.SIGKILL)
        return f"Refunded {amount:.2f} for order {order_id}"

    return refund_order


def matrix(url: str, effects: str, thread: str, point: str) -> None:
    ledger = open_ledger(url)
    tool = refund_with_effect(KillBeforeRecord(ledger) if point == "before-record" else ledger, effects, point)
    with tool_call(thread, "msg_7", "call_1"):
        if point == "before-claim":
            os.kill(os.getpid(), signal.SIGKILL)
        tool("1042", 59.0)
    if point == "after-record":
        os.kill(os.getpid(), signal.SIGKILL)


def hold(url: str, thread: str) -> None:
    ledger = open_ledger(url)

    @replay_safe(ledger=ledger, lease=1, timeout=None)
    def refund_order(order_id: str, amount: float) -> str:
        print("claimed", flush=True)
        time.sleep(600)
        return "never"

    with tool_call(thread, "msg_7", "call_1"):
        refund_order("1042", 59.0)


def stream_and_die(url: str, effects: str, thread: str) -> None:
    ledger = open_ledger(url)

    @replay_safe(ledger=ledger)
    def lines(n: int) -> Iterator[str]:
        for i in range(n):
            append(effects, f"chunk {i}")
            yield f"line {i}"

    with tool_call(thread, "msg_1", "call_1"):
        for i, _ in enumerate(lines(5)):
            if i == 1:
                os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    command, *argv = sys.argv[1:]
    if command == "crash":
        crash(*argv)
    elif command == "matrix":
        matrix(*argv)
    elif command == "hold":
        hold(*argv)
    elif command == "stream":
        stream_and_die(*argv)
    else:
        url, effects, thread, keys, threads = argv
        race(url, effects, thread, int(keys), int(threads))
