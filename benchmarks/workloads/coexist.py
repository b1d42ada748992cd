"""Workload 6, coexistence on SQLite: the web app keeps writing while a worker drains the same file.

A second process plays the web app: one ORM insert every 5 ms, each its own transaction, for
``--coexist-seconds``. It runs once alone (its baseline rate), then while the worker drains
with 8 threads or processes. Reported: the app's lock errors, insert latency p50/p99/max and
its write rate against the baseline. Enough jobs are queued to keep the worker busy throughout
(from this run's drain rate when known); ``worker_busy_throughout`` says whether it was.
"""

from __future__ import annotations

import time
from typing import Any

from ..adapters import Adapter
from ..core import procs, ticks
from ..core.session import Session
from . import drain

NAME = "coexist"
CONCURRENCY = 8
BASELINE_S = 5.0


def applies(adapter: Adapter, database: str) -> bool:
    return database == "sqlite"


def jobs_needed(session: Session, adapter: Adapter, seconds: float) -> int:
    rate = session.hints.get((adapter.name, "sqlite", "drain"), 3000.0)
    return int(min(max(rate * (seconds + 5) * 2, 5000), 1_000_000))


def run(session: Session, adapter: Adapter, database: str) -> None:
    seconds = session.options.coexist_seconds
    for repeat in range(session.options.repeats):
        load = procs.loadavg()
        metrics = measure(session, adapter, seconds, repeat)
        params = {"concurrency": CONCURRENCY, "seconds": seconds, "interval_ms": 5}
        session.record(NAME, adapter, database, params, repeat, metrics, load)
        app = metrics.get("app", {})
        session.say(
            f"  coexist #{repeat + 1}: app errors {app.get('errors')}, p50 {app.get('p50_ms', 0):.1f} ms, "
            f"p99 {app.get('p99_ms', 0):.1f} ms, max {app.get('max_ms', 0):.1f} ms, "
            f"{metrics.get('app_rate_percent_of_baseline', 0):.0f}% of the app's rate alone; "
            f"worker {metrics.get('worker_jobs_per_s', 0):,.0f} jobs/s"
            f"{'' if metrics.get('worker_busy_throughout') else ' (worker ran out of jobs)'}"
        )


def measure(session: Session, adapter: Adapter, seconds: float, repeat: int) -> dict[str, Any]:
    jobs = jobs_needed(session, adapter, seconds)
    with session.fresh_database(adapter, "sqlite", f"coexist-r{repeat}") as db:
        baseline = session.agent(adapter, db, "writer", "--seconds", str(BASELINE_S))
        drain.enqueue(session, adapter, db, jobs)
        tick_file = session.ticks_file(f"{adapter.name}-coexist")
        group = session.start_workers(adapter, db, CONCURRENCY, tick_file)
        try:
            if not ticks.wait_for(tick_file, 1, timeout_s=120, alive=group.alive):
                return {"error": "the worker never started:\n" + group.log_tail()}
            done_before = ticks.count(tick_file)
            t0 = time.time()
            app = session.agent(adapter, db, "writer", "--seconds", str(seconds))
            elapsed = time.time() - t0
            done_after = ticks.count(tick_file)
        finally:
            group.stop()
    return {
        "jobs_queued": jobs,
        "baseline": baseline,
        "app": app,
        "app_errors": app["errors"],
        "app_p99_ms": app["p99_ms"],
        "app_max_ms": app["max_ms"],
        "app_rate_percent_of_baseline": app["writes_per_s"] / baseline["writes_per_s"] * 100,
        "worker_jobs_per_s": (done_after - done_before) / elapsed,
        "worker_busy_throughout": done_after < jobs,
    }
