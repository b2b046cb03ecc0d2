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
#: How much a surviving worker's memory may grow between its first and last sample.
RSS_GROWTH_LIMIT = 16 * 1024 * 1024


@pytest.fixture(params=["postgres", "redis"])
def soak_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.mark.soak
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
    deadline = time.monotonic() + 1800
    while any(p.poll() is None for p in workers.values()):
        assert time.monotonic() < deadline, "the soak did not finish in 30 minutes"
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

    samples: defaultdict[int, list[int]] = defaultdict(list)
    for line in rss.read_text().splitlines():
        pid, _calls, size = map(int, line.split())
        samples[pid].append(size)
    survivors = {pid: sizes for pid, sizes in samples.items() if pid not in killed_pids and len(sizes) >= 3}
    assert survivors, "no worker survived long enough to sample its memory"
    for pid, sizes in survivors.items():
        assert sizes[-1] - sizes[1] < RSS_GROWTH_LIMIT, (pid, sizes)
