"""The "Scaling" section of ``docs/benchmarks.md``: the curve, where one server saturates, a model
of larger servers, and the job table's bloat under autovacuum. Written from the results of the
``scaling`` and ``bloat`` workloads by ``report.write``.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from . import render
from .render import DB_LABEL, Line, median

# A point adds "little" past the knee when doubling the processes gains less than this.
KNEE_GAIN = 1.10
# A server CPU per job this much higher at the last point than at the best one is worth a sentence.
GROWTH = 1.5
# Cores of the database servers the model is written out for (and this machine's count).
MODEL_CORES = (8, 16, 32, 64)
# The model's second column: the server kept at half its CPU, headroom for bursts and vacuum.
HEADROOM = 0.5
SECONDS_PER_DAY = 86_400


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def machine_cores(lines: list[Line]) -> int:
    """The core count of the machine the results were measured on (the last run's)."""
    machines = [line["metrics"].get("cores") for line in lines if line["workload"] == "machine"]
    return int(machines[-1]) if machines and machines[-1] else 2


def best_point(lines: list[Line], database: str) -> tuple[int, list[Line]] | None:
    """The number of processes with the highest median jobs/s, and its lines."""
    points = [(processes, group) for processes, group in render.scaling_points(lines, database) if median(group, "jobs_per_s")]
    if not points:
        return None
    return max(points, key=lambda point: median(point[1], "jobs_per_s") or 0.0)


def knee(lines: list[Line], database: str) -> int | None:
    """The fewest processes past which doubling them gains less than ``KNEE_GAIN``."""
    points = [(processes, median(group, "jobs_per_s")) for processes, group in render.scaling_points(lines, database)]
    for (processes, rate), (_, following) in itertools.pairwise(points):
        if rate and following is not None and following < rate * KNEE_GAIN:
            return processes
    return None


def saturation(lines: list[Line], database: str) -> str:
    best = best_point(lines, database)
    if best is None:
        return ""
    processes, group = best
    rate = median(group, "jobs_per_s") or 0.0
    one = render.scaling_points(lines, database)[0]
    one_rate = median(one[1], "jobs_per_s") if one[0] == 1 else None
    workers = median(group, "cpu_ms_per_job")
    server = median(group, "server_cpu_ms_per_job")
    busy = median(group, "machine_busy_percent")
    at = knee(lines, database)
    text = [
        f"**{DB_LABEL[database]}**: the most, {rate:,.0f} jobs/s, at {_processes(processes)}"
        + (f" ({rate / one_rate:.1f}× one process)" if one_rate else "")
        + (
            f"; past {_processes(at)}, doubling them adds less than {KNEE_GAIN - 1:.0%}."
            if at
            else "; it still rose at the last point."
        )
    ]
    if workers is not None and server is not None and busy is not None:
        total = workers + server
        cores = machine_cores(lines)
        text.append(
            f"At that point the machine's CPUs were {busy:.0f}% busy: the workers spent {workers:.3f} ms of CPU per job "
            f"and the server {server:.3f} ms, {total:.3f} ms together, and {cores} cores give at most "
            f"{cores * 1000 / total:,.0f} jobs/s at that cost."
        )
    points = render.scaling_points(lines, database)
    last_processes, last = points[-1]
    last_server = median(last, "server_cpu_ms_per_job")
    if server and last_server and last_processes > processes and last_server > server * GROWTH:
        text.append(
            f"From {processes} to {last_processes} processes the server's CPU per job grew {last_server / server:.1f}×, "
            f"to {last_server:.3f} ms, and the claim p50 to {_fmt(median(last, 'claim_p50_ms'), 0)} ms, with batches "
            f"of about {_fmt(median(last, 'jobs_per_claim'))} jobs: more than sharing the cores explains. What grows "
            "with the processes, and what changed since, is measured in the profile findings below."
        )
    return " ".join(text)


def _per_day(per_s: float) -> str:
    per_day = per_s * SECONDS_PER_DAY
    return f"{per_day / 1e9:,.1f} billion" if per_day >= 1e9 else f"{per_day / 1e6:,.0f} million"


def model_table(lines: list[Line], database: str) -> tuple[str, float] | None:
    best = best_point(lines, database)
    if best is None:
        return None
    server = median(best[1], "server_cpu_ms_per_job")
    if not server:
        return None
    rows = []
    here = machine_cores(lines)
    for cores in sorted({here, *MODEL_CORES}):
        per_s = cores * 1000 / server
        rows.append(
            [
                str(cores) + (" (as many as this machine)" if cores == here else ""),
                _fmt(per_s),
                _per_day(per_s),
                _per_day(per_s * HEADROOM),
            ]
        )
    header = ["server cores", "jobs/s", "jobs/day at full CPU", f"jobs/day at {HEADROOM:.0%} CPU"]
    return render.table(header, rows), server


def _ceiling(lines: list[Line], database: str) -> float | None:
    rates = [
        median([line], "commits_per_s")
        for line in lines
        if line["workload"] == "ceiling" and line["database"] == database and "clients" in line["params"]
    ]
    found = [rate for rate in rates if rate]
    return max(found) if found else None


def _alter_table(variant: list[Line]) -> str:
    settings = variant[0]["params"].get("table") or {}
    return "ALTER TABLE durq_job SET (" + ", ".join(f"{key} = {value}" for key, value in settings.items()) + ");"


def _naptime_lines(naptime: str) -> list[str]:
    return [
        "-- server-wide (postgresql.conf, or as below), for every database: how often autovacuum looks",
        f"ALTER SYSTEM SET autovacuum_naptime = '{naptime}';",
        "SELECT pg_reload_conf();",
    ]


def _variant(lines: list[Line], name: str) -> list[Line] | None:
    return dict(render.bloat_variants(lines)).get(name)


def _peak_mb(group: list[Line], stat: str) -> float | None:
    return median(group, lambda row: ((row["metrics"].get("peak") or {}).get(stat) or 0) / 1_048_576)


def bloat_section(lines: list[Line], chart: bool) -> list[str]:
    variants = render.bloat_variants(lines)
    if not variants:
        return []
    first = variants[0][1][0]
    jobs = first["params"].get("jobs", 0)
    version = first["metrics"].get("server_version", "?")
    out = [
        "### Table bloat",
        "",
        f"{jobs:,} jobs pass through `durq_job` on PostgreSQL {version}: a feeder queues them with `enqueue_many` in "
        "batches of 5,000 at 10,000 a second at most (864 million a day), never more than 20,000 waiting, while one "
        "worker (`default:4`) drains them; finished jobs are deleted at once (`KEEP_FINISHED` 0) unless the "
        "variant says otherwise. Each job leaves dead row versions behind: its claim's UPDATE and its DELETE. Sizes "
        "are `pg_relation_size` of the table, `pg_indexes_size` and the claim index's own size, the largest of the "
        "once-a-second samples and at the end (a vacuum that finds the last pages empty gives them back); dead rows "
        "and autovacuum runs from `pg_stat_user_tables` (`benchmarks/workloads/bloat.py`). The shared server of "
        "these benchmarks runs with autovacuum off, which a table's settings cannot turn on, so this runs on a "
        "PostgreSQL cluster of the harness's own with the server defaults (`benchmarks/core/pg_server.py`): "
        "autovacuum on, 3 workers, a look at each database every minute "
        "(`autovacuum_naptime`).",
        "",
        *(["![Bloat](img/bench-bloat.png)", ""] if chart else []),
        render.bloat_table(lines),
        "",
    ]
    recommended = _variant(lines, "table, naptime 10 s") or _variant(lines, "table")
    defaults = _variant(lines, "defaults")
    off = _variant(lines, "off")
    if recommended:
        naptime = (recommended[0]["params"].get("server") or {}).get("autovacuum_naptime")
        out += [
            "Recommended for the job table of a busy queue: vacuum after a fixed number of dead rows rather than a "
            "share of the live ones (a queue's live row count swings from none to a burst, and the share is taken "
            "of the count the last vacuum saw), and without the cost-based pause, since a table vacuumed this often "
            "is small:",
            "",
            "```sql",
            _alter_table(recommended),
            *(_naptime_lines(naptime) if naptime else []),
            "```",
            "",
        ]
        summary = []
        for label, group in (("autovacuum off", off), ("the defaults", defaults), ("these settings", recommended)):
            if group:
                table_mb, index_mb = _peak_mb(group, "table_bytes"), _peak_mb(group, "claim_index_bytes")
                summary.append(f"{label}: table {_fmt(table_mb, 1)} MB, claim index {_fmt(index_mb, 1)} MB")
        if summary:
            out += [f"Largest while {jobs:,} jobs passed: " + "; ".join(summary) + ".", ""]
        table_only = _variant(lines, "table")
        if defaults and table_only:
            gain = (_peak_mb(defaults, "table_bytes") or 0) / max(_peak_mb(table_only, "table_bytes") or 1e-9, 1e-9)
            if gain < 1.5:
                out += [
                    "The table's own settings changed little while autovacuum looked once a minute (the "
                    f"`defaults` and `table` rows, {gain:.2f}× apart): a steady stream's bloat is bounded by how often "
                    "autovacuum looks, a server-wide setting. The fixed threshold is for the burst this run did not "
                    "have, after which the default threshold (a share of the last count) stays high.",
                    "",
                ]
    kept = _variant(lines, "kept 10 s")
    if kept:
        out += [
            f"Kept then pruned (`KEEP_FINISHED` 10 s): the worker drained {_fmt(median(kept, 'jobs_per_s'))} jobs/s "
            "here, as a kept job is one UPDATE each at completion where deleted ones go in one DELETE per batch, "
            "and the retention duty deletes at most 10,000 per pass (20 batches of 500), about one pass a second.",
            "",
        ]
    return out


def _load_note(lines: list[Line]) -> list[str]:
    loads = [line["loadavg_before"][0] for line in lines if line["workload"] == "scaling" and line.get("loadavg_before")]
    if not loads or statistics.median(loads) <= 1.5:
        return []
    return [
        f"> Other work shared the machine while these ran (load column, up to {max(loads):.1f}): absolute figures are "
        "lower and noisier than on an idle machine; each figure is the median of three repeats, taken in turn.",
        "",
    ]


def section(lines: list[Line], charts_drawn: list[str]) -> list[str]:
    """The Markdown lines of the section; none when neither workload has results."""
    present = {line["workload"] for line in lines}
    if "scaling" not in present and "bloat" not in present:
        return []
    out = ["## Scaling: worker processes on one database", ""]
    if "scaling" in present:
        sample = next(line for line in lines if line["workload"] == "scaling" and "processes" in line["params"])
        jobs = sample["params"].get("jobs", 0)
        pool = sample["params"].get("pool", 2)
        out += [
            f"django-durq alone. 1 to 16 `durq_worker` processes, each with a pool of {pool} (`--queue default:{pool}`), "
            f"drain {jobs:,} no-op jobs from one database server on this machine, deleting each as it finishes "
            "(`KEEP_FINISHED` 0). The jobs are queued before the "
            "workers start and become due at one instant once every process has registered, so none starts early "
            f"(`benchmarks/workloads/scaling.py`). A pool of {pool}: a host or container of a scaled-out deployment is "
            "small, and what many hosts add is claimers, each process with its own dispatcher, connections and claim "
            "statements; threads of one process share one dispatcher.",
            "",
            "Claim p50 / p99: how long each call of the claim took in the workers, over every claim during the drain "
            "(`sites/bench_durq/claim_log.py` wraps the dialect's `claim`, and PostgreSQL's `claim_counted`, "
            "in the benchmark site): the one claim "
            "statement on PostgreSQL; the locking read and the UPDATE on MariaDB. Workers CPU: all worker processes. "
            "Sessions CPU: the server backends (PostgreSQL) or connection threads (MariaDB) serving this database. "
            "Server CPU: the whole server process, background writers, WAL and InnoDB purge included. CPUs busy: the "
            "share of both cores in use from the due instant to the last job's start, the server included.",
            "",
            *(["![Scaling](img/bench-scaling.png)", ""] if "bench-scaling.png" in charts_drawn else []),
            render.scaling_table(lines),
            "",
            *_load_note(lines),
            "### Where one server saturates on this machine",
            "",
        ]
        for database in ("postgres", "mysql"):
            text = saturation(lines, database)
            if text:
                out += [text, ""]
        out += [
            "The workers and the database server share the machine's two cores: past the knee, another process "
            "adds claims but no CPU, so jobs/s stays flat or falls while each claim waits longer for a core.",
            "",
            "### What a larger server would carry (a model)",
            "",
            "A simple model, not a measurement. Assumptions: the workers run on other hosts, so the server's cores "
            "serve only the queue; each job costs the server the CPU it cost here at the best point of the curve "
            "(whole server process, background work included); that cost spreads evenly over cores and stays the "
            "same at every size (no lock or WAL contention beyond what 16 processes showed here); the disk keeps up "
            "with the commits; handlers take no database time of their own; jobs come in batches as large as here "
            "(a no-op job lets a worker claim ahead as many as it starts in 20 ms, `PREFETCH`: about 200 per claim; "
            "longer jobs are claimed fewer at a time, and each claim's cost falls on fewer jobs). Then jobs/s = "
            "cores × 1,000 / (server CPU ms per job).",
            "",
        ]
        for database in ("postgres", "mysql"):
            found = model_table(lines, database)
            if found is None:
                continue
            text, server = found
            best = best_point(lines, database)
            per_claim = median(best[1], "jobs_per_claim") if best else None
            ceiling = _ceiling(lines, database)
            out += [f"**{DB_LABEL[database]}** ({server:.3f} ms of server CPU per job):", "", text, ""]
            last_processes, last = render.scaling_points(lines, database)[-1]
            last_server = median(last, "server_cpu_ms_per_job")
            if best and last_server and last_server > server * GROWTH:
                out += [
                    f"On {DB_LABEL[database]} this holds for about as many claiming processes as the best point had "
                    f"({best[0]}): at {last_processes} each job cost the server {last_server / server:.1f}× as much, so "
                    "more cores serve more jobs only if they do not come with more claimers.",
                    "",
                ]
            if per_claim and ceiling:
                out += [
                    f"Disk: a worker's claim round (completions and the next claim) is one commit, here "
                    f"{per_claim:,.0f} jobs per claim, so {1000 / server:,.0f} jobs/s per core need about "
                    f"{1000 / server / per_claim:,.0f} commits/s per core; this machine's server gave "
                    f"{ceiling:,.0f} one-row commits/s at best (`ceiling`).",
                    "",
                ]
        held = [
            f"{count:.0f} on {DB_LABEL[database]}"
            for database in ("postgres", "mysql")
            for processes, group in render.scaling_points(lines, database)
            if processes == 16 and (count := median(group, "server_connections"))
        ]
        if held:
            out += [
                f"Connections: 16 processes held {' and '.join(held)} with a no-op job (a slot connects only once "
                "a handler queries; `docs/workers.md` counts them). Size `max_connections` to the number of "
                "processes, or put a pool in session mode in front.",
                "",
            ]
    out += bloat_section(lines, "bench-bloat.png" in charts_drawn)
    return out


def charts(lines: list[Line], img: Any, plt: Any) -> list[str]:
    """``bench-scaling.png`` (jobs/s and claim p99 by processes) and ``bench-bloat.png`` (size by jobs passed)."""
    return _scaling_chart(lines, img, plt) + _bloat_chart(lines, img, plt)


def _bloat_chart(lines: list[Line], img: Any, plt: Any) -> list[str]:
    variants = [(name, group[0]["metrics"].get("series")) for name, group in render.bloat_variants(lines)]
    variants = [(name, series) for name, series in variants if series]
    if not variants:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, series in variants:
        done = [point[1] for point in series]
        axes[0].plot(done, [point[2] / 1_048_576 for point in series], label=name)
        axes[1].plot(done, [point[4] / 1_048_576 for point in series], label=name)
    for axis, title in zip(axes, ("durq_job table, MB", "claim index, MB"), strict=True):
        axis.set_xlabel("jobs started")
        axis.set_title(title + " (first repeat)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(img / "bench-bloat.png", dpi=110)
    plt.close(fig)
    return ["bench-bloat.png"]


def _scaling_chart(lines: list[Line], img: Any, plt: Any) -> list[str]:
    databases = [database for database in ("postgres", "mysql") if render.scaling_points(lines, database)]
    if not databases:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for database in databases:
        points = render.scaling_points(lines, database)
        x = [processes for processes, _ in points]
        axes[0].plot(x, [median(group, "jobs_per_s") for _, group in points], marker="o", label=DB_LABEL[database])
        axes[1].plot(x, [median(group, "claim_p99_ms") for _, group in points], marker="o", label=DB_LABEL[database])
    for axis, title in zip(axes, ("jobs/s (median)", "claim p99, ms (median)"), strict=True):
        axis.set_xscale("log", base=2)
        axis.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
        axis.set_xlabel("durq_worker processes (pool of 2 each), one 2-core machine")
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(img / "bench-scaling.png", dpi=110)
    plt.close(fig)
    return ["bench-scaling.png"]


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"
