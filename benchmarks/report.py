"""The run's outputs: the targets verdict, a markdown report, the JSON, and a PNG chart."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of the issue, measured: met, missed, or not measured in this run."""
    rows: list[dict[str, Any]] = []

    def add(
        name: str, stats: dict[str, float] | None, goal: str, unit: str, ok: Callable[[float], bool], note: str = ""
    ) -> None:
        met = None if stats is None else bool(ok(stats["median"]))
        rows.append({"target": name, "goal": goal, "unit": unit, "measured": stats, "met": met, "note": note})

    floor = results.get("floor", {})
    alternative = results.get("alternative", {})
    reference = _get(results, "overhead", "memory", "per_call_us", "reference.json", "median")
    speed = f"json.dumps + json.loads of the result took {reference:.1f} us in the same rounds" if reference else ""
    add("memory ledger CPU overhead, miss (sync, main thread, defaults)",
        _get(floor, "memory", "sync.miss", "difference_us"), "<= 10 us", "us", lambda m: m <= 10, speed)  # fmt: skip
    add("memory ledger CPU overhead, hit (sync, main thread, defaults)",
        _get(floor, "memory", "sync.hit", "difference_us"), "<= 6 us", "us", lambda m: m <= 6, speed)  # fmt: skip
    for mode in ("sync", "async"):
        add(f"Redis hit / one raw GET ({mode})", _get(floor, "redis", f"{mode}.hit", "ratio"), "<= 1.15x", "x",
            lambda m: m <= 1.15)  # fmt: skip
        add(f"Redis miss / raw SET NX + SET ({mode})", _get(floor, "redis", f"{mode}.miss", "ratio"), "<= 1.15x",
            "x", lambda m: m <= 1.15)  # fmt: skip
    for mode in ("sync", "async"):
        for kind, floor_name in (("miss", "INSERT + UPDATE"), ("hit", "one SELECT")):
            add(f"Postgres {kind} / raw {floor_name} ({mode})", _get(floor, "postgres", f"{mode}.{kind}", "ratio"),
                "<= 1.2x", "x", lambda m: m <= 1.2)  # fmt: skip
    for kind, goal in (("hit", 3.0), ("miss", 1.3)):
        stats = _get(alternative, "redis", f"powertools.{kind}", "ratio")

        def faster(m: float, goal: float = goal) -> bool:
            return m >= goal

        add(f"faster than Powertools on the same Redis, {'replay' if kind == 'hit' else 'miss'}",
            _inverted(stats) if stats else None, f">= {goal:g}x", "x faster", faster)  # fmt: skip
    scale = results.get("scale", {})
    sizes = scale.get("sizes") or []
    if sizes:
        for name in ("sqlite", "postgres", "redis"):
            stats = _get(scale, name, "sizes", str(sizes[-1]), "vs_smallest")
            add(f"flat hit latency, {name}: {sizes[-1]:,} / {sizes[0]:,} records", stats, f"<= {FLAT:g}x", "x",
                lambda m: m <= FLAT)  # fmt: skip
    return rows


def load_warning(meta: dict[str, Any]) -> str | None:
    """Why the figures are unreliable, when the machine was busy: a 1-minute load average above
    the core count at the start or the end of the run (other work then competed for the CPU)."""
    cores = (meta.get("machine") or {}).get("cores") or 1
    busy = [
        f"{load[0]:g} at {when}"
        for when, load in (("start", meta.get("load_average_at_start")), ("end", meta.get("load_average_at_end")))
        if load and load[0] > cores
    ]
    if not busy:
        return None
    return (
        f"the machine was busy (load average {' and '.join(busy)}, above its {cores} cores): other work "
        "competed for the CPU, so these figures are unreliable. Run again on a quiet machine."
    )


