"""The run's outputs: the targets verdict, a markdown report, the JSON, and a PNG chart."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .adapters import ADAPTERS, LEDGERS

#: Hit latency counts as flat when the largest store's is at most this many times the smallest's.
FLAT = 1.2


def _get(data: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _inverted(stats: dict[str, float]) -> dict[str, float]:
    """``other / ours`` from ``ours / other``: how many times faster we are (its spread flips too)."""
    return {"median": 1 / stats["median"], "p10": 1 / stats["p90"], "p90": 1 / stats["p10"]}


#: The goals of the targets read from the run's sections.
CPU_IN_JSON = {"miss": 5.0, "hit": 3.0}  # what the layered design can reach with care (issue 33)
ASYNC_OVER_SYNC = 1.3
REDIS_FLOOR = 1.15
#: PostgreSQL against its floor: a first call against INSERT + UPDATE, a replay against one prepared SELECT.
POSTGRES_FLOOR = {"miss": 1.2, "hit": 1.3}
FASTER_THAN_POWERTOOLS = {"miss": 1.3, "hit": 3.0}
#: Calls/s at the most threads over at one, against the raw client's same ratio (the floors fall under the GIL too).
THREADS_KEEP = 0.9
#: Ours / 10xGraph's own ledger on the same PostgreSQL (async), per first call and per replay.
TENXGRAPH = {"first_call": 1.2, "replay": 0.8}
#: An adapter's added time per tool call, over the core's own overhead on the same ledger (issue 31).
ADAPTER_OVER_CORE = 1.2
LEDGER_NAMES = {"memory": "memory", "postgres": "PostgreSQL"}
#: The tiered ledger: its replay against the Redis ledger's, its first call against the PostgreSQL ledger's.
TIERED = {"hit": ("redis", "the Redis ledger", 1.2), "miss": ("postgres", "the PostgreSQL ledger", 1.1)}
CALL = {"miss": "first call", "hit": "replay"}


def _over(top: dict[str, float] | None, bottom: dict[str, float] | None) -> dict[str, float] | None:
    """The quotient of two medians measured apart (no per-round pairing): its median only."""
    if not top or not bottom or not bottom["median"]:
        return None
    value = top["median"] / bottom["median"]
    return {"median": value, "p10": value, "p90": value, "n": 1}


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of the issue, measured: met, missed, or not measured in this run."""
    rows: list[dict[str, Any]] = []

    def at_most(goal: float) -> Callable[[float], bool]:
        return lambda m: m <= goal

    def at_least(goal: float) -> Callable[[float], bool]:
        return lambda m: m >= goal

    def add(
        name: str, stats: dict[str, float] | None, goal: str, unit: str, ok: Callable[[float], bool], note: str = ""
    ) -> None:
        measured = stats is not None and not math.isnan(stats["median"])
        met = bool(ok(stats["median"])) if stats is not None and measured else None
        rows.append({"target": name, "goal": goal, "unit": unit, "measured": stats if measured else None,
                     "met": met, "note": note})  # fmt: skip

    floor = results.get("floor", {})
    memory = _get(results, "overhead", "memory") or {}
    reference = _get(memory, "per_call_us", "reference.json", "median")
    for kind, goal in CPU_IN_JSON.items():
        cpu = _get(memory, "library_cpu", f"ours.sync.{kind}")
        note = (
            f"library CPU {cpu['us']['median']:.1f} us; json.dumps + json.loads of the result {reference:.1f} us"
            if cpu and reference
            else ""
        )
        add(f"memory ledger library CPU per {CALL[kind]} / a JSON round trip of its result (sync, main thread, "
            "defaults)", cpu and cpu["vs_json"], f"<= {goal:g}x", "x", at_most(goal), note)  # fmt: skip
    for kind in ("miss", "hit"):
        add(f"memory ledger library CPU per {CALL[kind]}, async / sync", _get(memory, "async_vs_sync", kind),
            f"<= {ASYNC_OVER_SYNC:g}x", "x", at_most(ASYNC_OVER_SYNC))  # fmt: skip
    for mode in ("sync", "async"):
        add(f"Redis replay / one raw GET ({mode})", _get(floor, "redis", f"{mode}.hit", "ratio"),
            f"<= {REDIS_FLOOR:g}x", "x", at_most(REDIS_FLOOR))  # fmt: skip
        add(f"Redis first call / raw SET NX + SET ({mode})", _get(floor, "redis", f"{mode}.miss", "ratio"),
            f"<= {REDIS_FLOOR:g}x", "x", at_most(REDIS_FLOOR))  # fmt: skip
    for mode in ("sync", "async"):
        for kind, floor_name in (("miss", "INSERT + UPDATE"), ("hit", "one SELECT")):
            add(f"PostgreSQL {CALL[kind]} / raw {floor_name} ({mode})",
                _get(floor, "postgres", f"{mode}.{kind}", "ratio"), f"<= {POSTGRES_FLOOR[kind]:g}x", "x",
                at_most(POSTGRES_FLOOR[kind]))  # fmt: skip
    for kind, (part, name, goal) in TIERED.items():
        for mode in ("sync", "async"):
            add(f"tiered (PostgreSQL + Redis cache) {CALL[kind]} / {name}'s ({mode})",
                _get(floor, "tiered", f"tiered_{kind}_vs_{part}.{mode}", "ratio"), f"<= {goal:g}x", "x",
                at_most(goal))  # fmt: skip
    for kind, goal in FASTER_THAN_POWERTOOLS.items():
        stats = _get(results, "alternative", "redis", f"powertools.{kind}", "ratio")
        add(f"faster than Powertools on the same Redis, per {CALL[kind]}", _inverted(stats) if stats else None,
            f">= {goal:g}x", "x faster", at_least(goal))  # fmt: skip
    threads = results.get("threads", {})
    counts = threads.get("threads") or [1, 16]
    for ledger in ("memory", "sqlite", "postgres", "redis"):
        for kind in ("miss", "hit"):
            ours, raw = _get(threads, ledger, kind, "most_vs_one"), _get(threads, ledger, kind, "floor", "most_vs_one")
            note = f"ours {ours['median']:.2f}x, the raw client's {raw['median']:.2f}x" if ours and raw else ""
            add(f"threads, {ledger}, {CALL[kind]}s on many keys: calls/s at {counts[-1]} threads / at {counts[0]}, "
                "ours / the raw client's", _over(ours, raw), f">= {THREADS_KEEP:g}x", "x", at_least(THREADS_KEEP),
                note)  # fmt: skip
    for part, kind in (("first_call", "miss"), ("replay", "hit")):
        add(f"against 10xGraph's ledger on the same PostgreSQL (async), per {CALL[kind]}: ours / theirs",
            _get(results, "tenxgraph", part, "ratio"), f"<= {TENXGRAPH[part]:g}x", "x",
            at_most(TENXGRAPH[part]))  # fmt: skip
    for adapter, (label, _) in ADAPTERS.items():
        for ledger in LEDGERS:
            point = _get(results, "adapters", adapter, ledger) or _get(results, "adapters", adapter) or {}
            note = (
                f"adds {_num(point['added_us']['median'])} us per call; the core's overhead "
                f"{_num(point['core_overhead_us']['median'])} us"
                if "ratio" in point
                else point.get("skipped", "")
            )
            if "ratio" in point and point["added_us"]["p10"] < 0 < point["added_us"]["p90"]:
                note += " (unresolved: the added time's p10-p90 spans 0, the framework's own swings are larger)"
            add(f"{label} adapter, {LEDGER_NAMES[ledger]} ledger: time it adds per tool call / the core's own "
                "overhead", point.get("ratio"), f"<= {ADAPTER_OVER_CORE:g}x", "x", at_most(ADAPTER_OVER_CORE),
                note)  # fmt: skip
    scale = results.get("scale", {})
    sizes = scale.get("sizes") or []
    for name in ("memory", "sqlite", "postgres", "redis"):
        # Each size's ours / raw read is paired within its rounds; their quotient is ours' growth over the raw
        # read's growth (a server's own index depth costs both alike).
        largest = _get(scale, name, "sizes", str(sizes[-1]), "ours_vs_floor") if sizes else None
        smallest = _get(scale, name, "sizes", str(sizes[0]), "ours_vs_floor") if sizes else None
        ours = _get(scale, name, "sizes", str(sizes[-1]), "vs_smallest") if sizes else None
        note = f"ours grew {ours['median']:.2f}x" if ours else ""
        span = f"{sizes[-1]:,} / {sizes[0]:,} records" if sizes else "largest / smallest store"
        add(f"replay latency, {name}: {span}, ours' growth / the raw read's growth", _over(largest, smallest),
            f"<= {FLAT:g}x", "x", at_most(FLAT), note)  # fmt: skip
    return rows


