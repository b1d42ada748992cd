"""Where a drain's time goes, in measures the machine's load barely moves: statements and CPU per job.

Not in a default run. One worker at concurrency 4 drains 20,000 waiting no-op jobs (``--jobs``
if larger) with Django's default connection settings; the worker records every statement its
threads send and each thread's CPU time (``sites/bench_durq/anatomy.py``). Over the steady part
of the drain, from the first job's start to the last's:

- per thread (dispatcher, slots, lease keeper, monitor, events, …): CPU µs per job;
- per statement (normalized SQL) and thread: how many per 1,000 jobs, and the wall and CPU time
  the calling thread spent in each (on SQLite the engine runs in that thread, so this is the
  database's own time);
- transaction control, which on PostgreSQL and MariaDB costs a round trip each: Django's commits
  and autocommit switches (MariaDB's driver sends ``SET autocommit``; psycopg sends ``BEGIN``
  before the transaction's first statement);
- on PostgreSQL, a server of the harness's own with ``pg_stat_statements`` (``core/pg_server.py``):
  calls, execution and planning time, rows and WAL per statement, over the whole worker run;
- the database server's sessions' CPU per job (``core/dbserver.py``; MariaDB's is the shared
  server's, whose statement counters would mix in other work).

Compare revisions with ``--revision REV`` (``run.py``): the same workload against a built revision.
"""

from __future__ import annotations

import collections
import json
import os
import re
from typing import Any

from ..adapters import Adapter
from ..core import databases, dbserver, procs, ticks
from ..core.pg_server import PostgresServer
from ..core.session import Session, Skip
from . import drain

NAME = "anatomy"
JOBS = 20_000
CONCURRENCY = 4
_servers: dict[int, PostgresServer] = {}


def applies(adapter: Adapter, database: str) -> bool:
    return adapter.name == "durq"


def run(session: Session, adapter: Adapter, database: str) -> None:
    jobs = max(session.options.jobs, JOBS)
    load = procs.loadavg()
    metrics = measure(session, adapter, database, jobs)
    session.record(NAME, adapter, database, {"jobs": jobs, "concurrency": CONCURRENCY}, 0, metrics, load)
    for line in report(metrics):
        session.say("  " + line)


def _private_postgres(session: Session) -> PostgresServer:
    server = _servers.get(id(session))
    if server is None:
        missing = PostgresServer.missing()
        if missing:
            raise Skip(missing)
        server = PostgresServer(session.work, {"shared_preload_libraries": "pg_stat_statements",
                                               "pg_stat_statements.track_planning": "on"})  # fmt: skip
        server.start()
        session.say(f"[postgres] own PostgreSQL {server.version} with pg_stat_statements on 127.0.0.1:{server.port}")
        session.on_close(server.stop)
        _servers[id(session)] = server
    return server


def measure(session: Session, adapter: Adapter, database: str, jobs: int) -> dict[str, Any]:
    port = _private_postgres(session).port if database == "postgres" else None
    env = {"BENCH_DURQ_PG_DEFAULTS": os.environ.get("BENCH_DURQ_PG_DEFAULTS", "1")}
    with session.fresh_database(adapter, database, "anatomy", port=port) as db:
        drain.enqueue(session, adapter, db, jobs, env=env)
        if db.kind == "postgres":
            db.query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            db.query("SELECT pg_stat_statements_reset()")
        tick_file = session.ticks_file(f"{adapter.name}-anatomy")
        record_file = session.work / f"{session.next_tag('anatomy')}-{database}.json"
        group = session.start_workers(adapter, db, CONCURRENCY, tick_file, extra_env=env | {"BENCH_ANATOMY": str(record_file)})
        try:
            ticks.wait_for(tick_file, 1, timeout_s=120, alive=group.alive)
            server = dbserver.ServerCPU(db, databases.PG["host"] if db.kind == "postgres" else databases.MYSQL["host"])
            before = server.read()
            done_at_start = ticks.count(tick_file)
            finished = ticks.wait_for(tick_file, jobs, timeout_s=120 + jobs / 100, alive=group.alive)
            after = server.read()
            done_in_between = ticks.count(tick_file) - done_at_start
        finally:
            group.stop()
        metrics: dict[str, Any] = {"jobs": jobs, "finished": finished, "record": str(record_file)}
        records = ticks.read(tick_file)
        starts = sorted(t for _, t in records)
        if len(starts) < 2:
            metrics["error"] = f"{len(starts)} jobs ran; worker log tail:\n{group.log_tail()}"
            return metrics
        t0, t1 = starts[0], starts[-1]
        metrics["window_s"] = t1 - t0
        metrics["window_jobs"] = len(starts) - 1
        metrics["jobs_per_s"] = (len(starts) - 1) / (t1 - t0) if t1 > t0 else None
        spent = dbserver.spent(before, after)
        if spent["sessions_cpu_s"] is not None and done_in_between:
            metrics["server_sessions_us_per_job"] = spent["sessions_cpu_s"] * 1e6 / done_in_between
        if not record_file.exists():
            metrics["error"] = "the worker wrote no anatomy record:\n" + group.log_tail()
            return metrics
        recorded = json.loads(record_file.read_text())
        per_job = len(starts) - 1
        metrics["threads_us_per_job"] = thread_cpu(recorded["cpu"], t0, t1, per_job)
        metrics["statements"] = statements(recorded["statements"], t0, t1, per_job)
        if db.kind == "postgres":
            metrics["server_statements"] = pg_statements(db, len(records))
        metrics["summary"] = summary(metrics)
        return metrics