def summary(results: dict[str, Any], paths: dict[str, Path]) -> str:
    """The terminal's short form: each target met or missed, the load warning, where the full report is."""
    rows = results["targets"]
    counts = {verdict: sum(row["met"] is verdict for row in rows) for verdict in (True, False, None)}
    lines = [f"targets: {counts[True]} met, {counts[False]} missed, {counts[None]} not measured"]
    for row in rows:
        mark = {True: "  met   ", False: "  MISSED", None: "  -     "}[row["met"]]
        digits = 1 if row["unit"] == "us" else 2
        measured = f"{_num(row['measured']['median'], digits)} {row['unit']}" if row["measured"] else "-"
        lines.append(f"{mark} {row['target']}: {measured} (goal {row['goal']})")
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
        verdict = {True: "met", False: "**missed**", None: "not measured"}[row["met"]]
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
            "layer; PostgreSQL with `synchronous_commit=off` on both sides.",
            "",
            "| ledger | setting | ours us | floor us | ours / floor |",
            "|---|---|---|---|---|",
        ]
        for ledger, label, entry in context:
            per_call = overhead[ledger]["per_call_us"]
            ours, other = per_call.get(entry["ours"]), per_call.get(entry["other"])
            lines.append(f"| {ledger} | {label} | {_spread(ours)} | {_spread(other)} | {_spread(entry['ratio'], 2)} |")
        lines.append("")
    memory = _get(results, "floor", "memory") or {}
    if "timeout.alarm" in memory:
        lines += [
            "### The default timeout's mechanism (memory ledger, sync, first call)",
            "",
            "Extra microseconds per call over the same tool with `timeout=None`.",
            "",
            "| where the call runs | mechanism | extra us | ratio |",
            "|---|---|---|---|",
            f"| main thread | SIGALRM interval timer | {_spread(memory['timeout.alarm']['difference_us'])} "
            f"| {_spread(memory['timeout.alarm']['ratio'], 2)} |",
            f"| another thread | pooled worker thread | {_spread(memory['timeout.worker']['difference_us'])} "
            f"| {_spread(memory['timeout.worker']['ratio'], 2)} |",
            "",
        ]
    return lines


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
    for ledger in ("sqlite", "postgres", "redis"):
        data = section.get(ledger) or {}
        if "skipped" in data:
            lines.append(f"| {ledger} | {data['skipped']} | | | | |")
            continue
        for size, point in (data.get("sizes") or {}).items():
            lines.append(
                f"| {ledger} | {int(size):,} | {_spread(point['ours_hit_us'])} | {_spread(point['floor_hit_us'])} "
                f"| {_spread(point['ours_vs_floor'], 2)} | {_spread(point['vs_smallest'], 2)} |"
            )
    memory = section.get("memory")
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


def markdown(results: dict[str, Any]) -> str:
    lines = _header(results) + _targets_table(results["targets"]) + _overhead_table(results)
    lines += _concurrency_table(results) + _scale_table(results) + _parallel_table(results)
    lines += _tenxgraph_table(results)
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
    goals = {"sqlite": None, "postgres": 1.2, "redis": 1.15}
    items = [
        (f"{ledger} {mode} {kind}", _get(floor, ledger, f"{mode}.{kind}", "ratio"), goals[ledger], colors[ledger])
        for ledger in ("redis", "postgres", "sqlite")
        for mode in ("sync", "async")
        for kind in ("miss", "hit")
    ]
    axes[0].set_xscale("log")
    bars(axes[0], items, "ours / raw floor (log scale; 1 = no overhead)")
    axes[0].axvline(1, color="#333", linewidth=0.8)
    axes[0].set_title("Server ledgers: time per call vs the raw client")

    per_call = _get(results, "overhead", "memory", "per_call_us") or {}
    bare = (per_call.get("floor.sync") or {}).get("median", 0.0)

    def over_bare(name: str) -> dict[str, float] | None:
        stats = per_call.get(name)
        return {k: stats[k] - bare for k in ("median", "p10", "p90")} if stats else None

    memory_items = [
        ("ours sync miss", _get(floor, "memory", "sync.miss", "difference_us"), 10.0, "#2ca02c"),
        ("ours sync hit", _get(floor, "memory", "sync.hit", "difference_us"), 6.0, "#2ca02c"),
        ("ours async miss", _get(floor, "memory", "async.miss", "difference_us"), None, "#98df8a"),
        ("ours async hit", _get(floor, "memory", "async.hit", "difference_us"), None, "#98df8a"),
        ("Powertools (dict store) miss", over_bare("powertools.sync.miss"), None, "#ff7f0e"),
        ("Powertools (dict store) hit", over_bare("powertools.sync.hit"), None, "#ff7f0e"),
        ("Powertools local-cache hit", over_bare("powertools-local-cache.sync.hit"), None, "#ffbb78"),
    ]
    bars(axes[1], memory_items, "microseconds per call over a bare function call")
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