def own_load(meta: dict[str, Any]) -> int:
    """Runnable processes the run itself adds to the load average: its nice-19 spinners and itself."""
    return int(meta.get("cpu_spinners") or 0) + 1


def load_warning(meta: dict[str, Any]) -> str | None:
    """Why the figures are unreliable, when the machine was busy: a 1-minute load average above
    the core count at the start (read before the spinners start) or at the end (less the run's
    own processes, which are runnable all along and count even on an idle machine)."""
    cores = (meta.get("machine") or {}).get("cores") or 1
    own = own_load(meta)
    readings = []
    start, end = meta.get("load_average_at_start"), meta.get("load_average_at_end")
    if start and start[0] > cores:
        readings.append(f"{start[0]:g} at the start")
    if end and end[0] - own > cores:
        readings.append(f"{end[0]:g} at the end, {end[0] - own:.2f} without the run's own {own} processes")
    if not readings:
        return None
    return (
        f"the machine was busy (load average {' and '.join(readings)}, above its {cores} cores): other work "
        "competed for the CPU, so these figures are unreliable. Run again on a quiet machine."
    )


#: How a target's verdict is written in the terminal summary.
VERDICT = {True: "met", False: "MISSED", None: "not measured"}


def summary(results: dict[str, Any], paths: dict[str, Path]) -> str:
    """The terminal's short form: each target met or missed, the load warning, where the full report is."""
    rows = results["targets"]
    counts = {verdict: sum(row["met"] is verdict for row in rows) for verdict in (True, False, None)}
    lines = [f"targets: {counts[True]} met, {counts[False]} missed, {counts[None]} not measured"]
    for row in rows:
        mark = VERDICT[row["met"]]
        digits = 1 if row["unit"] == "us" else 2
        measured = f"{_num(row['measured']['median'], digits)} {row['unit']}" if row["measured"] else "-"
        lines.append(f"  {mark:<12} {row['target']}: {measured} (goal {row['goal']})")
    warning = results["meta"].get("load_warning")
    if warning:
        lines.append(f"WARNING: {warning}")
    lines += [f"{kind}: {path}" for kind, path in paths.items()]
    return "\n".join(lines)


