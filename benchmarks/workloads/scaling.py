"""Workload 8, scaling: 1, 2, 4, 8 and 16 ``durq_worker`` processes on one PostgreSQL or MariaDB.

Each process works the queue with a pool of 2 (``--queue default:2``), as a small host or a
container would: the curve then follows the number of claimers, which is what many hosts on one
database add, rather than threads of one process. The batch of no-op jobs is queued before the
workers start, due a day later; once every process has registered (its ``durq_worker`` row), one
UPDATE makes the whole batch due a few seconds later (then ANALYZE on PostgreSQL), so that every
idle dispatcher has probed and sleeps until that instant (it polls at least once a second). No
process starts early or late.

Per point: jobs/s from the first job's start to the last's, the claim statement's p50 / p99
(``sites/bench_durq/claim_log.py`` times the dialect's claim in each worker), CPU per job of the
worker processes, of the database sessions serving them and of the whole server process, and
how busy the machine's CPUs were. Repeats go round the points in turn, so that a change in the
machine's load over the run weighs on every point alike.
"""

from __future__ import annotations

import time
from typing import Any

from ..adapters import Adapter
from ..core import claims, databases, dbserver, procs, ticks
from ..core.session import Session
from . import drain

NAME = "scaling"
PROCESSES = (1, 2, 4, 8, 16)
QUICK_PROCESSES = (1, 4)
POOL = 2
# Every dispatcher probes at least once a second (POLL_INTERVAL): the due time is set that far
# past the end of the release statement. That statement takes about a second per 50,000 jobs
# with 2 processes here, and four to five at 16 (every idle worker's reads of the queue's due
# jobs, each rebuilding the versions of the rows the statement rewrites, share the cores with
# it): a due time planned at the lower rate left most of 16 processes probing before the commit
# and starting up to a second late, and the first job up to 2.6 s after the due time. The lead
# is the longest release seen at that number of processes in the session, and for the first
# one the low rate slowed by one process in four.
POLL_S = 1.0
RELEASE_LEAD_S = 2.0
RELEASE_JOBS_PER_S = 50_000
_release_s: dict[tuple[str, int], float] = {}  # (database, processes) -> the longest release per job seen


DATABASES = ("postgres", "mysql")  # where several processes share one server


def applies(adapter: Adapter, database: str) -> bool:
    return adapter.name == "durq" and database in DATABASES


def run(session: Session, adapter: Adapter, database: str) -> None:
    options = session.options
    points = options.extra.get("scaling_processes") or (QUICK_PROCESSES if options.quick else PROCESSES)
    jobs = options.scaling_jobs
    for repeat in range(options.repeats):
        for processes in points:
            load = procs.loadavg()
            t0 = time.monotonic()
            metrics = measure(session, adapter, database, processes, jobs, repeat)
            params = {"processes": processes, "pool": POOL, "jobs": jobs}
            session.record(NAME, adapter, database, params, repeat, metrics, load)
            session.say(
                f"  scaling {processes:>2} × default:{POOL} #{repeat + 1}: {_fmt(metrics.get('jobs_per_s'))} jobs/s, "
                f"claim p50 {_fmt(metrics.get('claim_p50_ms'), 2)} ms p99 {_fmt(metrics.get('claim_p99_ms'), 2)} ms, "
                f"{_fmt(metrics.get('jobs_per_claim'), 1)} jobs/claim, server {_fmt(metrics.get('server_cpu_ms_per_job'), 3)} "
                f"ms/job, machine {_fmt(metrics.get('machine_busy_percent'))}% busy, load {load[0]:.2f}"
                f"{' ERROR' if 'error' in metrics else ''} ({time.monotonic() - t0:.0f} s)"
            )
            if "error" in metrics:
                session.say(metrics["error"][-1500:])