def summary(metrics: dict[str, Any]) -> dict[str, float]:
    """The figures the compare mode tabulates (see ``compare.FIGURES``)."""
    threads = metrics["threads_us_per_job"]
    mine = [entry for entry in metrics["statements"] if entry["thread"] == "dispatcher" and entry["source"] != "sqlite"]
    found = {
        "worker_cpu_us_per_job": threads.get("process", 0.0),
        "dispatcher_cpu_us_per_job": threads.get("dispatcher", 0.0),
        "slots_cpu_us_per_job": threads.get("slots", 0.0),
        # Every statement and transaction switch the dispatcher sent: a round trip each on PostgreSQL
        # (but the autocommit switches) and on MariaDB.
        "dispatcher_calls_per_1000_jobs": sum(entry["per_1000_jobs"] for entry in mine),
        "dispatcher_wall_us_per_job": sum(entry["wall_us_per_job"] for entry in mine),
    }
    if "server_sessions_us_per_job" in metrics:
        found["server_cpu_us_per_job"] = metrics["server_sessions_us_per_job"]
    server = metrics.get("server_statements")
    if server:
        found["server_time_us_per_job"] = sum(entry["server_us_per_job"] for entry in server)
        found["wal_bytes_per_job"] = sum(entry["wal_bytes_per_job"] for entry in server)
        found["buffers_per_job"] = sum(entry["blocks_per_job"] for entry in server)
    return found


# --- threads -----------------------------------------------------------------------------------


def role(thread: str) -> str:
    name = thread.split("#", 1)[0]
    if name.startswith("durq-") and name.endswith("-dispatch"):
        return "dispatcher"
    if re.match(r"^durq-.+-\d+$", name):
        return "slots"
    if name == "MainThread":
        return "main"
    return name.removeprefix("durq-")


def _at(samples: list[tuple[float, int]], moment: float) -> float | None:
    """A thread's CPU ns at ``moment``, interpolated between the samples around it."""
    before = [(t, v) for t, v in samples if t <= moment]
    after = [(t, v) for t, v in samples if t >= moment]
    if not before and not after:
        return None
    if not before:
        return 0.0 if after[0][0] - moment < 1 else None  # the thread began after the moment
    if not after:
        return float(before[-1][1])
    (ta, va), (tb, vb) = before[-1], after[0]
    return float(va) if tb == ta else va + (vb - va) * (moment - ta) / (tb - ta)


def thread_cpu(cpu: list[list[Any]], t0: float, t1: float, jobs: int) -> dict[str, float]:
    """CPU µs per job each kind of thread spent between ``t0`` and ``t1``."""
    series: dict[str, list[tuple[float, int]]] = collections.defaultdict(list)
    for moment, sample in cpu:
        for thread, value in sample.items():
            series[thread].append((moment, value))
    spent: dict[str, float] = collections.defaultdict(float)
    for thread, samples in series.items():
        first, last = _at(samples, t0), _at(samples, t1)
        if first is not None and last is not None:
            spent["process" if thread == "process" else role(thread)] += (last - first) / 1000 / max(jobs, 1)
    return dict(sorted(spent.items(), key=lambda item: -item[1]))