# --- markdown ---------------------------------------------------------------------------


def _num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _spread(stats: dict[str, float] | None, digits: int = 1, suffix: str = "") -> str:
    if not stats:
        return "-"
    if stats.get("n") == 1:  # a quotient of medians measured apart (_over): no spread to give
        return f"{_num(stats['median'], digits)}{suffix}"
    return f"{_num(stats['median'], digits)}{suffix} ({_num(stats['p10'], digits)}-{_num(stats['p90'], digits)})"


def _header(results: dict[str, Any]) -> list[str]:
    meta = results["meta"]
    machine = meta["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v)
    library = meta.get("library") or {}
    commit = (library.get("commit") or "unknown commit")[:10]
    changes = library.get("uncommitted_changes") or []
    source = f"replaysafe at {commit}" + (f" with {len(changes)} uncommitted changed files" if changes else " (clean)")
    loads = f"load average {meta.get('load_average_at_start')} at start, {meta.get('load_average_at_end')} at end"
    spinners = meta.get("cpu_spinners")
    loads += (
        f"; {spinners} nice-19 spinner(s) kept idle vCPUs awake"
        if spinners
        else "; idle vCPUs were left to sleep (round trips include wake-up latency)"
    )
    warning = meta.get("load_warning")
    return [
        f"# replaysafe benchmark, {meta['date']}{' (--quick)' if meta['settings']['quick'] else ''}",
        "",
        *([f"> **Warning**: {warning}", ""] if warning else []),
        f"{machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, {machine['platform']}; "
        f"{meta['python']}; {versions}. Took {meta['duration_s']:.0f} s. Measured {source}; {loads}.",
        "",
        "Medians over paired rounds, with the 10th-90th percentile of the per-round values in brackets. "
        "See benchmarks/README.md for what each number means.",
        "",
    ]


def _targets_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["## Targets", "", "| target | measured | goal | | note |", "|---|---|---|---|---|"]
    for row in rows:
        verdict = {True: "met", False: "**MISSED**", None: "not measured"}[row["met"]]
        digits = 1 if row["unit"] == "us" else 2
        measured = _spread(row["measured"], digits, " " + row["unit"]) if row["measured"] else "-"
        lines.append(f"| {row['target']} | {measured} | {row['goal']} | {verdict} | {row.get('note', '')} |")
    return [*lines, ""]


def _overhead_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "## 1-3. One protected call: ours, the raw floor, Powertools",
        "",
        "Microseconds per call. *floor*: the raw client doing the same round trips (memory: a bare function call). "
        "*overhead*: ours minus floor, per round.",
        "",
        "| ledger | mode | call | ours us | floor us | ours / floor | overhead us | Powertools us "
        "| ours / Powertools |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    overhead = results.get("overhead", {})
    for ledger, data in overhead.items():
        if "skipped" in data:
            lines.append(f"| {ledger} | - | - | {data['skipped']} | | | | | |")
            continue
        per_call = data["per_call_us"]
        for mode in ("sync", "async"):
            for kind in ("miss", "hit"):
                compared = _get(results, "floor", ledger, f"{mode}.{kind}") or {}
                floor_name = compared.get("other")
                alt = _get(results, "alternative", ledger, f"powertools.{kind}") if mode == "sync" else None
                alt_us = per_call.get(f"powertools.sync.{kind}") if mode == "sync" else None
                lines.append(
                    f"| {ledger} | {mode} | {kind} | {_spread(per_call.get(f'ours.{mode}.{kind}'))} "
                    f"| {_spread(per_call.get(floor_name)) if floor_name else '-'} "
                    f"| {_spread(compared.get('ratio'), 2)} | {_spread(compared.get('difference_us'))} "
                    f"| {_spread(alt_us)} | {_spread(alt['ratio'], 2) if alt else '-'} |"
                )
        cached = _get(results, "alternative", ledger, "powertools-local-cache.hit")
        if cached:
            lines.append(
                f"| {ledger} | sync | hit vs Powertools local cache | "
                f"{_spread(per_call.get('ours.sync.hit'))} | | | "
                f"| {_spread(per_call.get('powertools-local-cache.sync.hit'))} | {_spread(cached['ratio'], 2)} |"
            )
        if data.get("round_trips"):
            trips = ", ".join(f"{k} {v}" for k, v in data["round_trips"].items())
            lines.append(f"| {ledger} | | round trips on the wire per call | {trips} | | | | | |")
    notes = [note for data in overhead.values() for note in data.get("notes", [])]
    lines += ["", *(f"Note: {note}" for note in notes), ""]
    context = [
        (ledger, label.removeprefix("context."), entry)
        for ledger, entries in (results.get("floor") or {}).items()
        for label, entry in entries.items()
        if label.startswith("context.")
    ]
    if context:
        lines += [
            "### Context (not targets)",
            "",
            "Ours against a floor in another setting: Redis on one held connection below redis-py's command "
            "layer; PostgreSQL with `synchronous_commit=off` on both sides. *memory_call_after_round_trips*: "
            "not ours, but the floor followed each time by the same kind of call (a first call, a replay) on "
            "the memory ledger, against the floor alone: what the library's generic work adds when it runs "
            "right after the round trips. *Measured*: ours, or that pair; *against*: the floor in the setting.",
            "",
            "| ledger | setting | measured us | against us | ratio |",
            "|---|---|---|---|---|",
        ]
        for ledger, label, entry in context:
            per_call = overhead[ledger]["per_call_us"]
            ours, other = per_call.get(entry["ours"]), per_call.get(entry["other"])
            lines.append(f"| {ledger} | {label} | {_spread(ours)} | {_spread(other)} | {_spread(entry['ratio'], 2)} |")
        lines.append("")
    memory = _get(results, "floor", "memory") or {}
    if "timeout.explicit.main" in memory:
        lines += [
            "### What a timeout costs (memory ledger, sync, first call)",
            "",
            "Extra microseconds per call over the same tool with `timeout=None`. The default timeout is kept by "
            "the lease (the tool runs in its caller's thread, reported late if it overruns); an explicit "
            "`timeout=` is a hard deadline.",
            "",
            "| where the call runs | timeout | mechanism | extra us | ratio |",
            "|---|---|---|---|---|",
        ]
        mechanisms = {
            ("main", "default"): "the caller's thread, lease kept to the deadline",
            ("main", "explicit"): "SIGALRM interval timer",
            ("thread", "default"): "the caller's thread, lease kept to the deadline",
            ("thread", "explicit"): "pooled worker thread",
        }
        for (where, timeout), mechanism in mechanisms.items():
            entry = memory.get(f"timeout.{timeout}.{where}") or {}
            lines.append(
                f"| {'main thread' if where == 'main' else 'another thread'} | {timeout} | {mechanism} "
                f"| {_spread(entry.get('difference_us'))} | {_spread(entry.get('ratio'), 2)} |"
            )
        lines.append("")
    cpu = _get(results, "overhead", "memory", "library_cpu")
    if cpu:
        reference = _get(results, "overhead", "memory", "per_call_us", "reference.json")
        lines += [
            "### Library CPU in JSON round trips (memory ledger)",
            "",
            f"Microseconds over a bare call of the tool, and that cost over `json.dumps` + `json.loads` of the "
            f"result ({_spread(reference)} us) timed in the same round. Per round. *straight* (context, not a "
            "product): the same common path written straight, in one function with the library's own pieces "
            "(benchmarks/_straight.py): the decisions, the plan's included, without the protocol's shape "
            "(the protocol generator, drivers, effect tuples).",
            "",
            "| subject | library CPU us | / JSON round trip |",
            "|---|---|---|",
            *(
                f"| {config} | {_spread(entry['us'])} | {_spread(entry['vs_json'], 2)} |"
                for config, entry in cpu.items()
            ),
            "",
        ]
    return lines


def _threads_table(results: dict[str, Any]) -> list[str]:
    section = results.get("threads", {})
    counts = section.get("threads") or []
    lines = [
        "## 8. Thread scaling: calls per second, many keys",
        "",
        f"{section.get('note', '')}. Median of {section.get('repeats')} repeats of "
        f"{section.get('seconds_per_point')} s per point; *most / one* is the per-repeat ratio of the most "
        "threads' calls per second to one thread's. *Floor most / one* (context): the same ratio for the raw "
        "client making the same round trips, one connection per thread (a bare call of the tool's body for "
        "the memory ledger), measured in the same repeats: what the GIL and the client do to throughput "
        "without the library. *Floor, then a memory call* (context, ledgers with round trips): each floor "
        "operation followed by the same kind of protected call on a memory ledger: the library's generic "
        "Python between the same round trips, without the ledger's own code.",
        "",
        f"| ledger | call | {' | '.join('1 thread' if n == 1 else f'{n} threads' for n in counts)} | most / one "
        "| floor most / one | floor, then a memory call: most / one |",
        f"|---|---|{'---|' * len(counts)}---|---|---|",
    ]
    for ledger in ("memory", "sqlite", "postgres", "redis"):
        data = section.get(ledger) or {}
        if "skipped" in data:
            lines.append(f"| {ledger} | {data['skipped']} |{' |' * len(counts)} | | |")
            continue
        for kind in ("miss", "hit"):
            point = data.get(kind)
            if point:
                per_s = " | ".join(_num(point["per_s"][str(n)], 0) for n in counts)
                floor, control = point.get("floor"), point.get("floor_then_memory")
                floor_ratio = _spread(floor["most_vs_one"], 2) if floor else "not measured"
                control_ratio = _spread(control["most_vs_one"], 2) if control else "not measured"
                lines.append(
                    f"| {ledger} | {CALL[kind]} | {per_s} | {_spread(point['most_vs_one'], 2)} | {floor_ratio} "
                    f"| {control_ratio} |"
                )
    return [*lines, ""]


def _concurrency_table(results: dict[str, Any]) -> list[str]:
    section = results.get("concurrency", {})
    lines = [
        "## 4. Concurrency: calls per second",
        "",
        f"{section.get('note', '')}. Race: all callers call one fresh key at once; time until all have the "
        "result, and tool runs per race.",
        "",
        "| ledger | mode | callers | miss/s (many keys) | hit/s (many keys) | hit/s (one hot key) | race ms "
        "| tool runs / races |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ledger in ("postgres", "redis"):
        data = section.get(ledger) or {}
        if "skipped" in data:
            lines.append(f"| {ledger} | | | {data['skipped']} | | | | |")
            continue
        for mode in ("sync", "async"):
            for callers, point in (data.get(mode) or {}).items():
                race = point["race"]
                lines.append(
                    f"| {ledger} | {mode} | {callers} | {_num(point['miss_per_s'], 0)} | {_num(point['hit_per_s'], 0)} "
                    f"| {_num(point['hot_hit_per_s'], 0)} | {_num(race['median_ms'])} "
                    f"| {race['tool_runs']} / {race['races']} |"
                )
    return [*lines, ""]


def _scale_table(results: dict[str, Any]) -> list[str]:
    section = results.get("scale", {})
    lines = [
        "## 5. Scale: replay latency with records already in the ledger",
        "",
        "| ledger | records | ours hit us | floor hit us | ours / floor | vs smallest store |",
        "|---|---|---|---|---|---|",
    ]
    for ledger in ("memory", "sqlite", "postgres", "redis"):
        data = section.get(ledger) or {}
        if "skipped" in data:
            lines.append(f"| {ledger} | {data['skipped']} | | | | |")
            continue
        for size, point in (data.get("sizes") or {}).items():
            lines.append(
                f"| {ledger} | {int(size):,} | {_spread(point['ours_hit_us'])} | {_spread(point['floor_hit_us'])} "
                f"| {_spread(point['ours_vs_floor'], 2)} | {_spread(point['vs_smallest'], 2)} |"
            )
    memory = section.get("memory_footprint")
    if memory:
        lines += [
            "",
            f"Memory ledger: {memory['bytes_per_record']:,.0f} bytes per record "
            f"(tracemalloc, {memory['records']:,} records; {memory['call']}).",
        ]
    return [*lines, ""]


def _parallel_table(results: dict[str, Any]) -> list[str]:
    section = results.get("parallel", {})
    lines = [
        "## 6. Parallel tool calls in one node: reading N records",
        "",
        "Microseconds to read all N records of a node.",
        "",
        "| ledger | N | get_many (1 round trip) | N x get | N x replayed call | N x get / get_many |",
        "|---|---|---|---|---|---|",
    ]
    for ledger in ("memory", "sqlite", "postgres", "redis"):
        data = section.get(ledger) or {}
        if "skipped" in data:
            lines.append(f"| {ledger} | {data['skipped']} | | | | |")
            continue
        for n, point in data.items():
            lines.append(
                f"| {ledger} | {n} | {_spread(point['get_many_us'])} | {_spread(point['get_each_us'])} "
                f"| {_spread(point['replay_each_us'])} | {_spread(point['get_each_vs_get_many'], 2)} |"
            )
    return [*lines, ""]


def _tenxgraph_table(results: dict[str, Any]) -> list[str]:
    section = results.get("tenxgraph")
    if section is None:
        return []
    lines = ["## 7. Against 10xGraph's PgCheckpointer tool ledger (same PostgreSQL, async)", ""]
    if "skipped" in section:
        return [*lines, section["skipped"], ""]
    lines += [
        f"10xgraph {section['version']} on Python {section['python']}, both sides in one process: ours is "
        "`@replay_safe` on a `PostgresLedger`; theirs is its ToolNode's tool-ledger lookup, the tool and the record "
        "of its result. Microseconds per call; *ours / theirs* below 1 means we are faster.",
        "",
        "| call | ours us | 10xGraph us | ours / 10xGraph |",
        "|---|---|---|---|",
    ]
    for label, name in (("first_call", "first call"), ("replay", "replay")):
        point = section[label]
        lines.append(
            f"| {name} | {_spread(point['ours_us'])} | {_spread(point['theirs_us'])} | {_spread(point['ratio'], 2)} |"
        )
    return [*lines, ""]


def _adapters_table(results: dict[str, Any]) -> list[str]:
    section = results.get("adapters")
    if section is None:
        return []
    lines = [
        "## 9. Adapters: the time each adds per tool call, against its framework alone",
        "",
        f"Per adapter, in its own environment: the framework's agent on the adapter's scripted model, "
        f"{section['calls_per_run']} calls of a trivial tool per run (one per model turn), every call a "
        f"first call; {section['rounds']} paired rounds of the framework alone, with the adapter on each ledger, "
        "and in the same process the core's own overhead on the same ledger (a plain function against it under "
        "`@replay_safe` + `tool_call(...)`). Microseconds per tool call. *Added*: with the adapter minus the "
        "framework alone, per round; *added / core*: that over the core's overhead in the same round (goal "
        f"<= {ADAPTER_OVER_CORE:g}x). The framework's own time per call swings far more than the core's "
        "overhead on the memory ledger: read that ratio's spread before its median.",
        "",
        "| adapter | framework | ledger | framework alone us | with the adapter us | added us | core overhead us "
        "| added / core |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for adapter, (label, _) in ADAPTERS.items():
        data = section.get(adapter) or {"skipped": "not measured"}
        if "skipped" in data:
            lines.append(f"| {label} | {data['skipped']} | | | | | | |")
            continue
        for ledger in LEDGERS:
            point = data[ledger]
            if "skipped" in point:
                lines.append(f"| {label} | {data['framework']} | {ledger} | {point['skipped']} | | | | |")
                continue
            lines.append(
                f"| {label} | {data['framework']} | {ledger} | {_spread(data['framework_us'])} "
                f"| {_spread(point['with_adapter_us'])} | {_spread(point['added_us'])} "
                f"| {_spread(point['core_overhead_us'])} | {_spread(point['ratio'], 2)} |"
            )
    return [*lines, ""]


def markdown(results: dict[str, Any]) -> str:
    lines = _header(results) + _targets_table(results["targets"]) + _overhead_table(results)
    lines += _concurrency_table(results) + _scale_table(results) + _parallel_table(results)
    lines += _tenxgraph_table(results) + _threads_table(results) + _adapters_table(results)
    return "\n".join(lines)


# --- the chart ---------------------------------------------------------------------------


def chart(results: dict[str, Any], path: Path) -> None:
    """Three panels: ours / floor per server ledger, the memory ledger's CPU overhead, speed-up over Powertools."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 6.5), gridspec_kw={"width_ratios": [1.25, 1, 1]})
    floor = results.get("floor", {})

    def bars(ax: Any, items: list[tuple[str, dict[str, float] | None, float | None, str]], xlabel: str) -> None:
        shown = [(label, stats, goal, color) for label, stats, goal, color in items if stats]
        y = list(range(len(shown)))[::-1]
        medians = [s["median"] for _, s, _, _ in shown]
        low = [s["median"] - s["p10"] for _, s, _, _ in shown]
        high = [s["p90"] - s["median"] for _, s, _, _ in shown]
        ax.barh(y, medians, xerr=[low, high], color=[c for *_, c in shown], capsize=3, ecolor="#333")
        for yi, (_, stats, goal, _) in zip(y, shown, strict=True):
            ax.annotate(f"{stats['median']:.3g}", (stats["p90"], yi), xytext=(4, -4), textcoords="offset points",
                        fontsize=8)  # fmt: skip
            if goal is not None:
                ax.plot([goal, goal], [yi - 0.42, yi + 0.42], color="#d62728", linewidth=2.2)
        ax.set_yticks(y, [label for label, *_ in shown], fontsize=9)
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
        right = max([s["p90"] for _, s, _, _ in shown] + [g for *_, g, _ in shown if g is not None] + [1.0])
        if ax.get_xscale() == "linear":
            ax.set_xlim(0, right * 1.18)  # room for the value labels and the target marks
        if any(goal is not None for _, _, goal, _ in shown):
            ax.plot([], [], color="#d62728", linewidth=2.2, label="target")
            ax.legend(loc="lower right", fontsize=8)

    colors = {"sqlite": "#8c8c8c", "postgres": "#336791", "redis": "#d82c20"}
    goals = {"sqlite": {}, "postgres": POSTGRES_FLOOR, "redis": {"miss": REDIS_FLOOR, "hit": REDIS_FLOOR}}
    items = [
        (
            f"{ledger} {mode} {kind}",
            _get(floor, ledger, f"{mode}.{kind}", "ratio"),
            goals[ledger].get(kind),
            colors[ledger],
        )
        for ledger in ("redis", "postgres", "sqlite")
        for mode in ("sync", "async")
        for kind in ("miss", "hit")
    ]
    axes[0].set_xscale("log")
    bars(axes[0], items, "ours / raw floor (log scale; 1 = no overhead)")
    axes[0].axvline(1, color="#333", linewidth=0.8)
    axes[0].set_title("Server ledgers: time per call vs the raw client")

    cpu = _get(results, "overhead", "memory", "library_cpu") or {}

    def in_json(config: str) -> dict[str, float] | None:
        entry = cpu.get(config)
        return entry["vs_json"] if entry else None

    memory_items = [
        ("ours sync first call", in_json("ours.sync.miss"), CPU_IN_JSON["miss"], "#2ca02c"),
        ("ours sync replay", in_json("ours.sync.hit"), CPU_IN_JSON["hit"], "#2ca02c"),
        ("ours async first call", in_json("ours.async.miss"), None, "#98df8a"),
        ("ours async replay", in_json("ours.async.hit"), None, "#98df8a"),
        ("Powertools (dict store) first call", in_json("powertools.sync.miss"), None, "#ff7f0e"),
        ("Powertools (dict store) replay", in_json("powertools.sync.hit"), None, "#ff7f0e"),
        ("Powertools local-cache replay", in_json("powertools-local-cache.sync.hit"), None, "#ffbb78"),
    ]
    bars(axes[1], memory_items, "library CPU over a bare call, in JSON round trips of the result")
    axes[1].set_title("Library CPU cost (memory ledger / no I/O)")

    alternative = results.get("alternative", {})

    def faster(*path: str) -> dict[str, float] | None:
        stats = _get(alternative, *path, "ratio")
        return _inverted(stats) if stats else None

    speed_items = [
        ("Redis miss", faster("redis", "powertools.miss"), 1.3, "#d82c20"),
        ("Redis hit (replay)", faster("redis", "powertools.hit"), 3.0, "#d82c20"),
        ("no I/O miss", faster("memory", "powertools.miss"), None, "#2ca02c"),
        ("no I/O hit", faster("memory", "powertools.hit"), None, "#2ca02c"),
        ("hit vs its local cache", faster("memory", "powertools-local-cache.hit"), None, "#98df8a"),
    ]
    bars(axes[2], speed_items, "Powertools time / ours (> 1: we are faster)")
    axes[2].axvline(1, color="#333", linewidth=0.8)
    axes[2].set_title("vs Powertools @idempotent_function")

    meta = results["meta"]
    fig.suptitle(
        f"replaysafe per-call overhead, {meta['date'][:10]}{' (quick)' if meta['settings']['quick'] else ''}: "
        "median, bars p10-p90 of per-round values, red marks = targets",
        fontsize=12,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: dict[str, Any], directory: Path, stem: str) -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png``; the chart is skipped without matplotlib."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"json": directory / f"{stem}.json", "markdown": directory / f"{stem}.md"}
    paths["json"].write_text(json.dumps(results, indent=1, default=str) + "\n")
    paths["markdown"].write_text(markdown(results) + "\n")
    try:
        png = directory / f"{stem}.png"
        chart(results, png)
        paths["png"] = png
    except ImportError:
        pass
    return paths
