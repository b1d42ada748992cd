"""Workload 9, bloat: what 1,000,000 jobs passing through leave in PostgreSQL's ``durq_job``.

A feeder queues the jobs with ``enqueue_many`` in batches of 5,000, at 10,000 a second at most,
while one worker (``default:4``) drains them, never letting more than 20,000 wait: the table holds a small queue,
as in production, and every job leaves dead row versions behind (the claim's UPDATE and the
DELETE at completion; finished jobs are not kept unless a variant says so). Every second, and at
the end: the table's size (``pg_relation_size``), its indexes' (``pg_indexes_size``) and the
claim index's, live and dead rows and the vacuum counts of ``pg_stat_user_tables``, against the
same table empty.

It runs on a PostgreSQL of the harness's own (``core/pg_server.py``) with the server defaults,
since the shared server this was built on has autovacuum off, once per variant:

- ``off``: autovacuum disabled for the table (what the shared server does for every table);
- ``defaults``: PostgreSQL's own settings (vacuum at 20% + 50 dead rows, looked at every minute);
- ``table``: the per-table settings of ``RECOMMENDED``;
- ``table, naptime 10 s``: the same, with the server looking every 10 s (a server-wide setting);
- ``kept 10 s``: as the last, finished jobs kept 10 s (``KEEP_FINISHED``), then pruned by the
  retention duty.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..adapters import Adapter
from ..core import claims, procs, ticks
from ..core.databases import Database
from ..core.session import Session, Skip
from . import scaling

NAME = "bloat"
CONCURRENCY = 4
BATCH = 5_000
BACKLOG = 20_000
# A steady 10,000 jobs a second (864 million a day): 1,000,000 jobs take 100 s, long enough for
# autovacuum to look at the table more than once even at its default of once a minute.
RATE = 10_000
SAMPLE_S = 1.0
# A backend reports its row counts to the statistics at most once a second.
STATS_DELAY_S = 1.5

# For a queue table, whose live rows swing between none and a burst: a fixed number of dead rows
# (not a share of a row count that a past burst may have inflated) starts a vacuum, and the
# vacuum of so small a table runs unthrottled.
RECOMMENDED = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_cost_delay": "0",
}


class Variant:
    def __init__(self, name: str, server: dict[str, str], table: dict[str, str], keep_finished_s: float = 0):
        self.name = name
        self.server = server  # ALTER SYSTEM settings of the private server
        self.table = table  # storage parameters of durq_job
        self.keep_finished_s = keep_finished_s  # 0: finished jobs deleted at once (not the product's default hour)


VARIANTS = [
    Variant("off", {}, {"autovacuum_enabled": "false"}),
    Variant("defaults", {}, {}),
    Variant("table", {}, RECOMMENDED),
    Variant("table, naptime 10 s", {"autovacuum_naptime": "10s"}, RECOMMENDED),
    Variant("kept 10 s", {"autovacuum_naptime": "10s"}, RECOMMENDED, keep_finished_s=10),
]

_STATS = """
SELECT pg_relation_size('durq_job'), pg_indexes_size('durq_job'), pg_relation_size('durq_job_claim'),
       n_live_tup, n_dead_tup, autovacuum_count, vacuum_count, autoanalyze_count
