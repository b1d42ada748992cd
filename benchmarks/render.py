"""Results (JSON lines) to a summary: a text table, ``docs/benchmarks.md`` and PNG charts.

    python -m benchmarks.render benchmarks/results/latest.jsonl    # docs + charts (needs matplotlib)
    python -m benchmarks.render --text benchmarks/results/x.jsonl  # the text summary only
    python -m benchmarks.render benchmarks/results/latest.jsonl --merge benchmarks/results/y.jsonl

Every figure is the median over repeats with the min-max range; ratios compare medians of
django-durq and a peer on the same database, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"
IMG = REPO / "docs" / "img"

SYSTEM_ORDER = ["durq", "tasks-db", "procrastinate", "huey-sqlite", "huey-postgres", "celery-redis"]
DB_ORDER = ["sqlite", "postgres", "mysql", "redis"]
DB_LABEL = {"sqlite": "SQLite", "postgres": "PostgreSQL", "mysql": "MariaDB", "redis": "Redis"}

Line = dict[str, Any]


# --- files -----------------------------------------------------------------------------------


def load(path: Path) -> list[Line]:
    if not path.exists():
        return []
    return [json.loads(row) for row in path.read_text().splitlines() if row.strip()]


def dump(lines: Iterable[Line], path: Path) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _key(line: Line) -> tuple[str, str, str]:
    return (line["workload"], line["system"], line["database"])


def merge(old: list[Line], new: list[Line]) -> list[Line]:
    """``old`` with every (workload, system, database) that ``new`` measured replaced by ``new``'s lines.

    The machine each run measured on is kept for every run that still has a line: the page names
    the machine of each table's runs.
    """
    replaced = {_key(line) for line in new}
    measured = [line for line in old if _key(line) not in replaced] + new
    measured = [line for line in measured if line["workload"] != "machine"]
    runs = {line["run_id"] for line in measured}
    machines = {line["run_id"]: line for line in old + new if line["workload"] == "machine" and line["run_id"] in runs}
    return measured + list(machines.values())


# --- grouping ----------------------------------------------------------------------------------


def _order(line: Line) -> tuple[int, int]:
    system = SYSTEM_ORDER.index(line["system"]) if line["system"] in SYSTEM_ORDER else 99
    database = DB_ORDER.index(line["database"]) if line["database"] in DB_ORDER else 99
    return database, system


def groups(lines: list[Line], workload: str, **params: Any) -> list[tuple[Line, list[Line]]]:
    """Lines of ``workload`` whose params match, grouped by system and database: (first line, all)."""
    found: dict[tuple[str, str], list[Line]] = defaultdict(list)
    for line in lines:
        if line["workload"] != workload:
            continue
        if any(line.get("params", {}).get(key) != value for key, value in params.items()):
            continue
        found[(line["system"], line["database"])].append(line)
    return sorted(((rows[0], rows) for rows in found.values()), key=lambda pair: _order(pair[0]))


def values(rows: list[Line], metric: str | Callable[[Line], Any]) -> list[float]:
    picked = []
    for row in rows:
        value = metric(row) if callable(metric) else row.get("metrics", {}).get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            picked.append(float(value))
    return picked


def median(rows: list[Line], metric: str | Callable[[Line], Any]) -> float | None:
    found = values(rows, metric)
    return statistics.median(found) if found else None


def cell(rows: list[Line], metric: str | Callable[[Line], Any], digits: int = 0, unit: str = "") -> str:
    found = values(rows, metric)
    skipped = next((row["metrics"].get("skipped") or row["metrics"].get("error") for row in rows), None)
    if not found:
        return "skipped" if skipped and rows[0]["metrics"].get("skipped") else ("error" if skipped else "-")
    mid = statistics.median(found)
    text = f"{mid:,.{digits}f}{unit}"
    if len(found) > 1:
        text += f" ({min(found):,.{digits}f}–{max(found):,.{digits}f})"
    return text


def load_text(rows: list[Line]) -> str:
    loads = [row.get("loadavg_before", [0])[0] for row in rows if row.get("loadavg_before")]
    return f"{statistics.median(loads):.2f}" if loads else "-"


def ratio(durq: float | None, peer: float | None, higher_is_better: bool = True) -> str:
    if not durq or not peer:
        return "-"
    value = durq / peer if higher_is_better else peer / durq
    return f"{value:.2f}×"


# --- tables ------------------------------------------------------------------------------------


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def _durq_median(lines: list[Line], workload: str, database: str, metric: str, **params: Any) -> float | None:
    for first, rows in groups(lines, workload, **params):
        if first["system"] == "durq" and first["database"] == database:
            return median(rows, metric)
    return None


def versus_durq(lines: list[Line], first: Line, group: list[Line], workload: str, metric: str, **params: Any) -> str:
    """durq's median over the peer's on the same database; a queue outside any database against durq on each."""
    if first["system"] == "durq":
        return ""
    peer = median(group, metric)
    if first["database"] in DB_ORDER[:3]:
        return ratio(_durq_median(lines, workload, first["database"], metric, **params), peer)
    parts = []
    for database in DB_ORDER[:3]:
        durq = _durq_median(lines, workload, database, metric, **params)
        if durq:
            parts.append(f"{ratio(durq, peer)} ({DB_LABEL[database]})")
    return ", ".join(parts) or "-"


def drain_table(lines: list[Line], concurrency: int) -> str:
    rows = []
    for first, group in groups(lines, "drain", concurrency=concurrency):
        rows.append(
            [
                first["label"],
                DB_LABEL.get(first["database"], first["database"]),
                cell(group, "jobs_per_s"),
                cell(group, "wall_s", 2),
                cell(group, "cpu_ms_per_job", 3),
                cell(group, "peak_rss_mb", 0),
                versus_durq(lines, first, group, "drain", "jobs_per_s", concurrency=concurrency),
                load_text(group),
            ]
        )
    header = ["system", "database", "jobs/s", "wall s (with start-up)", "CPU ms/job", "peak RSS MB", "durq ×", "load"]
    return table(header, rows)


def enqueue_table(lines: list[Line]) -> str:
    rows = []
    for mode in ("single", "bulk"):
        for first, group in groups(lines, "enqueue", mode=mode):
            rows.append(
                [
                    first["label"],
                    DB_LABEL.get(first["database"], first["database"]),
                    mode,
                    cell(group, "jobs_per_s"),
                    versus_durq(lines, first, group, "enqueue", "jobs_per_s", mode=mode),
                    str(group[0]["metrics"].get("method", "")),
                ]
            )
    return table(["system", "database", "mode", "jobs/s", "durq ×", "how"], rows)


def latency_table(lines: list[Line]) -> str:
    rows = []
    for first, group in groups(lines, "latency"):
        rows.append(
            [
                first["label"],
                DB_LABEL.get(first["database"], first["database"]),
                cell(group, "p50_ms", 1),
                cell(group, "p99_ms", 1),
                cell(group, "max_ms", 1),
                cell(group, "idle_cpu_percent", 2),
                cell(group, "idle_writes_per_min", 0),
            ]
        )
    return table(["system", "database", "p50 ms", "p99 ms", "max ms", "idle CPU %", "idle writes/min"], rows)


def hosts_table(lines: list[Line]) -> str:
    rows = []
    for variant in ("busy", "quiet"):
        for first, group in groups(lines, "hosts", variant=variant):
            params = first["params"]
            rows.append(
                [
                    variant,
                    f"{params['jobs']} jobs, {params['gap_ms']:,} ms apart",
                    cell(group, "p50_ms", 1),
                    cell(group, "p99_ms", 1),
                    cell(group, "max_ms", 1),
                ]
            )
    return table(["variant", "jobs", "p50 ms", "p99 ms", "max ms"], rows)


def memory_table(lines: list[Line]) -> str:
    rows = []
    for first, group in groups(lines, "memory"):
        rows.append(
            [
                first["label"],
                DB_LABEL.get(first["database"], first["database"]),
                str(group[0]["metrics"].get("concurrency_model", "")),
                cell(group, "rss_early_mb", 1),
                cell(group, "rss_end_mb", 1),
                cell(group, "rss_growth_percent", 1, "%"),
                cell(group, "peak_rss_mb", 1),
                cell(group, "peak_pss_mb", 1),
                cell(group, "peak_process_rss_mb", 1),
            ]
        )
    header = ["system", "database", "processes", "RSS after 1k MB", "RSS at end MB", "growth", "peak RSS MB",
              "peak PSS MB", "largest process MB"]  # fmt: skip
    return table(header, rows)


def coexist_table(lines: list[Line]) -> str:
    rows = []
    for first, group in groups(lines, "coexist"):
        rows.append(
            [
                first["label"],
                cell(group, "app_errors"),
                cell(group, lambda row: row["metrics"].get("app", {}).get("p50_ms"), 1),
                cell(group, "app_p99_ms", 1),
                cell(group, "app_max_ms", 1),
                cell(group, "app_rate_percent_of_baseline", 0, "%"),
                cell(group, "worker_jobs_per_s"),
            ]
        )
    header = ["system", "app lock errors", "app p50 ms", "app p99 ms", "app max ms", "app rate vs alone", "worker jobs/s"]
    return table(header, rows)


def ceiling_table(lines: list[Line]) -> str:
    # groups() keys on (system, database); the ceiling lines differ by their params instead.
    by_params: dict[tuple[str, str], list[Line]] = defaultdict(list)
    for line in lines:
        if line["workload"] == "ceiling":
            by_params[(line["database"], json.dumps(line["params"], sort_keys=True))].append(line)
    rows = []
    for (database, params_text), group in sorted(by_params.items(), key=lambda item: DB_ORDER.index(item[0][0])):
        params = ", ".join(f"{key} {value}" for key, value in json.loads(params_text).items())
        rows.append([DB_LABEL.get(database, database), params, cell(group, "commits_per_s")])
    return table(["database", "setting", "one-row commits/s"], rows)


def scale_table(lines: list[Line]) -> str:
    rows = []
    for variant in ("empty", "loaded"):
        for first, group in groups(lines, "scale", variant=variant):
            rows.append(
                [
                    DB_LABEL.get(first["database"], first["database"]),
                    "empty (admin: 1,000 rows)"
                    if variant == "empty"
                    else f"{first['params'].get('rows', 0):,} done + 10% delayed",
                    cell(group, "claim_ms", 2),
                    cell(group, "complete_ms", 2),
                    cell(group, "probe_ms", 2),
                    cell(group, "jobs_per_s"),
                    cell(group, lambda row: ((row["metrics"].get("admin") or {}).get("changelist") or {}).get("ms"), 0),
                    cell(group, lambda row: ((row["metrics"].get("admin") or {}).get("dead_letters") or {}).get("ms"), 0),
                ]
            )
    header = ["database", "table", "claim of 4 ms", "complete 4 ms", "idle probe ms", "drain jobs/s", "admin list ms",
              "dead letters ms"]  # fmt: skip
    return table(header, rows)


def scaling_points(lines: list[Line], database: str) -> list[tuple[int, list[Line]]]:
    """django-durq's scaling lines on ``database`` by number of worker processes, fewest first."""
    found: dict[int, list[Line]] = defaultdict(list)
    for line in lines:
        if line["workload"] == "scaling" and line["database"] == database and "processes" in line["params"]:
            found[line["params"]["processes"]].append(line)
    return sorted(found.items())


