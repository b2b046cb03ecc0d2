"""8 processes x 4 threads replay the same 200 keys at once, on each server ledger.

Every tool body must run exactly once per key (counted in a file outside the
ledger) and every caller must get the same result. Run as a script, this file is
one of the racing processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

PROCESSES, THREADS, KEYS = 8, 4, 200


def _race(url: str, effects: str, thread: str, start: float) -> None:
    """One racing process: THREADS threads each call the tool for every key, from START on."""
    from replaysafe import open_ledger, replay_safe, tool_call

    ledger = open_ledger(url)

    @replay_safe(ledger=ledger, wait_timeout=120)
    def send_invoice(invoice: int) -> str:
        # One short O_APPEND write per execution is atomic across processes.
        fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{invoice}\n".encode())
        finally:
            os.close(fd)
        return f"invoice {invoice} sent by {os.getpid()}/{threading.get_ident()}"

    results: list[list[str]] = [[] for _ in range(THREADS)]

    def worker(n: int) -> None:
        # Each thread walks the keys from another offset, so that claims collide everywhere.
        for i in range(KEYS):
            key = (i + n * KEYS // THREADS) % KEYS
            with tool_call(thread, f"msg-{key}", "call"):
                results[n].append(f"{key}={send_invoice(key)}")

    time.sleep(max(0.0, start - time.time()))
    workers = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    ledger.close()
    print(json.dumps(results), flush=True)


def _run_race(url: str, tmp_path: Path) -> None:
    effects = tmp_path / "effects.log"
    thread = f"race-{uuid.uuid4().hex[:8]}"
    start = time.time() + 3.0  # every process imported and connected before the gun
    children = [
        subprocess.Popen(
            [sys.executable, __file__, url, str(effects), thread, str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    outputs = [child.communicate(timeout=600) for child in children]
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
    seen: dict[str, set[str]] = {}
    for out, _ in outputs:
        for per_thread in json.loads(out):
            assert len(per_thread) == KEYS
            for entry in per_thread:
                key, _, result = entry.partition("=")
                seen.setdefault(key, set()).add(result)
    assert len(seen) == KEYS
    assert all(len(results) == 1 for results in seen.values()), "callers of one key got different results"
    executions = effects.read_text().split()
    assert sorted(executions, key=int) == [str(k) for k in range(KEYS)], "a tool body ran twice, or never"


@pytest.mark.slow
def test_postgres_race(postgres_url: str, tmp_path: Path) -> None:
    """PostgreSQL: 8 x 4 callers on 200 keys: each body runs once, everyone gets its result."""
    _run_race(postgres_url, tmp_path)


@pytest.mark.slow
def test_redis_race(redis_url: str, tmp_path: Path) -> None:
    """Redis: 8 x 4 callers on 200 keys: each body runs once, everyone gets its result."""
    _run_race(redis_url, tmp_path)


if __name__ == "__main__":
    url, effects, thread, start = sys.argv[1:]
    _race(url, effects, thread, float(start))
