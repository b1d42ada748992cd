"""The A/B compare mode: ``python -m benchmarks.run --compare [REV | A..B]``.

Side A is a revision built beside the working tree (``core/builds.py``; by default the previous
main), side B the working tree (or a second revision, ``A..B``; either may also be a directory
holding a ``django_durq/`` of its own, a scratch copy). Both run from the same virtualenv and
benchmark site, on fresh databases, so django_durq is the only difference. For each round, each
database and each workload, A and B are measured back to back, the order alternating between
rounds (A B, then B A), so that a drift of the shared machine weighs on both sides alike.

Workloads (``--only`` picks among them): the drain (10,000 waiting no-op jobs, one worker at
concurrency 4, jobs/s from the first job's start to the last's), the enqueue-to-start latency
(200 jobs 20 ms apart, from the producer's commit to the handler's start, p50 and p99) and the
anatomy of a 20,000-job drain (``workloads/anatomy.py``: CPU per job of the worker and its
dispatcher, the dispatcher's statements, the server's CPU, time, WAL and buffers per job), whose
figures the machine's load barely moves; and, asked for by name, the scaling curve
(``workloads/scaling.py``: several ``durq_worker`` processes of a pool of 2 on PostgreSQL or
MariaDB, at the points of ``--scaling-processes``, 4 and 16 by default, ``--scaling-jobs`` jobs
each) and the limits workload's variants (``workloads/limits.py``: the same drain with no limit, a
per-key limit, a queue cap and a queue rate that never hold a job back, and a rate of 1,000/s that
holds it back all along, whose figure is the rate delivered; ``limits:queue_cap`` names one variant
alone). All on Django's default connection settings
(``BENCH_DURQ_PG_DEFAULTS=0`` in the environment measures the PostgreSQL guide's settings instead).
The table gives each side's median over rounds with its min–max, and the ratio B/A of the rounds
(median, min–max): a ratio whose range spans 1 is within the machine's noise.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .adapters import SYSTEMS, Adapter
from .core import builds, procs
from .core.session import Session, Skip
from .render import DB_LABEL
from .workloads import anatomy, drain, latency, limits, scaling

DATABASES = ("sqlite", "postgres", "mysql")
WORKLOADS = ("drain", "latency", "anatomy", "scaling", "limits", *(f"limits:{v}" for v in limits.VARIANTS))
DEFAULT_WORKLOADS = ("drain", "latency", "anatomy")
ROUNDS = 5
# A change is named only when every one of at least this many rounds agrees on its direction: an
# A/A run (the same code on both sides) differs by up to 10% in a single round on a busy machine.
MIN_ROUNDS_TO_TELL = 3
DRAIN_JOBS = 10_000
CONCURRENCY = 4
SCALING_PROCESSES = (4, 16)


@dataclass(frozen=True)
class Figure:
    workload: str
    metric: str
    name: str  # as the table says it
    unit: str
    higher_is_better: bool
    digits: int


FIGURES = (
    Figure("drain", "jobs_per_s", "drain c={c}", "jobs/s", True, 0),
    Figure("latency", "p50_ms", "latency p50", "ms", False, 2),
    Figure("latency", "p99_ms", "latency p99", "ms", False, 2),
    # The anatomy (workloads/anatomy.py): what a job costs, in measures the machine's load barely moves.
    Figure("anatomy", "summary.worker_cpu_us_per_job", "worker CPU per job", "µs", False, 1),
    Figure("anatomy", "summary.dispatcher_cpu_us_per_job", "dispatcher CPU per job", "µs", False, 1),
    Figure("anatomy", "summary.dispatcher_calls_per_1000_jobs", "dispatcher's statements per 1,000 jobs", "calls", False, 1),
    Figure("anatomy", "summary.dispatcher_wall_us_per_job", "dispatcher's wall time in statements per job", "µs", False, 1),
    Figure("anatomy", "summary.server_cpu_us_per_job", "server sessions' CPU per job", "µs", False, 1),
    Figure("anatomy", "summary.server_time_us_per_job", "server time per job (pg_stat_statements)", "µs", False, 1),
    Figure("anatomy", "summary.wal_bytes_per_job", "WAL per job", "bytes", False, 0),
    Figure("anatomy", "summary.buffers_per_job", "buffers touched per job", "buffers", False, 1),
)


def limits_figures() -> tuple[Figure, ...]:
    """The limits workload's figures: each variant is a workload of its own (``limits:per_key``)."""
    names = {
        "off": "limits: none",
        "per_key": "limits: per key, never reached",
        "queue_cap": "limits: queue cap, never reached",
        "queue_rate": "limits: queue rate, never reached",
    }
    figures = [Figure(f"limits:{variant}", "jobs_per_s", name, "jobs/s", True, 0) for variant, name in names.items()]
    held = f"limits: rate {limits.HELD_RATE:,}/s held, delivered"
    return (*figures, Figure("limits:rate_held", "delivered_per_s", held, "jobs/s", True, 0))