# --- statements --------------------------------------------------------------------------------

_SPACES = re.compile(r"\s+")
# Literals first (SQLite's trace callback hands over the statement with its values written in),
# then lists of any length collapsed, so that one statement of any batch size is one shape.
_ITEM = r"(?:%s|\?|N|'…'|\$N)"
_REWRITES = [
    (re.compile(r"([\"`])s\d+_x\d+\1"), "sN_xN"),  # Django's savepoint names
    (re.compile(r"'(?:[^']|'')*'"), "'…'"),
    (re.compile(r"(?<![\w$])-?\d+(?:\.\d+)?\b"), "N"),
    (re.compile(r"\$\d+"), "$N"),
    (re.compile(rf"(\(id = {_ITEM} AND claim_token = {_ITEM}\))( OR \(id = {_ITEM} AND claim_token = {_ITEM}\))+"), r"\1 OR …"),
    (re.compile(rf"(WHEN {_ITEM} THEN {_ITEM})( WHEN {_ITEM} THEN {_ITEM})+"), r"\1 …"),
    (re.compile(rf"({_ITEM})(, ?{_ITEM})+"), r"\1, …"),
]


# What each statement of the job's life is, for the summary: (label, pattern), the first match wins.
KINDS = [
    ("claim", re.compile(r"WITH expired AS|durq_claim|^UPDATE durq_job SET status = \S+, attempts = attempts \+")),
    (
        "claim: MariaDB's locking read",
        re.compile(r"^SELECT .* FROM durq_job FORCE INDEX \(durq_job_claim\).*FOR UPDATE SKIP LOCKED"),
    ),
    ("claim: MariaDB's update", re.compile(r"^UPDATE durq_job SET reclaimed_from = CASE")),
    ("completion: delete", re.compile(r"^DELETE FROM durq_job WHERE")),
    (
        "completion: keep as finished",
        # Every dialect's form: a CASE list, arrays (PostgreSQL), a JSON text joined (SQLite, MariaDB).
        re.compile(r"^UPDATE durq_job (AS j JOIN .*)?SET (j\.)?status = \S+, (j\.)?lease_expires_ms = \S+, (j\.)?finished_ms ="),
    ),
    (
        "lease renewal",
        re.compile(r"^(UPDATE durq_job SET lease_expires_ms|SELECT id, (claim_token, )?stop_requested FROM durq_job)"),
    ),
    ("look for limited jobs", re.compile(r"limit_key IS NOT NULL")),
    ("savepoint", re.compile(r"^(RELEASE )?SAVEPOINT ")),
    ("BEGIN", re.compile(r"^(BEGIN|\[AUTOCOMMIT OFF\])")),
    ("COMMIT", re.compile(r"^(COMMIT|\[COMMIT\])")),
    ("autocommit on", re.compile(r"^\[AUTOCOMMIT ON\]")),
    ("PRAGMA data_version", re.compile(r"^PRAGMA data_version")),
]


def kind(sql: str) -> str:
    for label, pattern in KINDS:
        if pattern.search(sql):
            return label
    return "other"


