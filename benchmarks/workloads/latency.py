"""Workload 3, latency: an idle worker, then 200 jobs enqueued 20 ms apart by another process.

Latency is the job's start (read in the worker) minus the moment the producer's enqueue call
returned, that is after its commit. Before the first repeat, the idle worker's CPU is measured
over ``--idle-seconds``, and how much it writes meanwhile: on SQLite the write transactions
committed (``PRAGMA data_version`` read from outside, every 20 ms: a lower bound), on PostgreSQL
the transaction ids handed out, on MariaDB the writing statements run.

The ``hosts`` workload measures django-durq on MariaDB with the producer as on another host.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from ..adapters import Adapter
from ..core import databases, procs, stats, ticks
from ..core.session import Session

NAME = "latency"
JOBS = 200
GAP_MS = 20
CONCURRENCY = 4


def applies(adapter: Adapter, database: str) -> bool:
    return True


class SQLiteWrites:
    """Counts commits made to a SQLite file by other connections, from a read-only connection."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.changes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        last = conn.execute("PRAGMA data_version").fetchone()[0]
        while not self._stop.wait(0.02):
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version != last:
                self.changes += 1
                last = version
        conn.close()

    def __enter__(self) -> SQLiteWrites:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def server_writes(db: databases.Database) -> int | None:
    """A counter of the server's writes: PostgreSQL's transaction ids handed out (only a transaction
    that writes takes one), MariaDB's INSERT, UPDATE, DELETE and REPLACE statements run, whether
    or not they changed a row. Server-wide: the harness runs one measurement at a time."""
    if db.kind == "postgres":
        return int(db.query("SELECT pg_snapshot_xmax(pg_current_snapshot())")[0][0])
    if db.kind == "mysql":
        rows = db.query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_insert', 'Com_update', 'Com_delete', 'Com_replace')")
        return sum(int(row[1]) for row in rows)
    return None


def idle(session: Session, group: procs.Group, db: databases.Database) -> dict[str, Any]:
    seconds = session.options.idle_seconds
    cpu_before = group.cpu_seconds()
    if db.kind == "sqlite":
        with SQLiteWrites(db.name) as writes:
            time.sleep(seconds)
        commits: int | None = writes.changes
    else:
        before = server_writes(db)
        time.sleep(seconds)
        after = server_writes(db)
        commits = None if before is None or after is None else after - before
    cpu = group.cpu_seconds() - cpu_before
    result: dict[str, Any] = {"idle_seconds": seconds, "idle_cpu_percent": cpu / seconds * 100}
    if commits is not None:
        result["idle_writes_per_min"] = commits * 60 / seconds
    return result


def run(session: Session, adapter: Adapter, database: str) -> None:
    for repeat in range(session.options.repeats):
        load = procs.loadavg()
        metrics = measure(session, adapter, database, repeat, with_idle=repeat == 0 and session.options.idle_seconds > 0)
        session.record(NAME, adapter, database, {"jobs": JOBS, "gap_ms": GAP_MS}, repeat, metrics, load)
        idle_text = f", idle CPU {metrics['idle_cpu_percent']:.2f}%" if "idle_cpu_percent" in metrics else ""
        if "idle_writes_per_min" in metrics:
            idle_text += f", idle writes {metrics['idle_writes_per_min']:.0f}/min"
        session.say(
            f"  latency #{repeat + 1}: p50 {_ms(metrics.get('p50_ms'))} p99 {_ms(metrics.get('p99_ms'))} "
            f"max {_ms(metrics.get('max_ms'))}{idle_text}{' ERROR' if 'error' in metrics else ''}"
        )
        if "error" in metrics:
            session.say(metrics["error"][-1500:])


def measure(
    session: Session,
    adapter: Adapter,
    database: str,
    repeat: int,
    with_idle: bool,
    producer_env: dict[str, str] | None = None,
    jobs: int = JOBS,
    gap_ms: int = GAP_MS,
    settle_s: float = 2.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start a worker, let it idle ``settle_s``, then time ``jobs`` enqueues ``gap_ms`` apart from commit to start.

    ``env`` goes to the worker and the producer (a variant of the system's settings), ``producer_env``
    to the producer alone.
    """
    producer_env = (env or {}) | (producer_env or {})
    with session.fresh_database(adapter, database, f"latency-r{repeat}") as db:
        tick_file = session.ticks_file(f"{adapter.name}-latency")
        group = session.start_workers(adapter, db, CONCURRENCY, tick_file, extra_env=env)
        group.start_sampling(0.5)
        metrics: dict[str, Any] = {}
        try:
            # Ready means it ran one job; then let it settle into idling.
            session.agent(adapter, db, "enqueue", "--n", "1", "--start", "-1", extra_env=producer_env)
            if not ticks.wait_for(tick_file, 1, timeout_s=120, alive=group.alive):
                return {"error": "the worker never ran the warm-up job:\n" + group.log_tail()}
            time.sleep(settle_s)
            if with_idle:
                metrics.update(idle(session, group, db))
            commits_file = Path(session.work) / f"{session.next_tag('commits')}.json"
            enqueues = ["latency", "--n", str(jobs), "--gap-ms", str(gap_ms), "--out", str(commits_file)]
            session.agent(adapter, db, *enqueues, extra_env=producer_env)
            done = ticks.wait_for(tick_file, jobs + 1, timeout_s=60, alive=group.alive)
        finally:
            group.stop()
        commits = dict(json.loads(commits_file.read_text()))
        started = {number: t for number, t in ticks.read(tick_file) if number >= 0}
        delays = [started[number] - commits[number] for number in commits if number in started]
        metrics.update(stats.distribution_ms(delays))
        metrics["measured"] = len(delays)
        metrics["rss_mb"] = group.peak_rss_mb()
        if not done:
            metrics["error"] = f"{len(delays)} of {jobs} jobs started within 60 s"
        return metrics


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"