def scaling_table(lines: list[Line]) -> str:
    rows = []
    for database in DB_ORDER:
        points = scaling_points(lines, database)
        one = median(points[0][1], "jobs_per_s") if points and points[0][0] == 1 else None
        for processes, group in points:
            rate = median(group, "jobs_per_s")
            rows.append(
                [
                    DB_LABEL.get(database, database),
                    f"{processes} × {group[0]['params'].get('pool')}",
                    cell(group, "jobs_per_s"),
                    f"{rate / one:.2f}×" if rate and one else "-",
                    cell(group, "claim_p50_ms", 2),
                    cell(group, "claim_p99_ms", 2),
                    cell(group, "jobs_per_claim", 1),
                    cell(group, "cpu_ms_per_job", 3),
                    cell(group, "sessions_cpu_ms_per_job", 3),
                    cell(group, "server_cpu_ms_per_job", 3),
                    cell(group, "machine_busy_percent", 0, "%"),
                    cell(group, "server_connections"),
                    load_text(group),
                ]
            )
    header = ["database", "processes × pool", "jobs/s", "vs 1 process", "claim p50 ms", "claim p99 ms", "jobs per claim",
              "workers CPU ms/job", "sessions CPU ms/job", "server CPU ms/job", "CPUs busy", "connections", "load"]  # fmt: skip
    return table(header, rows)