def measure(session: Session, adapter: Adapter, database: str, processes: int, jobs: int, repeat: int) -> dict[str, Any]:
    with session.fresh_database(adapter, database, f"scaling-p{processes}-r{repeat}") as db:
        session.agent(adapter, db, "durq-hold", "--n", str(jobs), timeout_s=3600)
        databases.analyze(db)
        tick_file = session.ticks_file(f"{adapter.name}-scaling-p{processes}")
        claim_file = tick_file.with_suffix(".claims")
        group = session.start_workers(
            adapter,
            db,
            POOL,
            tick_file,
            processes=processes,
            # Finished jobs deleted at once, as published: the curve is of the claim, not of retention.
            extra_env={"BENCH_CLAIMS": str(claim_file), "BENCH_DURQ_KEEP_FINISHED": "0"},
        )
        group.start_sampling()
        metrics: dict[str, Any] = {}
        try:
            up_s = wait_registered(db, processes, group)
            if up_s is None:
                metrics["error"] = f"not all {processes} workers registered; log tail:\n{group.log_tail()}"
                return metrics
            metrics["registered_s"] = up_s
            metrics["server_connections"] = int(db.query(_CONNECTIONS[db.kind])[0][0])
            counters = dbserver.ServerCPU(db, databases.PG["host"] if db.kind == "postgres" else databases.MYSQL["host"])
            due_at, late_s = release(db, processes)
            metrics["release_late_s"] = late_s
            time.sleep(max(0.0, due_at - time.time() - 0.05))
            cpu_before, server_before = group.cpu_seconds(), counters.read()
            finished = ticks.wait_for(tick_file, jobs, timeout_s=120 + jobs / 50, alive=group.alive, poll_s=0.005)
            cpu_after, server_after = group.cpu_seconds(), counters.read()
        finally:
            group.stop_sampling()
            metrics["exit_codes"] = group.stop()
        metrics.update(drain.summarize(tick_file, jobs, group, cpu_after - cpu_before))
        starts = sorted(t for _, t in ticks.read(tick_file))
        if starts:
            metrics["start_lag_s"] = starts[0] - due_at
            metrics.update(claims.summarize(claim_file, due_at - 0.5, starts[-1]))
        spent = dbserver.spent(server_before, server_after)
        metrics.update(spent)
        done = max(len(starts), 1)
        for key in ("sessions_cpu_s", "server_cpu_s"):
            if spent[key] is not None:
                metrics[key.replace("_cpu_s", "_cpu_ms_per_job")] = spent[key] * 1000 / done
        if not finished:
            metrics["error"] = f"only {metrics['done']} of {jobs} jobs ran; worker log tail:\n{group.log_tail()}"
        return metrics


_CONNECTIONS = {
    "postgres": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    "mysql": "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
}


def wait_registered(db: databases.Database, processes: int, group: procs.Group, timeout_s: float = 180) -> float | None:
    """Seconds until every worker process has its ``durq_worker`` row; None if they did not in time."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if int(db.query("SELECT count(*) FROM durq_worker")[0][0]) >= processes:
            time.sleep(POLL_S + 0.2)  # a dispatcher's first probe follows its process's registration
            return time.monotonic() - started
        if not group.alive():
            return None
        time.sleep(0.2)
    return None


def release(db: databases.Database, processes: int) -> tuple[float, float]:
    """Make every held job due at one instant; (that instant, how late the statement ended for it)."""
    jobs = int(db.query("SELECT count(*) FROM durq_job")[0][0])
    per_job_s = _release_s.get((db.kind, processes), (1 + processes / 4) / RELEASE_JOBS_PER_S)
    started = time.time()
    due_at = started + RELEASE_LEAD_S + jobs * per_job_s
    db.query(f"UPDATE durq_job SET run_at_ms = {int(due_at * 1000)}")
    _release_s[db.kind, processes] = max(per_job_s, (time.time() - started) / max(jobs, 1))
    if db.kind == "postgres":
        # Statistics from while every job was a day away would have the planner expect no due
        # job, read the due index and sort every due row in each claim (MariaDB's claim names
        # its index).
        db.query("ANALYZE durq_job")
    # Past this, a dispatcher that probed just before the commit would wake after the due time.
    late_s = time.time() + POLL_S - due_at
    return due_at, max(0.0, late_s)


def _fmt(value: Any, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