def scaling_figures(points: tuple[int, ...]) -> tuple[Figure, ...]:
    """The scaling curve's figures: each point is a workload of its own (``scaling:16``)."""
    return tuple(
        figure
        for processes in points
        for figure in (
            Figure(f"scaling:{processes}", "jobs_per_s", f"scaling {processes} × 2", "jobs/s", True, 0),
            Figure(f"scaling:{processes}", "server_cpu_ms_per_job", f"scaling {processes} × 2, server CPU", "ms/job", False, 3),
        )
    )


@dataclass
class Measurement:
    side: str  # "A" or "B"
    database: str
    workload: str
    round: int
    metrics: dict[str, Any]
    load: float


def sides(spec: str) -> tuple[builds.Side, builds.Side]:
    """``""``: the previous main against the working tree; ``REV``: REV against it; ``A..B``: two revisions."""
    if ".." in spec:
        first, second = spec.split("..", 1)
        return builds.side_for(first or builds.previous_main()), builds.side_for(second) if second else builds.working_tree()
    return builds.side_for(spec or builds.previous_main()), builds.working_tree()


def adapter_for(side: builds.Side) -> Adapter:
    return dataclasses.replace(SYSTEMS["durq"], label=f"django-durq {side.label}", source=side.source)


def settings_env() -> dict[str, str]:
    """Django's default connection settings unless the caller's environment says otherwise."""
    return {"BENCH_DURQ_PG_DEFAULTS": os.environ.get("BENCH_DURQ_PG_DEFAULTS", "1")}


def run(session: Session, spec: str, databases: list[str], workloads: list[str], rounds: int, jobs: int) -> str:
    """Measure both sides interleaved; the markdown table (also written beside the results file)."""
    side_a, side_b = sides(spec)
    adapters = {"A": adapter_for(side_a), "B": adapter_for(side_b)}
    session.say(f"[compare] A = {side_a.label} ({side_a.source}), B = {side_b.label} ({side_b.source})")
    if builds.dependencies(side_a) != builds.dependencies(side_b):
        session.say(
            f"[compare] note: the two sides declare different dependencies ({builds.dependencies(side_a)} against "
            f"{builds.dependencies(side_b)}); both run in the working tree's virtualenv"
        )
    env = settings_env()
    measured: list[Measurement] = []
    unavailable: dict[str, str] = {}
    points = session.options.extra.get("scaling_processes") or SCALING_PROCESSES
    # The scaling curve's points and the limits' variants are measured one at a time, each as a
    # workload of its own.
    expand = {"scaling": [f"scaling:{p}" for p in points], "limits": [f"limits:{v}" for v in limits.VARIANTS]}
    steps = [step for workload in workloads for step in expand.get(workload, [workload])]
    for round_ in range(rounds):
        order = ("A", "B") if round_ % 2 == 0 else ("B", "A")
        for database in databases:
            if database in unavailable:
                continue
            for workload in steps:
                if workload.startswith("scaling:") and database not in scaling.DATABASES:
                    continue
                for side in order:
                    adapter = adapters[side]
                    session.say(f"-- round {round_ + 1}/{rounds}: {workload} on {database}, {side} ({adapter.label})")
                    try:
                        session.check_database(adapter, database)
                    except Skip as skip:
                        unavailable[database] = str(skip)
                        session.say(f"   skipped: {skip}")
                        break
                    found = _measure(session, adapter, side, database, workload, round_, jobs, env)
                    measured.append(found)
                    record = {"side": side, "revision": (side_a if side == "A" else side_b).revision, "round": round_}
                    drains = workload == "drain" or workload.startswith("limits:")
                    record |= {"jobs": jobs, "concurrency": CONCURRENCY} if drains else {}
                    if workload.startswith("scaling:"):
                        record |= {"processes": int(workload.split(":")[1]), "jobs": session.options.scaling_jobs}
                    session.record(f"compare-{workload}", adapter, database, record, round_, found.metrics, [found.load])
                    session.say(f"   {_brief(found)}")
                if database in unavailable:
                    break
    table = render(measured, side_a, side_b, databases, workloads, rounds, jobs, env, points, session.options.scaling_jobs)
    for database, reason in unavailable.items():
        table += f"\n{DB_LABEL[database]} skipped: {reason}\n"
    out = session.results_path.with_suffix(".compare.md")
    out.write_text(table)
    session.say(f"[compare] table: {out}")
    return table


