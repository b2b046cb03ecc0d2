"""Soak: worker processes make many protected calls while some are SIGKILLed and restarted.

The short form runs in every test run. The full form (8 workers, 100,000 calls):

    REPLAYSAFE_SOAK_CALLS=100000 REPLAYSAFE_SOAK_WORKERS=8 REPLAYSAFE_SOAK_KILLS=40 \\
        .venv/bin/python -m pytest tests/test_soak.py
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from replaysafe import CallKey, Status, open_ledger

WORKER = str(Path(__file__).with_name("soak_worker.py"))
CALLS = int(os.environ.get("REPLAYSAFE_SOAK_CALLS", "3000"))
WORKERS = int(os.environ.get("REPLAYSAFE_SOAK_WORKERS", "4"))
#: Fewer kills than workers by default, so some workers survive to show their memory.
KILLS = int(os.environ.get("REPLAYSAFE_SOAK_KILLS", "3"))
#: Samples a worker takes before its memory is counted (imports, connection pools, caches warming up).
RSS_WARMUP_SAMPLES = 2
#: How much a surviving worker's memory may grow per call after warm-up, measured over at least
#: RSS_MIN_CALLS calls: a leak of a few KB per call fails (the bound was set well under an 80 KB leak).
RSS_GROWTH_PER_CALL_LIMIT = 4 * 1024
RSS_MIN_CALLS = 300
#: The soak's own deadline grows with its size (the full form takes about half an hour); the
#: test's time limit leaves it a minute to report before pytest-timeout ends the run.
DEADLINE = 240 + CALLS * 0.015


@pytest.fixture(params=["postgres", "redis"])
def soak_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.mark.soak
@pytest.mark.timeout(DEADLINE + 60)
def test_soak_with_random_kills(soak_url: str, tmp_path: Path) -> None:
    """Every key ends completed; each record matches exactly one execution; survivors' memory is flat."""
    keys = int(CALLS / 1.05)  # about one call in twenty is a replay
    audit, rss = tmp_path / "audit.log", tmp_path / "rss.log"
    rng = random.Random(7)

    def start(index: int, generation: int) -> subprocess.Popen[bytes]:
        command = [sys.executable, WORKER, soak_url, str(audit), str(rss), str(index), str(WORKERS), str(keys)]
        return subprocess.Popen([*command, str(index * 1000 + generation)], stderr=subprocess.PIPE)

    workers = {i: start(i, 0) for i in range(WORKERS)}
    killed_pids: set[int] = set()
    kills = 0
    deadline = time.monotonic() + DEADLINE
    try:
        while any(p.poll() is None for p in workers.values()):
            assert time.monotonic() < deadline, f"the soak did not finish in {DEADLINE:.0f} s"
            time.sleep(0.3)
            running = [i for i, p in workers.items() if p.poll() is None]
            if kills < KILLS and running and rng.random() < 0.5:
                victim = rng.choice(running)
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait()
                workers[victim].stderr.close()  # type: ignore[union-attr]
                killed_pids.add(workers[victim].pid)
                kills += 1
                workers[victim] = start(victim, kills)
        for process in workers.values():
            _, err = process.communicate()
            assert process.returncode == 0, err.decode()
    finally:
        for process in workers.values():  # a failed soak leaves no worker behind
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert kills > 0

    executions: defaultdict[int, Counter[int]] = defaultdict(Counter)
    for line in audit.read_text().splitlines():
        n, attempt, _pid = line.split()
        executions[int(n)][int(attempt)] += 1
    with open_ledger(soak_url) as ledger:
        records = {}
        for start_at in range(0, keys, 500):
            chunk = [CallKey("soak", f"msg_{n}", "call_1") for n in range(start_at, min(keys, start_at + 500))]
            records.update(ledger.get_many(chunk))
    assert len(records) == keys, f"{keys - len(records)} records lost"
    for key, record in records.items():
        n = int(key.message_id.removeprefix("msg_"))
        assert record.status is Status.COMPLETED, key
        assert executions[n][record.attempt] == 1, (key, record.attempt, executions[n])
    # A key ran more than once only when a kill left its call in doubt.
    rerun = [n for n, by_attempt in executions.items() if sum(by_attempt.values()) > 1]
    assert len(rerun) <= kills, rerun
    assert all(records[CallKey("soak", f"msg_{n}", "call_1")].attempt > 1 for n in rerun)

    samples: defaultdict[int, list[tuple[int, int]]] = defaultdict(list)
    for line in rss.read_text().splitlines():
        pid, calls, size = map(int, line.split())
        samples[pid].append((calls, size))
    survivors = {
        pid: measured[RSS_WARMUP_SAMPLES:]
        for pid, measured in samples.items()
        if pid not in killed_pids
        and measured[-1][0] - measured[min(RSS_WARMUP_SAMPLES, len(measured) - 1)][0] >= RSS_MIN_CALLS
    }
    assert survivors, f"no worker survived {RSS_MIN_CALLS} calls past its warm-up to show its memory"
    for pid, measured in survivors.items():
        (first_calls, first_size), (last_calls, last_size) = measured[0], measured[-1]
        per_call = (last_size - first_size) / (last_calls - first_calls)
        assert per_call < RSS_GROWTH_PER_CALL_LIMIT, (
            f"worker {pid} grew {per_call:.0f} bytes per call over {last_calls - first_calls} calls: {measured}"
        )