FROM pg_stat_user_tables WHERE relname = 'durq_job'
"""
_STAT_NAMES = ("table_bytes", "indexes_bytes", "claim_index_bytes", "live_rows", "dead_rows", "autovacuums", "vacuums",
               "autoanalyzes")  # fmt: skip


def applies(adapter: Adapter, database: str) -> bool:
    return adapter.name == "durq" and database == "postgres"


def run(session: Session, adapter: Adapter, database: str) -> None:
    jobs = session.options.bloat_jobs
    server = session.pg_server()
    for repeat in range(max(1, session.options.repeats // 3)):
        for variant in VARIANTS:
            load = procs.loadavg()
            t0 = time.monotonic()
            server.configure(variant.server)
            metrics = measure(session, adapter, server.port, variant, jobs, repeat)
            metrics["server_version"] = server.version
            params = {"variant": variant.name, "jobs": jobs, "server": variant.server, "table": variant.table}
            if variant.keep_finished_s:
                params["keep_finished_s"] = variant.keep_finished_s
            session.record(NAME, adapter, database, params, repeat, metrics, load)
            end = metrics.get("end") or {}
            session.say(
                f"  bloat {variant.name} #{repeat + 1}: table {_mb(end.get('table_bytes'))} MB, indexes "
                f"{_mb(end.get('indexes_bytes'))} MB (claim {_mb(end.get('claim_index_bytes'))} MB), dead rows "
                f"{end.get('dead_rows', '-')}, autovacuums {end.get('autovacuums', '-')}, "
                f"{metrics.get('jobs_per_s') or 0:,.0f} jobs/s{' ERROR' if 'error' in metrics else ''} "
                f"({time.monotonic() - t0:.0f} s)"
            )
            if "error" in metrics:
                session.say(metrics["error"][-1500:])


def table_stats(db: Database) -> dict[str, int]:
    rows = db.query(_STATS)
    if not rows:
        raise Skip("durq_job is not in pg_stat_user_tables")
    return {name: int(value) for name, value in zip(_STAT_NAMES, rows[0], strict=True)}


def measure(session: Session, adapter: Adapter, port: str, variant: Variant, jobs: int, repeat: int) -> dict[str, Any]:
    tag = f"bloat-{variant.name.split(',')[0].replace(' ', '')}-r{repeat}"
    with session.fresh_database(adapter, "postgres", tag, port=port) as db:
        if variant.table:
            db.query(f"ALTER TABLE durq_job SET ({', '.join(f'{key} = {value}' for key, value in variant.table.items())})")
        metrics: dict[str, Any] = {"empty": table_stats(db)}
        tick_file = session.ticks_file(f"{adapter.name}-{tag}")
        claim_file = tick_file.with_suffix(".claims")
        extra_env = {"BENCH_CLAIMS": str(claim_file), "BENCH_DURQ_KEEP_FINISHED": str(variant.keep_finished_s)}
        group = session.start_workers(adapter, db, CONCURRENCY, tick_file, extra_env=extra_env)
        feeder: dict[str, Any] = {}
        peak: dict[str, int] = {}
        series: list[list[float]] = []
        try:
            if scaling.wait_registered(db, 1, group) is None:
                metrics["error"] = f"the worker did not start; log tail:\n{group.log_tail()}"
                return metrics

            feed_args = ["durq-feed", "--n", str(jobs), "--batch", str(BATCH), "--backlog", str(BACKLOG), "--rate", str(RATE)]

            def feed() -> None:
                try:
                    feeder.update(session.agent(adapter, db, *feed_args, ticks=tick_file, timeout_s=3600))
                except (RuntimeError, OSError) as error:
                    feeder["error"] = str(error)

            thread = threading.Thread(target=feed, name="bench-feeder", daemon=True)
            started = time.monotonic()
            thread.start()
            done_at: float | None = None
            while time.monotonic() - started < 3600 and group.alive() and "error" not in feeder:
                sample = table_stats(db)
                done = ticks.count(tick_file)
                for key in ("table_bytes", "indexes_bytes", "claim_index_bytes", "dead_rows"):
                    peak[key] = max(peak.get(key, 0), sample[key])
                series.append([round(time.monotonic() - started, 1), done, sample["table_bytes"], sample["indexes_bytes"],
                               sample["claim_index_bytes"], sample["dead_rows"]])  # fmt: skip
                if done >= jobs:
                    done_at = done_at or time.monotonic()
                    if not variant.keep_finished_s or _pruned(db, time.monotonic() - done_at, variant.keep_finished_s):
                        break
                time.sleep(SAMPLE_S)
            thread.join(timeout=60)
        finally:
            exit_codes = group.stop()
        time.sleep(STATS_DELAY_S)
        metrics["end"] = table_stats(db)
        metrics["peak"] = {key: max(value, metrics["end"][key]) for key, value in peak.items()}
        metrics.update(_drain_figures(tick_file, claim_file, jobs))
        metrics["exit_codes"] = exit_codes
        metrics["feeder"] = feeder
        metrics["series"] = series
        if metrics.get("done", 0) < jobs:
            metrics["error"] = f"only {metrics.get('done', 0)} of {jobs} jobs ran; {feeder.get('error', '')}\n{group.log_tail()}"
        return metrics


def _pruned(db: Database, since_last_s: float, keep_s: float) -> bool:
    """Whether the retention duty has deleted every kept job; True as well two minutes past KEEP_FINISHED."""
    return since_last_s > keep_s + 120 or int(db.query("SELECT count(*) FROM durq_job")[0][0]) == 0


def _drain_figures(tick_file: Any, claim_file: Any, jobs: int) -> dict[str, Any]:
    records = ticks.read(tick_file)
    starts = sorted(t for _, t in records)
    figures: dict[str, Any] = {"jobs": jobs, "done": len({number for number, _ in records})}
    if len(starts) >= 2:
        figures["jobs_per_s"] = (len(starts) - 1) / (starts[-1] - starts[0])
        figures.update(claims.summarize(claim_file, starts[0] - 1, starts[-1]))
    return figures


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1_048_576:,.1f}"
