"""``python -m benchmarks --quick`` runs and writes its results. Nothing here asserts a time or a ratio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replaysafe import CallKey

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = (
    "meta",
    "overhead",
    "floor",
    "alternative",
    "concurrency",
    "threads",
    "scale",
    "parallel",
    "tenxgraph",
    "adapters",
    "targets",
)


@pytest.mark.slow
def test_quick_benchmark_writes_markdown_json_and_chart(
    tmp_path: Path, postgres_server_url: str, redis_server_url: str
) -> None:
    """The smoke run finishes, and writes a markdown report, a JSON file with every section and a PNG chart."""
    env = {
        **os.environ,
        "REPLAYSAFE_TEST_POSTGRES_URL": postgres_server_url,
        "REPLAYSAFE_TEST_REDIS_URL": redis_server_url,
    }
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    written = {path.suffix: path for path in tmp_path.iterdir()}
    assert set(written) == {".md", ".json", ".png"}, sorted(tmp_path.iterdir())
    results = json.loads(written[".json"].read_text())
    assert set(SECTIONS) <= set(results)
    for section in ("overhead", "concurrency", "threads", "scale", "parallel"):
        skipped = [name for name, data in results[section].items() if isinstance(data, dict) and "skipped" in data]
        assert not skipped, f"{section}: {skipped} were skipped"
    assert {"memory", "redis"} <= set(results["alternative"]), "the Powertools comparison did not run"
    # 10xGraph needs its own Python 3.12 environment, which --quick never builds: without it, its
    # section and its two target rows say "not measured"; every other target is measured.
    tenxgraph = results["tenxgraph"]
    if "skipped" in tenxgraph:
        assert tenxgraph["skipped"].startswith("not measured"), tenxgraph
    else:
        for call in ("first_call", "replay"):
            assert {"ours_us", "theirs_us", "ratio"} <= set(tenxgraph[call]), tenxgraph
            assert tenxgraph[call]["ratio"]["median"] > 0, tenxgraph
    # Each adapter against its framework alone: --quick measures one of this environment's (LlamaIndex); the
    # others, and any without its environment or PostgreSQL driver, say "not measured", as their target rows do.
    from benchmarks.adapters import ADAPTERS, QUICK

    skipped_adapters = 0
    for adapter, (_, python) in ADAPTERS.items():
        for ledger in ("memory", "postgres"):
            point = results["adapters"][adapter].get(ledger) or results["adapters"][adapter]
            if "skipped" in point:
                assert python is not None or adapter != QUICK, f"the {adapter} adapter was not measured: {point}"
                assert point["skipped"].startswith("not measured"), (adapter, ledger, point)
                skipped_adapters += 1
            else:
                assert {"with_adapter_us", "added_us", "core_overhead_us", "ratio"} <= set(point), point
                assert point["core_overhead_us"]["median"] > 0 and point["ratio"]["n"] > 0, point
    unmeasured = [row for row in results["targets"] if row["met"] is None]
    expected = (2 if "skipped" in tenxgraph else 0) + skipped_adapters
    assert results["targets"] and len(unmeasured) == expected, unmeasured
    assert all("10xGraph" in row["target"] or " adapter, " in row["target"] for row in unmeasured), unmeasured
    # Issue 11's targets: library CPU in JSON round trips, async / sync, thread scaling, replay latency on every ledger.
    names = " | ".join(row["target"] for row in results["targets"])
    needles = ("JSON round trip", "async / sync", "16 threads / at 1", "replay latency, memory", "10xGraph")
    for needle in (*needles, "LlamaIndex adapter, memory ledger", "Strands Agents adapter, PostgreSQL ledger"):
        assert needle in names, needle
    assert {"memory", "sqlite", "postgres", "redis"} <= set(results["threads"])
    for ledger in ("sqlite", "postgres", "redis"):  # the control: the floor, then a memory-ledger call
        for kind in ("miss", "hit"):
            assert results["threads"][ledger][kind]["floor_then_memory"]["most_vs_one"]["median"] > 0
    assert "floor_then_memory" not in results["threads"]["memory"]["hit"]
    assert "memory" in results["scale"] and "bytes_per_record" in results["scale"]["memory_footprint"]
    markdown = written[".md"].read_text()
    assert "## Targets" in markdown and "## 7. Against 10xGraph" in markdown and "## 8. Thread scaling" in markdown
    assert "## 9. Adapters" in markdown
    assert written[".png"].read_bytes().startswith(b"\x89PNG")
    # The terminal gets a short summary: one line per target, and where the full report is.
    met = sum(row["met"] is True for row in results["targets"])
    missed = sum(row["met"] is False for row in results["targets"])
    assert f"targets: {met} met, {missed} missed, {len(unmeasured)} not measured" in done.stdout
    verdicts = ("  met", "  MISSED", "  not measured")
    assert len([line for line in done.stdout.splitlines() if line.startswith(verdicts)]) == len(results["targets"])
    assert str(written[".md"]) in done.stdout and "## Targets" not in done.stdout
    # A busy machine is said to be so, in the results and in both outputs; a quiet one is not.
    meta = results["meta"]
    cores, own = meta["machine"]["cores"], meta["cpu_spinners"] + 1
    busy = meta["load_average_at_start"][0] > cores or meta["load_average_at_end"][0] - own > cores
    assert (meta["load_warning"] is not None) == busy
    if busy:
        assert meta["load_warning"] in markdown and f"WARNING: {meta['load_warning']}" in done.stdout
    # Round trips counted on the wire: two for a first call and one for a replay, ours as the floor's.
    for ledger in ("redis", "postgres"):
        trips = results["overhead"][ledger]["round_trips"]
        assert (trips["ours.miss"], trips["ours.hit"]) == (trips["floor.miss"], trips["floor.hit"]) == (2, 1), trips
    # Context rows: Redis on a held connection, PostgreSQL with synchronous_commit=off; on both, the floor
    # followed by the same call on the memory ledger, timed as a block of its own and set against the floor.
    assert {"context.held_connection.sync.miss", "context.held_connection.sync.hit"} <= set(results["floor"]["redis"])
    assert "context.synchronous_commit_off.sync.miss" in results["floor"]["postgres"]
    for ledger in ("redis", "postgres"):
        for kind in ("miss", "hit"):
            after = results["floor"][ledger][f"context.memory_call_after_round_trips.sync.{kind}"]
            assert (after["ours"], after["other"]) == (f"floor-then-memory.sync.{kind}", f"floor.sync.{kind}")
            assert results["overhead"][ledger]["per_call_us"][after["ours"]]["median"] > 0
    assert "memory_call_after_round_trips" in markdown
    # Context: the common path written straight, its library CPU beside ours.
    cpu = results["overhead"]["memory"]["library_cpu"]
    for kind in ("miss", "hit"):
        assert cpu[f"straight.sync.{kind}"]["vs_json"]["median"] > 0, cpu
    assert "written straight" in markdown and "floor, then a memory call: most / one" in markdown
    assert "### Context" in markdown and "round trips on the wire" in markdown
    # The progress bar names the sections on stderr.
    from benchmarks.cli import SECTIONS as RUN

    assert all(f"/{len(RUN)}] {section}" in done.stderr for section in RUN)


@pytest.mark.parametrize(
    ("start", "end", "spinners", "warned"),
    [
        ([0.5, 1, 1], [1.9, 1, 1], 0, False),
        ([2.5, 1, 1], [0.1, 1, 1], 0, True),
        ([0.2, 0, 0], [7.0, 3, 1], 0, True),
        # The run's own spinner and process are runnable all along: counted out of the end reading.
        ([0.2, 0, 0], [3.9, 2, 1], 1, False),
        ([0.2, 0, 0], [4.1, 2, 1], 1, True),
        ([0.2, 0, 0], [3.9, 2, 1], 0, True),
    ],
)
def test_a_load_above_the_core_count_is_warned_of(
    start: list[float], end: list[float], spinners: int, warned: bool
) -> None:
    """The 1-minute load average above the cores, at the start (before the run's spinners start) or the end
    (less the run's own spinners and process), makes the run's figures unreliable."""
    from benchmarks import report

    meta = {
        "machine": {"cores": 2},
        "load_average_at_start": start,
        "load_average_at_end": end,
        "cpu_spinners": spinners,
    }
    warning = report.load_warning(meta)
    assert (warning is not None) == warned
    if warning is not None:
        assert "unreliable" in warning and "2 cores" in warning


def test_the_tenxgraph_section_is_reported_measured_or_not() -> None:
    """Section 7 shows ours, 10xGraph's and their ratio per call; without its environment it says not measured."""
    from benchmarks import report

    stats = {"median": 1000.0, "p10": 900.0, "p90": 1100.0, "n": 3}
    ratio = {"median": 0.62, "p10": 0.5, "p90": 0.75, "n": 3}
    point = {"ours_us": stats, "theirs_us": stats, "ratio": ratio}
    measured = {"version": "0.10.3", "python": "3.12.1", "first_call": point, "replay": point}
    table = "\n".join(report._tenxgraph_table({"tenxgraph": measured}))
    assert "10xgraph 0.10.3 on Python 3.12.1" in table
    assert "| first call | 1,000 (900.0-1,100) | 1,000 (900.0-1,100) | 0.62 (0.50-0.75) |" in table
    assert "| replay |" in table
    skipped = {"skipped": "not measured: no Python 3.12 / 10xgraph environment"}
    assert skipped["skipped"] in report._tenxgraph_table({"tenxgraph": skipped})
    assert report._tenxgraph_table({}) == []


def test_the_adapters_section_is_reported_measured_or_not() -> None:
    """Section 9 shows, per adapter and ledger, the time it adds and that over the core's overhead, with its
    target row; an adapter (or a ledger) without its environment (or driver) says not measured."""
    from benchmarks import report

    def stats(median: float, p10: float, p90: float) -> dict[str, float]:
        return {"median": median, "p10": p10, "p90": p90, "n": 3}

    point = {
        "with_adapter_us": stats(1100, 1000, 1200),
        "added_us": stats(60, 50, 70),
        "core_us": stats(51, 50, 52),
        "core_overhead_us": stats(50, 49, 51),
        "ratio": stats(1.2, 1.0, 1.4),
    }
    noisy = {**point, "added_us": stats(60, -500, 700), "ratio": stats(1.4, -10, 14)}
    measured = {"framework": "llama-index-core 0.14.25", "framework_us": stats(1000, 900, 1100)}
    section = {
        "rounds": 3,
        "calls_per_run": 10,
        "llamaindex": {**measured, "memory": point, "postgres": noisy},
        "adk": {**measured, "memory": point, "postgres": {"skipped": "not measured: no PostgreSQL driver"}},
        "crewai": {"skipped": "not measured: no environment integrations/crewai/.venv311"},
    }
    table = "\n".join(report._adapters_table({"adapters": section}))
    assert "## 9. Adapters" in table
    assert "| LlamaIndex | llama-index-core 0.14.25 | memory | 1,000 (900.0-1,100) | 1,100 (1,000-1,200) " in table
    assert "| 60.0 (50.0-70.0) | 50.0 (49.0-51.0) | 1.20 (1.00-1.40) |" in table
    assert "not measured: no PostgreSQL driver" in table and "no environment integrations/crewai" in table
    assert report._adapters_table({}) == []
    rows = {row["target"]: row for row in report.targets({"adapters": section})}
    memory = rows["LlamaIndex adapter, memory ledger: time it adds per tool call / the core's own overhead"]
    assert memory["met"] is True and memory["goal"] == "<= 1.2x" and "unresolved" not in memory["note"]
    postgres = rows["LlamaIndex adapter, PostgreSQL ledger: time it adds per tool call / the core's own overhead"]
    assert postgres["met"] is False and "unresolved" in postgres["note"]
    for name in ("Google ADK adapter, PostgreSQL ledger", "CrewAI adapter, memory ledger"):
        row = rows[f"{name}: time it adds per tool call / the core's own overhead"]
        assert row["met"] is None and row["note"].startswith("not measured"), row


def test_the_common_path_written_straight_records_and_replays_as_a_protected_call_does() -> None:
    # The straight path is only a measuring stick beside ours: it must do the same work to be one.
    from benchmarks._straight import straight
    from replaysafe import MemoryLedger, replay_safe, tool_call

    runs: list[str] = []

    @replay_safe
    def note(order_id: str) -> str:  # a step: protected on its parent's ledger, under its parent's key
        return f"noted {order_id}"

    def refund(order_id: str) -> dict[str, str]:
        runs.append(order_id)
        note(order_id)
        return {"refunded": order_id}

    ours_ledger, straight_ledger = MemoryLedger(), MemoryLedger()
    ours, written_straight = replay_safe(ledger=ours_ledger)(refund), straight(straight_ledger, refund, "refund")
    answers = []
    for tool in (ours, written_straight, ours, written_straight):
        with tool_call("t", "m", "c"):
            answers.append(tool("o-1"))
    assert answers == [{"refunded": "o-1"}] * 4 and runs == ["o-1", "o-1"]  # each ran once, then replayed
    key = CallKey("t", "m", "c")
    ours_record, straight_record = ours_ledger.get(key), straight_ledger.get(key)
    assert ours_record is not None and straight_record is not None
    same = ("key", "tool_name", "args_digest", "status", "result", "attempt")
    assert [getattr(straight_record, field) for field in same] == [getattr(ours_record, field) for field in same]
    assert straight_record.lease_expires_at - straight_record.created_at == (
        ours_record.lease_expires_at - ours_record.created_at
    )
    # The call's own scope reaches its steps: each ledger holds the call and its step, alike.
    assert len(list(ours_ledger.records())) == len(list(straight_ledger.records())) == 2
    with pytest.raises(NotImplementedError):  # off the common path: no ids
        written_straight("o-1")
    with tool_call("t", "m", "c", tool_timeout=0.5), pytest.raises(NotImplementedError):  # a hard deadline
        written_straight("o-1")
    with tool_call("t", "m", "c"), pytest.raises(NotImplementedError):  # other arguments: a mismatch
        written_straight("o-2")


def _crash_matrix(out: Path, driver: str) -> subprocess.CompletedProcess[str]:
    command = ["-m", "benchmarks.crash", "--jobs", "2", "--ledger", "sqlite", "--scenario", "in_doubt_raise"]
    return subprocess.run(
        [sys.executable, *command, "--driver", f"reference loop={driver}", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_crash_matrix_counts_the_kills_of_the_scenarios_asked_for_with_cases_side_by_side(tmp_path: Path) -> None:
    """``python -m benchmarks.crash --jobs 2``: one scenario on one driver and ledger, every case counted in
    the table; an adapter that does not protect makes the run fail and the duplicate counted."""
    held = _crash_matrix(tmp_path / "held.md", "tests.conformance_driver:DRIVER")
    assert held.returncode == 0, held.stdout[-4000:] + held.stderr[-4000:]
    table = (tmp_path / "held.md").read_text()
    # in_doubt_raise: one call, killed at each of its four points; the control (no adapter) at its one case.
    assert "**5 SIGKILL scenarios**, 4 with the adapter (0 duplicates where none is promised)" in table, table
    assert "| reference loop | sqlite | in_doubt_raise | 4 | 0 | 1 | 1 |" in table, table
    broken = _crash_matrix(tmp_path / "broken.md", "tests.conformance_driver:UNPROTECTED")
    assert broken.returncode == 1, broken.stdout[-4000:] + broken.stderr[-4000:]
    assert "FAIL reference loop sqlite in_doubt_raise" in broken.stdout, broken.stdout[-4000:]
    assert "| reference loop | sqlite | in_doubt_raise | 0 | 1 | 0 | 0 |" in (tmp_path / "broken.md").read_text()