def _measure(
    session: Session, adapter: Adapter, side: str, database: str, workload: str, round_: int, jobs: int, env: dict[str, str]
) -> Measurement:
    load = procs.loadavg()[0]
    try:
        if workload == "drain":
            metrics = drain.drain_once(session, adapter, database, jobs, CONCURRENCY, f"cmp-r{round_}", env=env)
        elif workload == "anatomy":
            metrics = anatomy.measure(session, adapter, database, max(jobs, anatomy.JOBS))
        elif workload.startswith("scaling:"):
            processes = int(workload.split(":")[1])
            metrics = scaling.measure(session, adapter, database, processes, session.options.scaling_jobs, round_)
        elif workload.startswith("limits:"):
            metrics = limits.drain_variant(session, adapter, database, workload.split(":")[1], jobs, f"cmp-r{round_}", env)
        else:
            metrics = latency.measure(session, adapter, database, round_, with_idle=False, env=env)
    except (RuntimeError, OSError) as error:
        metrics = {"error": str(error)[-3000:]}
    return Measurement(side, database, workload, round_, metrics, load)


def _brief(found: Measurement) -> str:
    metrics = found.metrics
    if "error" in metrics:
        return f"ERROR: {metrics['error'][-1500:]}"
    if found.workload == "drain":
        return f"{metrics.get('jobs_per_s') or 0:,.0f} jobs/s (load {found.load:.2f})"
    if found.workload == "limits:rate_held":
        return f"delivered {metrics.get('delivered_per_s') or 0:,.0f}/s of {limits.HELD_RATE:,}/s (load {found.load:.2f})"
    if found.workload.startswith("limits:"):
        return f"{metrics.get('jobs_per_s') or 0:,.0f} jobs/s (load {found.load:.2f})"
    if found.workload.startswith("scaling:"):
        server = metrics.get("server_cpu_ms_per_job") or 0
        return f"{metrics.get('jobs_per_s') or 0:,.0f} jobs/s, server {server:.3f} ms/job (load {found.load:.2f})"
    if found.workload == "anatomy":
        return ", ".join(f"{name} {value:,.1f}" for name, value in metrics.get("summary", {}).items())
    return f"p50 {metrics.get('p50_ms') or 0:.2f} ms, p99 {metrics.get('p99_ms') or 0:.2f} ms (load {found.load:.2f})"


# --- the table ---------------------------------------------------------------------------------


def _value(found: Measurement, metric: str) -> float | None:
    if "error" in found.metrics:
        return None
    value: Any = found.metrics
    for part in metric.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if value is not None else None


