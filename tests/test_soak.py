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
#: Kills spread over the workers' runs; a worker's last run is never killed, so it shows its memory.
KILLS = int(os.environ.get("REPLAYSAFE_SOAK_KILLS", "3"))
#: Samples a worker takes before its memory is counted (imports, connection pools, caches warming up).
RSS_WARMUP_SAMPLES = 2
#: How much a surviving worker's memory may grow per call after warm-up, measured over at least
#: RSS_MIN_CALLS calls: a leak of a few KB per call fails (the bound was set well under an 80 KB leak).
RSS_GROWTH_PER_CALL_LIMIT = 4 * 1024
RSS_MIN_CALLS = 300
#: The soak fails when no worker has made a call for this long (a hang), never for being slow:
#: a loaded machine only takes longer.
STALL_LIMIT = 120.0
#: Only a backstop should the test itself hang (pytest-timeout ends the run without stopping the workers).
DEADLINE = 600 + CALLS * 0.03


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def soak_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.mark.soak
@pytest.mark.timeout(DEADLINE)
def test_soak_with_random_kills(soak_url: str, tmp_path: Path) -> None:
    """Every key ends completed; each record matches exactly one execution; survivors' memory is flat.

    Each kill is planned by count, not by time: a worker is SIGKILLed after a random number of
    its calls (where the kill lands in a call is random too), so every planned kill happens
    however fast or slow the machine is, and each worker's last run goes to the end.
    """
    keys = int(CALLS / 1.05)  # about one call in twenty is a replay
    audit, rss = tmp_path / "audit.log", tmp_path / "rss.log"
    rng = random.Random(7)
    plan: dict[int, list[int]] = {i: [] for i in range(WORKERS)}  # per worker: each run's kill, by call count
    for _ in range(KILLS):
        victim = rng.randrange(WORKERS)
        plan[victim].append(rng.randrange(1, len(range(victim, keys, WORKERS))))

    def start(index: int, generation: int) -> subprocess.Popen[bytes]:
        kill_after = plan[index][generation] if generation < len(plan[index]) else 0
        command = [sys.executable, WORKER, soak_url, str(audit), str(rss), str(index), str(WORKERS), str(keys)]
        return subprocess.Popen([*command, str(index * 1000 + generation), str(kill_after)], stderr=subprocess.PIPE)

    generations = dict.fromkeys(range(WORKERS), 0)
    workers = {i: start(i, 0) for i in range(WORKERS)}
    killed_pids: set[int] = set()
    progress, progressed_at = -1, time.monotonic()
    try:
        while any(p.poll() is None for p in workers.values()):
            time.sleep(0.1)
            for index, process in workers.items():
                if process.poll() is None or process.returncode == 0:
                    continue
                _, err = process.communicate()
                planned = generations[index] < len(plan[index])
                assert planned and process.returncode == -signal.SIGKILL, (process.returncode, err.decode())
                killed_pids.add(process.pid)
                generations[index] += 1
                workers[index] = start(index, generations[index])
            made = sum(log.stat().st_size for log in (audit, rss) if log.exists())  # replays write only rss
            if made != progress:
                progress, progressed_at = made, time.monotonic()
            assert time.monotonic() - progressed_at < STALL_LIMIT, f"no call ran for {STALL_LIMIT:.0f} s"
        for process in workers.values():
            _, err = process.communicate()
            assert process.returncode == 0, err.decode()
    finally:
        for process in workers.values():  # a failed soak leaves no worker behind
            if process.poll() is None:
                process.kill()
                process.communicate()
    kills = len(killed_pids)
    assert kills == KILLS and generations == {i: len(runs) for i, runs in plan.items()}

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
