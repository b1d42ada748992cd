"""Workload 2, drain: N waiting no-op jobs, then the real worker command at concurrency 1 and 4.

Jobs/s counts from the first job's start to the last job's start (the jobs do nothing, so that
is when the last one finished); wall time counts from the worker's launch, start-up included.
CPU is every worker process's user + system time, per job. Peak RSS is the sum over the
worker's processes, sampled every 100 ms.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..adapters import Adapter
from ..core import databases, procs, ticks
from ..core.session import Session

NAME = "drain"
CONCURRENCIES = (1, 4)


def applies(adapter: Adapter, database: str) -> bool:
    return True


def enqueue(
    session: Session, adapter: Adapter, db: databases.Database, jobs: int, start: int = 0, env: dict[str, str] | None = None
) -> None:
    """Queue ``jobs`` no-op jobs with the system's fastest enqueue call (not timed), then refresh statistics.

    A PostgreSQL server may run without autovacuum (this machine's does); ANALYZE after the bulk
    load gives every system the planner statistics autovacuum would have within a minute.
    """
    args = ("enqueue", "--n", str(jobs), "--mode", "bulk", "--start", str(start))
    session.agent(adapter, db, *args, timeout_s=3600, extra_env=env)
    databases.analyze(db)


def drain_once(
    session: Session,
    adapter: Adapter,
    database: str,
    jobs: int,
    concurrency: int,
    label: str,
    before: Callable[[databases.Database], dict[str, Any]] | None = None,
    after: Callable[[databases.Database], dict[str, Any]] | None = None,
    sample_interval_s: float = 0.1,
    series_points: int = 0,
    env: dict[str, str] | None = None,
    starts: list[float] | None = None,
) -> dict[str, Any]:
    """One drain on a fresh database; its metrics (``error`` set when it did not finish).

    ``env`` goes to the enqueue and to the workers (a variant of the system's settings). Given
    ``starts``, the jobs' start times (wall clock, sorted) are added to it.
    """
    with session.fresh_database(adapter, database, label) as db:
        extra: dict[str, Any] = {}
        if before is not None:
            extra.update(before(db))
        enqueue(session, adapter, db, jobs, env=env)
        tick_file = session.ticks_file(f"{adapter.name}-{label}")
        group = session.start_workers(adapter, db, concurrency, tick_file, extra_env=env)
        group.start_sampling(sample_interval_s)
        try:
            finished = ticks.wait_for(tick_file, jobs, timeout_s=120 + jobs / 20, alive=group.alive)
            cpu = group.cpu_seconds()
        finally:
            group.stop_sampling()
            exit_codes = group.stop()
        metrics = summarize(tick_file, jobs, group, cpu)
        if starts is not None:
            starts.extend(sorted(t for _, t in ticks.read(tick_file)))
        metrics["concurrency_model"] = adapter.concurrency_model(concurrency)
        metrics["exit_codes"] = exit_codes
        if not finished:
            metrics["error"] = f"only {metrics['done']} of {jobs} jobs ran; worker log tail:\n{group.log_tail()}"
        if series_points:
            metrics["series"] = rss_series(group, tick_file, series_points)
        if after is not None:
            extra.update(after(db))
        metrics.update(extra)
        return metrics


def summarize(tick_file: Any, jobs: int, group: procs.Group, cpu: float) -> dict[str, Any]:
    records = ticks.read(tick_file)
    starts = sorted(t for _, t in records)
    unique = {number for number, _ in records}
    metrics: dict[str, Any] = {
        "jobs": jobs,
        "done": len(unique),
        "duplicates": len(records) - len(unique),
        "cpu_s": cpu,
        "cpu_ms_per_job": cpu * 1000 / max(len(records), 1),
        "peak_rss_mb": group.peak_rss_mb(),
        "peak_pss_mb": group.peak_pss_mb(),
        "peak_process_rss_mb": group.peak_process_mb(),
        "processes": max((sample.processes for sample in group.samples), default=0),
    }
    if len(starts) >= 2:
        span = starts[-1] - starts[0]
        metrics["jobs_per_s"] = (len(starts) - 1) / span if span > 0 else None
        metrics["startup_s"] = starts[0] - group.started
        metrics["wall_s"] = starts[-1] - group.started
        metrics["jobs_per_s_wall"] = len(starts) / metrics["wall_s"]
    return metrics


def rss_series(group: procs.Group, tick_file: Any, points: int) -> list[list[float]]:
    """[seconds since launch, jobs done, RSS MB, PSS MB] at up to ``points`` samples."""
    starts = sorted(t for _, t in ticks.read(tick_file))
    samples = group.samples
    step = max(1, len(samples) // points)
    series = []
    done = 0
    for sample in samples[::step]:
        while done < len(starts) and starts[done] <= sample.t:
            done += 1
        series.append([round(sample.t - group.started, 3), done, round(sample.rss_mb, 2), round(sample.pss_mb, 2)])
    return series


def rate_hint(session: Session, adapter: Adapter, database: str, metrics: dict[str, Any]) -> None:
    rate = metrics.get("jobs_per_s")
    if rate:
        session.hints[(adapter.name, database, "drain")] = float(rate)


def run(session: Session, adapter: Adapter, database: str) -> None:
    options = session.options
    jobs = options.extra.get("drain_jobs", options.jobs)
    for concurrency in options.extra.get("concurrency", CONCURRENCIES):
        for repeat in range(options.repeats):
            load = procs.loadavg()
            t0 = time.monotonic()
            metrics = drain_once(session, adapter, database, jobs, concurrency, f"drain-c{concurrency}-r{repeat}")
            params = {"jobs": jobs, "concurrency": concurrency}
            session.record(NAME, adapter, database, params, repeat, metrics, load)
            if concurrency == 4:
                rate_hint(session, adapter, database, metrics)
            session.say(
                f"  drain c={concurrency} #{repeat + 1}: {_fmt(metrics.get('jobs_per_s'))} jobs/s, "
                f"wall {_fmt(metrics.get('wall_s'), 2)} s, cpu {_fmt(metrics.get('cpu_ms_per_job'), 3)} ms/job, "
                f"peak RSS {_fmt(metrics.get('peak_rss_mb'), 1)} MB, load {load[0]:.2f}"
                f"{' ERROR' if 'error' in metrics else ''} ({time.monotonic() - t0:.0f} s)"
            )
            if "error" in metrics:
                session.say(metrics["error"][-1500:])


def _fmt(value: Any, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
