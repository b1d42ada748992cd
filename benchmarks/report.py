"""``docs/benchmarks.md`` and its charts (``docs/img/bench-*.png``) from a results file.

Run through ``python -m benchmarks.render RESULTS`` in the tools virtualenv (matplotlib).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from . import render, report_flow, report_scaling
from .render import DB_LABEL, Line, groups, median

COLORS = {
    "durq": "#1f77b4",
    "tasks-db": "#8c564b",
    "procrastinate": "#2ca02c",
    "huey-sqlite": "#ff7f0e",
    "huey-postgres": "#d62728",
    "celery-redis": "#9467bd",
}


# --- targets -----------------------------------------------------------------------------------


def _durq(lines: list[Line], workload: str, database: str, metric: str, **params: Any) -> float | None:
    for first, rows in groups(lines, workload, **params):
        if first["system"] == "durq" and first["database"] == database:
            return median(rows, metric)
    return None


def _best_peer(lines: list[Line], workload: str, database: str, metric: str, **params: Any) -> tuple[str, float] | None:
    best: tuple[str, float] | None = None
    for first, rows in groups(lines, workload, **params):
        # A queue outside any database (Celery + Redis) is a peer of durq on each database.
        if first["system"] == "durq" or first["database"] not in (database, "redis"):
            continue
        value = median(rows, metric)
        if value is not None and (best is None or value > best[1]):
            best = (first["label"], value)
    return best


def _peer(lines: list[Line], system: str, workload: str, database: str, metric: str, **params: Any) -> float | None:
    for first, rows in groups(lines, workload, **params):
        if first["system"] == system and first["database"] == database:
            return median(rows, metric)
    return None


def _fmt(value: float | None, digits: int = 0, unit: str = "") -> str:
    return "-" if value is None else f"{value:,.{digits}f}{unit}"


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "**no**")


def _admin_ms(lines: list[Line], database: str, variant: str, page: str) -> float | None:
    for first, group in groups(lines, "scale", variant=variant):
        if first["database"] == database:
            return median(group, lambda row: ((row["metrics"].get("admin") or {}).get(page) or {}).get("ms"))
    return None


def targets_table(lines: list[Line]) -> str:
    rows: list[list[str]] = []
    for database, goal in (("sqlite", 20_000), ("postgres", 10_000)):
        durq = _durq(lines, "drain", database, "jobs_per_s", concurrency=4)
        tasks = _peer(lines, "tasks-db", "drain", database, "jobs_per_s", concurrency=4)
        best = _best_peer(lines, "drain", database, "jobs_per_s", concurrency=4)
        name = DB_LABEL[database]
        rows.append([f"drain c=4, {name}", f"≥ {goal:,} jobs/s", _fmt(durq, 0, " jobs/s"), _met(durq >= goal if durq else None)])
        rows.append(
            [
                f"drain c=4, {name}, vs django-tasks-db",
                "≥ 10×",
                f"{durq / tasks:.1f}×" if durq and tasks else "-",
                _met(durq / tasks >= 10 if durq and tasks else None),
            ]
        )
        if best:
            rows.append(
                [
                    f"drain c=4, {name}, vs best peer ({best[0]})",
                    "≥ 3×",
                    f"{durq / best[1]:.1f}×" if durq else "-",
                    _met(durq / best[1] >= 3 if durq else None),
                ]
            )
    for database, p50_goal, p99_goal in (("sqlite", 1, 3), ("postgres", 1, 3), ("mysql", 5, None)):
        p50 = _durq(lines, "latency", database, "p50_ms")
        p99 = _durq(lines, "latency", database, "p99_ms")
        ok = None if p50 is None or p99 is None else p50 <= p50_goal and (p99_goal is None or p99 <= p99_goal)
        rows.append(
            [
                f"latency, {DB_LABEL[database]}",
                f"p50 ≤ {p50_goal} ms" + (f", p99 ≤ {p99_goal} ms" if p99_goal else ""),
                f"p50 {_fmt(p50, 1)} ms, p99 {_fmt(p99, 1)} ms",
                _met(ok),
            ]
        )
    quiet = [line for first, rows in groups(lines, "hosts", variant="quiet") for line in rows]
    if quiet:
        # A bound, so the slowest job of every repeat counts, not the median repeat.
        slowest = max(render.values(quiet, "max_ms"), default=None)
        rows.append(
            [
                "latency, MariaDB, from another host after a quiet spell",
                "≤ 1,050 ms (the watcher's idle read every second, then one read and the claim)",
                f"max {_fmt(slowest, 1)} ms, p50 {_fmt(median(quiet, 'p50_ms'), 1)} ms",
                _met(slowest <= 1050 if slowest is not None else None),
            ]
        )
    for database in ("sqlite", "postgres", "mysql"):
        writes = _durq(lines, "latency", database, "idle_writes_per_min")
        if writes is not None:
            rows.append([f"idle worker, {DB_LABEL[database]}: writes", "none", _fmt(writes, 0, " per minute"), _met(writes == 0)])
    for database in ("sqlite", "postgres", "mysql"):
        idle_cpu = _durq(lines, "latency", database, "idle_cpu_percent")
        if idle_cpu is not None:
            rows.append([f"idle worker CPU, {DB_LABEL[database]}", "≤ 0.2%", _fmt(idle_cpu, 2, "%"), _met(idle_cpu <= 0.2)])
    rss = _durq(lines, "memory", "sqlite", "peak_process_rss_mb")
    growth = _durq(lines, "memory", "sqlite", "rss_growth_percent")
    rows.append(["memory, 1 process × 4 threads (SQLite)", "≤ 60 MB", _fmt(rss, 1, " MB"), _met(rss <= 60 if rss else None)])
    rows.append(
        [
            "memory growth, 1,000 → all jobs",
            "within ±5%",
            _fmt(growth, 1, "%"),
            _met(abs(growth) <= 5 if growth is not None else None),
        ]
    )
    for database in ("sqlite", "postgres", "mysql"):
        durq = _durq(lines, "enqueue", database, "jobs_per_s", mode="single")
        best = _best_peer(lines, "enqueue", database, "jobs_per_s", mode="single")
        if durq is not None and best is not None:
            rows.append(
                [
                    f"enqueue one at a time, {DB_LABEL[database]}",
                    f"≥ best peer ({best[0]}: {best[1]:,.0f}/s)",
                    _fmt(durq, 0, " jobs/s"),
                    _met(durq >= best[1]),
                ]
            )
        bulk = _durq(lines, "enqueue", database, "jobs_per_s", mode="bulk")
        if bulk is not None:
            rows.append(
                [f"bulk enqueue, {DB_LABEL[database]}", "≥ 50,000 jobs/s", _fmt(bulk, 0, " jobs/s"), _met(bulk >= 50_000)]
            )
    rows_loaded = next((line["params"].get("rows") for line in lines if line["params"].get("variant") == "loaded"), 0) or 0
    for database in ("sqlite", "postgres", "mysql"):
        empty = _durq(lines, "scale", database, "jobs_per_s", variant="empty")
        loaded = _durq(lines, "scale", database, "jobs_per_s", variant="loaded")
        if empty and loaded:
            rows.append(
                [
                    f"scale, drain with {rows_loaded:,} done rows, {DB_LABEL[database]}",
                    "within 1.5× of empty",
                    f"{empty / loaded:.2f}× slower",
                    _met(empty / loaded <= 1.5),
                ]
            )
        claim_empty = _durq(lines, "scale", database, "claim_ms", variant="empty")
        claim_loaded = _durq(lines, "scale", database, "claim_ms", variant="loaded")
        if claim_empty and claim_loaded:
            rows.append(
                [
                    f"scale, claim with {rows_loaded:,} done rows, {DB_LABEL[database]}",
                    "within 1.5× of empty",
                    f"{claim_loaded / claim_empty:.2f}×",
                    _met(claim_loaded / claim_empty <= 1.5),
                ]
            )
    for database in ("sqlite", "postgres", "mysql"):
        for page in ("changelist", "dead_letters"):
            empty = _admin_ms(lines, database, "empty", page)
            loaded = _admin_ms(lines, database, "loaded", page)
            if empty and loaded:
                rows.append([f"scale, admin {page.replace('_', ' ')} at {rows_loaded:,} rows, {DB_LABEL[database]}",
                             "within 2× of 1,000 rows", f"{loaded / empty:.2f}×", _met(loaded / empty <= 2)])  # fmt: skip
    errors = _durq(lines, "coexist", "sqlite", "app_errors")
    p99 = _durq(lines, "coexist", "sqlite", "app_p99_ms")
    worst = _durq(lines, "coexist", "sqlite", "app_max_ms")
    rate = _durq(lines, "coexist", "sqlite", "app_rate_percent_of_baseline")
    if errors is not None:
        rows.append(["coexistence: app lock errors", "0", _fmt(errors), _met(errors == 0)])
        rows.append(["coexistence: app insert p99 / max", "≤ 100 ms / ≤ 500 ms", f"{_fmt(p99, 1)} / {_fmt(worst, 1)} ms",
                     _met(p99 is not None and worst is not None and p99 <= 100 and worst <= 500)])  # fmt: skip
        rows.append(["coexistence: app write rate", "≥ 90% of alone", _fmt(rate, 0, "%"), _met(rate >= 90 if rate else None)])
    return render.table(["target", "goal", "measured (median)", "met"], rows)


# --- profile -----------------------------------------------------------------------------------


def profile_section(lines: list[Line]) -> str:
    parts = []
    for line in lines:
        if line["workload"] != "profile" or ("phases" not in line["metrics"] and "threads" not in line["metrics"]):
            continue
        metrics = line["metrics"]
        title = (
            f"{DB_LABEL.get(line['database'], line['database'])}, concurrency {line['params'].get('concurrency')}, "
            f"{line['params'].get('view')} view, {_fmt(metrics.get('jobs_per_s'))} jobs/s under the profiler"
        )
        if "phases" in metrics:
            rows = [
                [phase, f"{share['percent']:.1f}%", f"{share['us_per_job']:.1f}", f"{share['db_percent_of_phase']:.0f}%"]
                for phase, share in metrics["phases"].items()
            ]
            parts.append(f"**{title}** (samples of the thread holding the GIL)\n\n")
            parts.append(render.table(["phase", "share", "µs per job", "of which in django.db / driver"], rows))
        else:
            rows = [
                [role, ", ".join(f"{phase} {share:.0f}%" for phase, share in phases.items() if share >= 1)]
                for role, phases in metrics["threads"].items()
            ]
            parts.append(f"**{title}** (each thread's wall time)\n\n")
            parts.append(render.table(["thread", "where its time goes"], rows))
        parts.append("\n\n")
    return "".join(parts)


# --- charts ------------------------------------------------------------------------------------


def charts(lines: list[Line], img: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    written = []

    concurrencies = sorted({line["params"].get("concurrency") for line in lines if line["workload"] == "drain"} - {None})
    if concurrencies:
        fig, axes = plt.subplots(1, len(concurrencies), figsize=(6 * len(concurrencies), 4.5), squeeze=False)
        for axis, concurrency in zip(axes[0], concurrencies, strict=True):
            _bars(axis, groups(lines, "drain", concurrency=concurrency), "jobs_per_s")
            axis.set_title(f"Drain, concurrency {concurrency}: jobs/s (median, min–max)")
        fig.tight_layout()
        fig.savefig(img / "bench-drain.png", dpi=110)
        plt.close(fig)
        written.append("bench-drain.png")

    latency = groups(lines, "latency")
    if latency:
        fig, axis = plt.subplots(figsize=(8, 0.5 + 0.45 * len(latency)))
        labels = []
        for index, (first, rows) in enumerate(latency):
            labels.append(f"{first['label']} · {DB_LABEL.get(first['database'], first['database'])}")
            for metric, marker in (("p50_ms", "o"), ("p90_ms", "s"), ("p99_ms", "^"), ("max_ms", "x")):
                value = median(rows, metric)
                if value:
                    axis.scatter(value, index, marker=marker, color=COLORS.get(first["system"], "grey"), s=40)
        axis.set_yticks(range(len(labels)), labels)
        axis.set_xscale("log")
        axis.set_xlabel("start minus commit, ms (log scale): ● p50  ■ p90  ▲ p99  × max")
        axis.set_title("Latency across processes, idle worker, 200 jobs 20 ms apart")
        axis.invert_yaxis()
        axis.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(img / "bench-latency.png", dpi=110)
        plt.close(fig)
        written.append("bench-latency.png")

    memory = [line for line in lines if line["workload"] == "memory" and line["metrics"].get("series")]
    if memory:
        databases = sorted({line["database"] for line in memory}, key=render.DB_ORDER.index)
        fig, axes = plt.subplots(1, len(databases), figsize=(6 * len(databases), 4.2), squeeze=False)
        for axis, database in zip(axes[0], databases, strict=True):
            for line in memory:
                if line["database"] != database:
                    continue
                series = line["metrics"]["series"]
                axis.plot(
                    [point[0] for point in series],
                    [point[2] for point in series],
                    label=f"{line['label']} ({line['params']['jobs']:,} jobs)",
                    color=COLORS.get(line["system"], "grey"),
                )
            axis.set_title(f"Worker RSS while draining, {DB_LABEL.get(database, database)}")
            axis.set_xlabel("seconds since the worker command started")
            axis.set_ylabel("RSS of all worker processes, MB")
            axis.legend(fontsize=8)
            axis.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(img / "bench-rss.png", dpi=110)
        plt.close(fig)
        written.append("bench-rss.png")

    enqueue = [(mode, groups(lines, "enqueue", mode=mode)) for mode in ("single", "bulk")]
    if any(found for _, found in enqueue):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), squeeze=False)
        for axis, (mode, found) in zip(axes[0], enqueue, strict=True):
            _bars(axis, found, "jobs_per_s")
            axis.set_title(f"Enqueue ({mode}): jobs/s (median, min–max)")
        fig.tight_layout()
        fig.savefig(img / "bench-enqueue.png", dpi=110)
        plt.close(fig)
        written.append("bench-enqueue.png")
    written += report_scaling.charts(lines, img, plt)
    return written


def _bars(axis: Any, found: list[tuple[Line, list[Line]]], metric: str) -> None:
    by_database: dict[str, list[tuple[Line, list[Line]]]] = defaultdict(list)
    for first, rows in found:
        by_database[first["database"]].append((first, rows))
    x = 0.0
    ticks, labels = [], []
    for database in sorted(by_database, key=render.DB_ORDER.index):
        start = x
        for first, rows in by_database[database]:
            values = render.values(rows, metric)
            if not values:
                x += 1
                continue
            mid = statistics.median(values)
            axis.bar(x, mid, color=COLORS.get(first["system"], "grey"), label=first["label"])
            axis.errorbar(x, mid, yerr=[[mid - min(values)], [max(values) - mid]], color="black", capsize=3)
            axis.text(x, mid, f"{mid:,.0f}", ha="center", va="bottom", fontsize=7)
            x += 1
        ticks.append((start + x - 1) / 2)
        labels.append(DB_LABEL.get(database, database))
        x += 0.8
    axis.set_xticks(ticks, labels)
    handles, names = axis.get_legend_handles_labels()
    unique = dict(zip(names, handles, strict=True))
    axis.legend(unique.values(), unique.keys(), fontsize=8)
    axis.grid(axis="y", alpha=0.3)


# --- the document ------------------------------------------------------------------------------


def _machine(lines: list[Line]) -> tuple[dict[str, Any], dict[str, dict[str, str]], list[float]]:
    newest = max((line for line in lines if line["workload"] == "machine"), key=lambda line: line["run_id"], default=None)
    machine = newest["metrics"] if newest else {}
    versions: dict[str, dict[str, str]] = {}
    for line in lines:
        if line.get("versions"):
            versions[line["label"]] = line["versions"]
    loads = [line["loadavg_before"][0] for line in lines if line.get("loadavg_before") and line["workload"] != "machine"]
    return machine, versions, loads


def _machines(lines: list[Line]) -> list[str]:
    """A line per machine the runs measured on, naming its runs: tables of several runs may mix machines."""
    runs_by_machine: dict[str, list[str]] = {}
    for line in sorted(lines, key=lambda line: line["run_id"]):
        if line["workload"] != "machine":
            continue
        m = line["metrics"]
        name = f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('memory_gb', '?')} GB; kernel {m.get('kernel', '?')}"
        runs_by_machine.setdefault(name, []).append(line["run_id"])
    measured = sorted({line["run_id"] for line in lines if line["workload"] != "machine"})
    unrecorded = [run for run in measured if not any(run in runs for runs in runs_by_machine.values())]
    if len(runs_by_machine) == 1 and not unrecorded:
        return [f"- CPU: {name}" for name in runs_by_machine]
    out = [f"- CPU: {name} (run{'s' if len(runs) > 1 else ''} {', '.join(runs)})" for name, runs in runs_by_machine.items()]
    if unrecorded:
        out.append(f"- machine not recorded for run{'s' if len(unrecorded) > 1 else ''} {', '.join(unrecorded)}")
    return out


def _commands(lines: list[Line]) -> dict[str, str]:
    """The command that started each run, where its lines record it."""
    return {line["run_id"]: line["command"] for line in sorted(lines, key=lambda line: line["run_id"]) if line.get("command")}


def write(lines: list[Line], source: Path, doc: Path, img: Path) -> None:
    written = charts(lines, img)
    machine, versions, loads = _machine(lines)
    run_ids = sorted({line["run_id"] for line in lines})
    out = [
        "# Benchmarks",
        "",
        "django-durq against django-tasks-db, Procrastinate, huey and Celery, with the same workloads, "
        "in the same run, on the same machine. Generated by `make bench` from "
        f"`{source.relative_to(render.REPO) if source.is_relative_to(render.REPO) else source}`; "
        "how to run each workload and add a peer: `benchmarks/README.md` in the repository.",
        "",
        "Every figure is the median over repeats, with min–max in brackets; each repeat starts fresh processes on a "
        "freshly created database. Ratios compare medians measured in the same run.",
        "",
        "A change to django-durq's worker, executor, store or dialects is measured against the previous main with "
        "`python -m benchmarks.run --compare`: both revisions in one run, back to back for each database and "
        "workload, the order alternating between rounds, with statements, CPU and server work per job beside the "
        "timed figures (`benchmarks/README.md`).",
        "",
        "Each system is configured as its own documentation recommends, otherwise left at its defaults "
        "(`benchmarks/sites/benchsite/settings.py`): persistent connections for every Django database, SQLite in WAL "
        "with `synchronous=NORMAL`, and for django-durq on PostgreSQL server-side binding with prepared statements "
        "(its PostgreSQL guide; Django's default leaves them off).",
        "",
        "## Machine and versions",
        "",
        *_machines(lines),
        f"- run(s): {', '.join(run_ids)}; django-durq at {machine.get('durq_revision', '?')}",
        *[f"- run {run_id}: `{command}`" for run_id, command in _commands(lines).items()],
        f"- load average (1 min) when measurements started: median {statistics.median(loads):.2f}, max {max(loads):.2f}"
        if loads
        else "- load average: -",
        "",
    ]
    if loads and statistics.median(loads) > 1.5:
        out += [
            "> The machine was shared with other work during this run (see the load column): absolute figures are "
            "lower and noisier than on an idle machine; ratios within one run are the figures to read.",
            "",
        ]
    out += ["| system | versions |", "|---|---|"]
    for label, found in sorted(versions.items()):
        out.append(f"| {label} | {', '.join(f'{name} {version}' for name, version in sorted(found.items()))} |")
    out += ["", "## Targets", "", targets_table(lines), ""]
    sections = [
        ("Drain", "drain", "bench-drain.png"),
        ("Enqueue", "enqueue", "bench-enqueue.png"),
        ("Latency", "latency", "bench-latency.png"),
        ("Memory", "memory", "bench-rss.png"),
    ]
    present = {line["workload"] for line in lines}
    for title, workload, chart in sections:
        if workload not in present:
            continue
        out += [f"## {title}", ""]
        if chart in written:
            out += [f"![{title}](img/{chart})", ""]
        if workload == "drain":
            for concurrency in sorted({line["params"].get("concurrency") for line in lines if line["workload"] == "drain"}):
                out += [f"Concurrency {concurrency}:", "", render.drain_table(lines, concurrency), ""]
        elif workload == "enqueue":
            out += [render.enqueue_table(lines), ""]
        elif workload == "latency":
            out += [render.latency_table(lines), ""]
            if "hosts" in present:
                out += [
                    "django-durq on MariaDB with the producer as on another host (it cannot ring the worker's bell;"
                    " the watcher's reads of the newest job ids find the jobs): `busy` as above, `quiet` 10 jobs"
                    " 8 s apart, each after the watcher has slowed to its idle read. `benchmarks/workloads/hosts.py`.",
                    "",
                    render.hosts_table(lines),
                    "",
                ]
        else:
            out += [render.memory_table(lines), ""]
    if "coexist" in present:
        out += ["## Coexistence with the web app on SQLite", "", render.coexist_table(lines), ""]
    if "ceiling" in present:
        out += ["## Ceiling: the databases' own commit rate", "", render.ceiling_table(lines), ""]
    if "scale" in present:
        out += ["## Scale", "", render.scale_table(lines), ""]
    out += report_scaling.section(lines, written)
    out += report_flow.section(lines)
    day = render.REPO / "benchmarks" / "day" / "results.md"  # the compressed day's runs, not a workload of this file
    if day.exists():
        out += [day.read_text().strip(), ""]
    if "profile" in present:
        out += ["## Where django-durq's worker spends a job", "", profile_section(lines)]
        findings = render.REPO / "benchmarks" / "profile-findings.md"
        if findings.exists():
            out += [findings.read_text().strip(), ""]
    notes = render.skipped(lines)
    if notes:
        out += ["## Skipped", "", *notes, ""]
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(out).rstrip() + "\n")