def by_kind(entries: list[dict[str, Any]], fields: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Sum ``fields`` (per-job figures) and calls over the statements of each kind."""
    summed: dict[str, dict[str, float]] = {}
    for entry in entries:
        total = summed.setdefault(kind(entry["sql"]), dict.fromkeys(("per_1000_jobs", *fields), 0.0))
        for field in ("per_1000_jobs", *fields):
            total[field] += entry[field]
    return dict(sorted(summed.items(), key=lambda item: -item[1][fields[0]]))


def shape(sql: str) -> str:
    text = _SPACES.sub(" ", sql).strip()
    for pattern, replacement in _REWRITES:
        text = pattern.sub(replacement, text)
    return text


def statements(recorded: list[list[Any]], t0: float, t1: float, jobs: int) -> list[dict[str, Any]]:
    """Statements sent between ``t0`` and ``t1``, by thread kind and shape: per 1,000 jobs, µs each."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for moment, thread, source, sql, wall_ns, cpu_ns in recorded:
        if not t0 <= moment <= t1:
            continue
        key = (role(thread), source, shape(sql))
        entry = groups.setdefault(key, [0, 0, 0])
        entry[0] += 1
        entry[1] += wall_ns
        entry[2] += cpu_ns
    found = [
        {
            "thread": thread,
            "source": source,
            "sql": sql,
            "per_1000_jobs": count * 1000 / max(jobs, 1),
            "wall_us_each": wall / count / 1000,
            "cpu_us_each": cpu / count / 1000,
            "wall_us_per_job": wall / 1000 / max(jobs, 1),
        }
        for (thread, source, sql), (count, wall, cpu) in groups.items()
    ]
    return sorted(found, key=lambda entry: (entry["thread"], -entry["per_1000_jobs"]))


def pg_statements(db: databases.Database, jobs: int) -> list[dict[str, Any]]:
    """``pg_stat_statements`` of this database over the worker's whole run, per 1,000 jobs."""
    rows = db.query(
        "SELECT calls, total_exec_time, total_plan_time, rows, wal_records, wal_bytes, shared_blks_hit + shared_blks_read,"
        " regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY calls DESC"
    )
    found = []
    for calls, exec_ms, plan_ms, rows_, wal_records, wal_bytes, blocks, query in rows:
        if "pg_stat_statements" in query:
            continue
        n = int(calls)
        found.append(
            {
                "sql": shape(query.replace("$", "%s")),
                "per_1000_jobs": n * 1000 / max(jobs, 1),
                "exec_us_each": float(exec_ms) * 1000 / n,
                "plan_us_each": float(plan_ms) * 1000 / n,
                "server_us_per_job": (float(exec_ms) + float(plan_ms)) * 1000 / max(jobs, 1),
                "plan_us_per_job": float(plan_ms) * 1000 / max(jobs, 1),
                "rows_each": int(rows_) / n,
                "wal_bytes_per_job": int(wal_bytes) / max(jobs, 1),
                "wal_records_per_job": int(wal_records) / max(jobs, 1),
                "blocks_per_job": int(blocks) / max(jobs, 1),
            }
        )
    return found


# --- the report ----------------------------------------------------------------------------------


def report(metrics: dict[str, Any]) -> list[str]:
    if "error" in metrics:
        return [metrics["error"][-1500:]]
    lines = [
        f"{metrics['window_jobs']:,} jobs in {metrics['window_s']:.2f} s ({metrics.get('jobs_per_s') or 0:,.0f}/s, "
        f"instrumented); server sessions {metrics.get('server_sessions_us_per_job', float('nan')):.1f} µs CPU per job",
        "CPU µs per job by thread: "
        + ", ".join(f"{name} {value:.1f}" for name, value in metrics["threads_us_per_job"].items() if value >= 0.05),
        "dispatcher's statements by kind (per 1,000 jobs; wall and CPU µs per job in the call):",
    ]
    dispatcher = [
        entry | {"cpu_us_per_job": entry["cpu_us_each"] * entry["per_1000_jobs"] / 1000}
        for entry in metrics["statements"]
        if entry["thread"] == "dispatcher" and entry["source"] != "sqlite"
    ]
    for label, total in by_kind(dispatcher, ("wall_us_per_job", "cpu_us_per_job")).items():
        calls, wall, cpu = total["per_1000_jobs"], total["wall_us_per_job"], total["cpu_us_per_job"]
        lines.append(f"  {label:<30} {calls:8.2f}  wall {wall:6.2f}  cpu {cpu:6.2f}")
    lines.append("statements per 1,000 jobs (thread, source: count × wall µs each = wall µs per job):")
    for entry in metrics["statements"]:
        lines.append(
            f"  {entry['thread']:<11} {entry['source']:<6} {entry['per_1000_jobs']:8.2f} × {entry['wall_us_each']:8.1f}"
            f" = {entry['wall_us_per_job']:6.2f}  {entry['sql'][:150]}"
        )
    if "server_statements" in metrics:
        lines.append("pg_stat_statements by kind, whole run (per 1,000 jobs; per job: server µs, of it planning, WAL, buffers):")
        fields = ("server_us_per_job", "plan_us_per_job", "wal_bytes_per_job", "blocks_per_job")
        for label, total in by_kind(metrics["server_statements"], fields).items():
            server, plan = total["server_us_per_job"], total["plan_us_per_job"]
            wal, blocks = total["wal_bytes_per_job"], total["blocks_per_job"]
            lines.append(
                f"  {label:<30} {total['per_1000_jobs']:8.2f}  {server:6.2f} µs (plan {plan:5.2f})"
                f"  WAL {wal:6.1f} B  {blocks:5.1f} buffers"
            )
    return lines
