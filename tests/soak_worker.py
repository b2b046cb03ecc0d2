"""One soak worker process, run as
``python tests/soak_worker.py URL AUDIT RSS INDEX WORKERS KEYS SEED KILL_AFTER``.

It calls the protected ``charge(n)`` for its share of KEYS keys (n = INDEX, INDEX +
WORKERS, ...), and after about one call in twenty replays an earlier key. The tool
appends ``n attempt pid`` to the AUDIT log before returning. Every RSS_EVERY calls
the worker appends ``pid calls rss_bytes`` to RSS. A worker SIGKILLed and started again
goes through its keys from the start: finished ones replay.

With KILL_AFTER > 0 the worker is SIGKILLed once it has made that many calls: a timer
thread sends the signal a few milliseconds later while the calls go on, so the kill lands
wherever the worker then is (in a claim, the tool, a completion, between calls), and it
is certain: a worker whose kill is pending waits for it at the end.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading

from replaysafe import current_call, open_ledger, replay_safe, tool_call

#: Calls between two memory samples: often enough that a short run gives the soak a growth rate per call.
RSS_EVERY = 50


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main(url: str, audit: str, rss: str, index: int, workers: int, keys: int, seed: int, kill_after: int) -> None:
    ledger = open_ledger(url)
    rng = random.Random(seed)

    @replay_safe(ledger=ledger, timeout=None)
    def charge(n: int) -> str:
        info = current_call()
        assert info is not None
        append(audit, f"{n} {info.attempt} {os.getpid()}")
        return f"charged {n}"

    mine = list(range(index, keys, workers))
    calls = 0
    # The delay only scatters where the kill lands; that it lands never depends on it.
    killer = threading.Timer(random.Random(-seed).uniform(0, 0.02), os.kill, (os.getpid(), signal.SIGKILL))
    for position, n in enumerate(mine):
        targets = [n]
        if position and rng.random() < 0.05:
            targets.append(mine[rng.randrange(position)])  # a replay of an earlier call
        for target in targets:
            with tool_call("soak", f"msg_{target}", "call_1"):
                result = charge(target)
            if result != f"charged {target}":
                raise SystemExit(f"key {target} replayed {result!r}")
            calls += 1
            if calls % RSS_EVERY == 0:
                append(rss, f"{os.getpid()} {calls} {rss_bytes()}")
            if calls == kill_after:
                killer.start()
    if kill_after > 0:  # the kill was asked for: the worker never ends by itself
        if calls < kill_after:
            killer.start()
        killer.join()


if __name__ == "__main__":
    url, audit, rss, index, workers, keys, seed, kill_after = sys.argv[1:]
    main(url, audit, rss, int(index), int(workers), int(keys), int(seed), int(kill_after))