def _spread(values: list[float], fmt: Callable[[float], str]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"


def change(ratios: list[float], higher_is_better: bool) -> str:
    """In words: how B compares with A when every round agrees, else within the spread."""
    if not ratios:
        return "-"
    if len(ratios) < MIN_ROUNDS_TO_TELL:
        return f"{len(ratios)} round{'s' if len(ratios) > 1 else ''}: too few to tell"
    if min(ratios) <= 1 <= max(ratios):
        return "within the spread"
    ratio = statistics.median(ratios)
    if higher_is_better:
        return f"**{ratio:.2f}× faster**" if ratio > 1 else f"**{1 / ratio:.2f}× slower**"
    return f"**{1 / ratio:.2f}× lower**" if ratio < 1 else f"**{ratio:.2f}× higher**"


def rows_for(measured: list[Measurement], database: str, figure: Figure, rounds: int) -> list[str] | None:
    by_round: dict[int, dict[str, float | None]] = {}
    for found in measured:
        if found.database == database and found.workload == figure.workload:
            by_round.setdefault(found.round, {})[found.side] = _value(found, figure.metric)
    if not any(value is not None for sides in by_round.values() for value in sides.values()):
        return None
    a_values = [sides["A"] for sides in by_round.values() if sides.get("A") is not None]
    b_values = [sides["B"] for sides in by_round.values() if sides.get("B") is not None]
    ratios = [s["B"] / s["A"] for s in by_round.values() if s.get("A") and s.get("B") is not None]

    def number(value: float) -> str:
        return f"{value:,.{figure.digits}f}"

    name = figure.name.format(c=CONCURRENCY)
    failed = rounds * 2 - len(a_values) - len(b_values)
    note = f" ({failed} failed)" if failed else ""
    return [
        f"{name}, {DB_LABEL[database]} ({figure.unit}){note}",
        _spread([float(v) for v in a_values], number),
        _spread([float(v) for v in b_values], number),
        _spread(ratios, lambda value: f"{value:.2f}×") + _pairs_won(ratios, figure.higher_is_better),
        change(ratios, figure.higher_is_better),
    ]


def _pairs_won(ratios: list[float], higher_is_better: bool) -> str:
    """In how many rounds B beat A: a host whose speed drifts between runs moves the median of a few
    rounds, but seldom lets one side win nearly every pair by chance (9 of 9 by a coin: 1 in 512)."""
    if len(ratios) < MIN_ROUNDS_TO_TELL:
        return ""
    won = sum(1 for ratio in ratios if (ratio > 1 if higher_is_better else ratio < 1))
    return f", B better in {won} of {len(ratios)}"


def render(
    measured: list[Measurement],
    side_a: builds.Side,
    side_b: builds.Side,
    databases: list[str],
    workloads: list[str],
    rounds: int,
    jobs: int,
    env: dict[str, str],
    points: tuple[int, ...] = SCALING_PROCESSES,
    scaling_jobs: int = 0,
) -> str:
    header = ["figure", f"A: {side_a.label}", f"B: {side_b.label}", "B/A", "change"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    figures = FIGURES + scaling_figures(points) + limits_figures()
    for workload in workloads:
        for figure in (figure for figure in figures if workload in (figure.workload, figure.workload.split(":")[0])):
            for database in databases:
                row = rows_for(measured, database, figure, rounds)
                if row is not None:
                    lines.append("| " + " | ".join(row) + " |")
    loads = [found.load for found in measured]
    if env["BENCH_DURQ_PG_DEFAULTS"] == "1":
        settings = "Django's default connection settings"
    else:
        settings = "PostgreSQL with the guide's server-side binding and prepared statements"
    what = []
    if "drain" in workloads:
        what.append(f"drain of {jobs:,} waiting no-op jobs by one worker at concurrency {CONCURRENCY}")
    if "latency" in workloads:
        what.append(
            f"latency of {latency.JOBS} jobs {latency.GAP_MS} ms apart, from the enqueue call's return (after its commit)"
            " to the handler's start"
        )
    if "scaling" in workloads:
        what.append(
            f"the scaling workload's points of {', '.join(map(str, points))} worker processes of a pool of 2,"
            f" {scaling_jobs:,} jobs each"
        )
    if any(workload.split(":")[0] == "limits" for workload in workloads):
        what.append(f"the limits workload's variants, each a drain of {jobs:,} jobs at concurrency {CONCURRENCY}")
    if "anatomy" in workloads:
        server = "; PostgreSQL on a server of the harness's own with pg_stat_statements" if "postgres" in databases else ""
        what.append(f"the anatomy of a drain of {max(jobs, anatomy.JOBS):,} jobs (benchmarks/workloads/anatomy.py{server})")
    notes = [
        f"A = {side_a.revision}, B = {side_b.revision}; {'; '.join(what)}; {settings}.",
        f"Each cell: median over {rounds} round{'s' if rounds > 1 else ''} (min–max); "
        "B/A: the ratio of each round's pair, median (min–max), and in how many pairs B did better; "
        f"A and B back to back in every round, the order alternating. "
        f"Load average (1 min) before each measurement: {_spread(loads, lambda value: f'{value:.2f}')} "
        f"({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs).",
    ]
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"