def bloat_variants(lines: list[Line]) -> list[tuple[str, list[Line]]]:
    """The bloat workload's lines by variant, in the order they ran."""
    found: dict[str, list[Line]] = {}
    for line in lines:
        if line["workload"] == "bloat" and "variant" in line["params"]:
            found.setdefault(line["params"]["variant"], []).append(line)
    return list(found.items())


def _mb(key: str, stat: str) -> Callable[[Line], float | None]:
    def pick(row: Line) -> float | None:
        value = (row["metrics"].get(key) or {}).get(stat)
        return None if value is None else value / 1_048_576

    return pick


def _count(key: str, stat: str) -> Callable[[Line], Any]:
    return lambda row: (row["metrics"].get(key) or {}).get(stat)


def bloat_table(lines: list[Line]) -> str:
    rows = []
    for variant, group in bloat_variants(lines):

        def peak_end(stat: str, group: list[Line] = group) -> str:
            return f"{cell(group, _mb('peak', stat), 1)} / {cell(group, _mb('end', stat), 1)}"

        rows.append(
            [
                variant,
                cell(group, "jobs_per_s"),
                f"{cell(group, _mb('empty', 'table_bytes'), 2)} / {cell(group, _mb('empty', 'indexes_bytes'), 2)}",
                peak_end("table_bytes"),
                peak_end("indexes_bytes"),
                peak_end("claim_index_bytes"),
                cell(group, _count("peak", "dead_rows")),
                cell(group, _count("end", "autovacuums")),
                cell(group, "claim_p50_ms", 2),
                cell(group, "claim_p99_ms", 2),
            ]
        )
    header = ["autovacuum", "jobs/s", "empty: table / indexes MB", "table MB, peak / end", "indexes MB, peak / end",
              "claim index MB, peak / end", "dead rows, peak", "autovacuums", "claim p50 ms", "claim p99 ms"]  # fmt: skip
    return table(header, rows)


