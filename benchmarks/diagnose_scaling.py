"""Why MariaDB's scaling curve falls: the scaling workload on a MariaDB of the harness's own, with InnoDB's counters.

    python -m benchmarks.diagnose_scaling --processes 4,16 --jobs 50000 [--slow-log] [--revision REV|DIR]

For each number of processes, the scaling workload's ``measure()`` (``workloads/scaling.py``: every
process with ``--queue default:2``, the jobs due at one instant) runs against a private server
(``core/mariadb_server.py``, its defaults, nobody else's work in its counters), while every 250 ms
this reads ``SHOW GLOBAL STATUS``, ``INNODB_METRICS`` (all monitors on) and the lock waits in
progress (``INNODB_LOCK_WAITS`` with the waiting and the blocking statement and the record). It
prints, over the drain, per job: buffer pool page requests, record-lock conflicts, the time
sessions waited for row locks, purge's progress and the undo history's length; the most frequent
lock waits; and with ``--slow-log`` (``long_query_time = 0``, InnoDB detail) each statement kind's
pages, old row versions and time per call. Results go to ``benchmarks/results/<run id>.scaling.json``.
Not part of any run; the rates it prints depend on the machine's load, the counters per job hardly.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from . import compare
from .adapters import SYSTEMS
from .core import builds, databases, procs
from .core.mariadb_server import MariaDBServer
from .core.session import Options, Session
from .workloads import anatomy, scaling

STATUS = ("Innodb_buffer_pool_read_requests", "Innodb_row_lock_time", "Innodb_row_lock_waits", "Innodb_history_list_length",
          "Com_delete", "Com_select", "Com_update", "Com_commit")  # fmt: skip
METRICS = ("lock_rec_lock_waits", "lock_rec_lock_requests", "purge_del_mark_records", "trx_rseg_history_len")
LEVELS = ("Innodb_history_list_length", "trx_rseg_history_len")  # read as levels, not counters
WAITS = (
    "SELECT LEFT(REPLACE(r.trx_query, '\\n', ' '), 60), l.lock_index, LEFT(REPLACE(b.trx_query, '\\n', ' '), 60)"
    " FROM information_schema.INNODB_LOCK_WAITS w JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id"
    " JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id"
    " JOIN information_schema.INNODB_LOCKS l ON l.lock_id = w.requested_lock_id"
)


def sample(server: MariaDBServer) -> dict[str, Any]:
    names = ", ".join(f"'{name}'" for name in STATUS)
    metrics = ", ".join(f"'{name}'" for name in METRICS)
    out = server.sql(
        f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names});"
        f" SELECT name, count FROM information_schema.INNODB_METRICS WHERE name IN ({metrics})"
    )
    found: dict[str, Any] = {row.split("\t")[0]: float(row.split("\t")[1]) for row in out.splitlines() if "\t" in row}
    rows = server.sql(WAITS).splitlines()
    found["waits"] = [" | ".join(" ".join(part.split()[:5]) for part in row.split("\t")) for row in rows]
    return found


def summarize(samples: list[tuple[float, dict[str, Any]]], jobs: int) -> dict[str, Any]:
    """Per-job deltas over the drain, levels' mean and max.

    The drain is the longest stretch of samples in which deletes (each a batch of finished jobs)
    go on moving, no two samples in a row still: a worker's own delete before the due time would
    otherwise open the window seconds early, on the watchers' reads while the release statement
    rewrote every row (150,000 pages a read at 16 processes, most of the pages counted per job).
    """
    deletes = [values.get("Com_delete", 0.0) for _, values in samples]
    moving = [index for index in range(1, len(samples)) if deletes[index] > deletes[index - 1]]
    if not moving:
        return {}
    stretches = [[moving[0]]]
    for index in moving[1:]:
        if index - stretches[-1][-1] <= 2:
            stretches[-1].append(index)
        else:
            stretches.append([index])
    drain = max(stretches, key=len)
    first, last = drain[0] - 1, drain[-1]
    before, after = samples[first][1], samples[last][1]
    found: dict[str, Any] = {}
    for name in (*STATUS, *METRICS):
        if name in LEVELS:
            levels = [values.get(name, 0.0) for _, values in samples[first : last + 1]]
            found[name] = {"mean": statistics.mean(levels), "max": max(levels)}
        elif name in before and name in after:
            found[f"{name}_per_job"] = (after[name] - before[name]) / max(jobs, 1)
    waits = collections.Counter(wait for _, values in samples[first : last + 1] for wait in values["waits"])
    found["lock_waits_seen"] = waits.most_common(8)
    return found


def slow_log(path: Path) -> dict[str, dict[str, float]]:
    """Each statement kind's calls and median pages, old row versions and seconds per call, from a slow log."""
    entries: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("# User@Host"):
            current = {"sql": ""}
            entries.append(current)
        elif current is None or line.startswith(("SET timestamp", "use ")):
            continue
        elif line.startswith("# "):
            current.update({key: float(value) for key, value in re.findall(r"(\w+): ([\d.]+)", line)})
        else:
            current["sql"] += " " + line.strip()
    kinds: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for entry in entries:
        if "durq_job" in entry["sql"]:
            text = anatomy.shape(entry["sql"].strip().rstrip(";"))
            label = anatomy.kind(text)
            if label == "claim: MariaDB's locking read":
                label += " (expired)" if "status = '…' AND lease_expires_ms" in text else " (due)"
            elif label == "other":
                label = text[:70]
            kinds[label].append(entry)
    summary: dict[str, dict[str, float]] = {}
    for label, found in kinds.items():
        summary[label] = {"calls": len(found), "pages_total": sum(entry.get("Pages_accessed", 0.0) for entry in found)}
        for key in ("Pages_accessed", "Old_rows_read", "Query_time", "Rows_sent"):
            summary[label][f"{key}_median"] = statistics.median(entry.get(key, 0.0) for entry in found)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnose_scaling", description=__doc__.split("\n")[0])
    parser.add_argument("--processes", default="4,16", help="numbers of worker processes, comma-separated (default 4,16)")
    parser.add_argument("--jobs", type=int, default=50_000, help="jobs per point (default 50000)")
    parser.add_argument("--slow-log", action="store_true", help="log every statement with InnoDB detail and summarize it")
    parser.add_argument("--revision", metavar="REV", help="django-durq as of REV, or from a directory holding django_durq/")
    args = parser.parse_args(argv)
    missing = MariaDBServer.missing()
    if missing:
        raise SystemExit(missing)
    adapter = compare.adapter_for(builds.side_for(args.revision)) if args.revision else SYSTEMS["durq"]
    session = Session(Options(repeats=1, scaling_jobs=args.jobs))
    server = MariaDBServer(session.work)
    server.start()
    # The harness and the workers reach this server instead of the shared one.
    databases.MYSQL.update({"host": "127.0.0.1", "port": server.port, "user": "root", "password": ""})
    os.environ.update({"DURQ_MYSQL_HOST": "127.0.0.1", "DURQ_MYSQL_PORT": server.port, "DURQ_MYSQL_USER": "root"})
    os.environ.pop("DURQ_MYSQL_PASSWORD", None)
    server.sql("SET GLOBAL innodb_monitor_enable = 'all'")
    results = []
    try:
        for processes in (int(part) for part in args.processes.split(",")):
            if args.slow_log:
                server.sql(f"SET GLOBAL slow_query_log_file = '{server.slow_log()}'; SET GLOBAL long_query_time = 0;"
                           " SET GLOBAL log_slow_verbosity = 'query_plan,innodb'; SET GLOBAL slow_query_log = 1")  # fmt: skip
            samples: list[tuple[float, dict[str, Any]]] = []
            stop = threading.Event()

            def read(found: list[tuple[float, dict[str, Any]]] = samples, done: threading.Event = stop) -> None:
                while not done.wait(0.25):
                    found.append((time.time(), sample(server)))

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            load = procs.loadavg()
            metrics = scaling.measure(session, adapter, "mysql", processes, args.jobs, 0)
            stop.set()
            reader.join()
            point: dict[str, Any] = {"processes": processes, "load": load, "jobs_per_s": metrics.get("jobs_per_s"),
                                     "claim_p50_ms": metrics.get("claim_p50_ms"), "jobs_per_claim": metrics.get("jobs_per_claim"),
                                     "counters": summarize(samples, metrics.get("done", args.jobs))}  # fmt: skip
            if args.slow_log:
                server.sql("SET GLOBAL slow_query_log = 0")
                point["statements"] = slow_log(server.slow_log())
                server.slow_log().unlink(missing_ok=True)
                server.sql("FLUSH SLOW LOGS")
            results.append(point)
            print(json.dumps(point, indent=1), flush=True)
    finally:
        session.close()
        server.stop()
    out = session.results_path.with_suffix(".scaling.json")
    out.write_text(json.dumps(results, indent=1))
    print(f"[done] {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