def skipped(lines: list[Line]) -> list[str]:
    notes = []
    for line in lines:
        why = line.get("metrics", {}).get("skipped")
        if why:
            notes.append(f"- {line['workload']}: {line['label']} on {line['database']}: {why}")
    return sorted(set(notes))


def text_summary(lines: list[Line]) -> str:
    parts = []
    present = {line["workload"] for line in lines}
    if "enqueue" in present:
        parts += ["Enqueue", enqueue_table(lines)]
    if "drain" in present:
        for concurrency in sorted({line["params"].get("concurrency") for line in lines if line["workload"] == "drain"}):
            parts += [f"Drain, concurrency {concurrency}", drain_table(lines, concurrency)]
    if "latency" in present:
        parts += ["Latency", latency_table(lines)]
    if "memory" in present:
        parts += ["Memory", memory_table(lines)]
    if "coexist" in present:
        parts += ["Coexistence on SQLite", coexist_table(lines)]
    if "ceiling" in present:
        parts += ["Ceiling", ceiling_table(lines)]
    if "scale" in present:
        parts += ["Scale (django-durq)", scale_table(lines)]
    if "scaling" in present:
        parts += ["Scaling: worker processes on one database (django-durq)", scaling_table(lines)]
    if "bloat" in present:
        parts += ["Bloat of durq_job on PostgreSQL", bloat_table(lines)]
    notes = skipped(lines)
    if notes:
        parts += ["Skipped", "\n".join(notes)]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.render")
    parser.add_argument("results", type=Path)
    parser.add_argument("--text", action="store_true", help="print the summary; write nothing")
    parser.add_argument("--merge", type=Path, action="append", default=[], help="merge this results file in first")
    args = parser.parse_args(argv)
    lines = load(args.results)
    for extra in args.merge:
        lines = merge(lines, load(extra))
    if args.merge:
        dump(lines, args.results)
    if args.text:
        print(text_summary(lines))
        return 0
    from . import report

    report.write(lines, args.results, DOC, IMG)
    print(f"wrote {DOC.relative_to(REPO)} and charts in {IMG.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
