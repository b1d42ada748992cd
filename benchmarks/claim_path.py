"""The dispatcher's claim path alone: a limited claim and a kept batch, one thread, µs per job.

    python -m benchmarks.claim_path --db postgres --compare 733fb94..      # A/B, interleaved
    python -m benchmarks.claim_path --db sqlite --jobs plain --revision HEAD

What a dispatcher does per batch, without the worker around it: one transaction that keeps the
last batch as finished, frees its places and claims the next ``--batch`` jobs (the limited claim
for ``keyed`` jobs, one of 1,000 keys each with ``Limit(max_running=1)``; for ``rate``, a
queue rate never reached; for ``capped``, a queue ``max_running`` never reached; the fast claim
for ``plain``), until ``--count`` queued jobs have run.
No slots, no GIL contention, no handler: what is left is the claim path's own statements and
Python, so a change to it shows here when a drain's noise would hide it. Each side runs in its
own process, importing django_durq from its build (``core/builds.py``), on a database of its own
(``tests/settings.py``: ``DURQ_PG_*`` and ``DURQ_MYSQL_*`` say where). A measure is the best of
``--rounds`` runs (the CPU time of the process on SQLite, whose engine runs in it; the wall time
elsewhere), sides taken in turn for ``--repeats`` repeats.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .core import builds

REPO = Path(__file__).resolve().parent.parent
KEYS = 1_000


def _measure(db: str, jobs: str, count: int, batch: int, rounds: int) -> list[float]:
    """In a process whose django_durq is the side's: µs per job of each round."""
    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()
    from django_durq.db.store import Store
    from django_durq.handlers.limits import QueueLimits, Rate

    call_command("migrate", verbosity=0)
    dialect = Store("default").dialect
    limits = {
        "keyed": QueueLimits(),
        "rate": QueueLimits(rate=Rate.parse("1000000/s")),
        "capped": QueueLimits(max_running=100_000),
        "plain": None,
    }[jobs]
    vendor = connection.vendor
    numbers = {
        "sqlite": f"WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {count}) SELECT g FROM s",
        "postgresql": f"SELECT g FROM generate_series(1, {count}) AS g",
        "mysql": f"SELECT seq AS g FROM seq_1_to_{count}",
    }[vendor]
    key = ("CONCAT('k', g % {0})" if vendor == "mysql" else "'k' || (g % {0})").format(KEYS)
    times = []
    for _ in range(rounds):
        with connection.cursor() as cursor:
            for table in ("durq_job", "durq_limit_place", "durq_start", "durq_queue_control"):
                cursor.execute(f"DELETE FROM {table}")
            cursor.execute(
                "INSERT INTO durq_job (name, queue, priority, status, arguments, attempts, max_attempts, run_at_ms,"
                " created_ms, lease_ms, claim_token, claimed_by, stop_requested, errors, handbacks, limit_key,"
                f" limit_running) SELECT 'bench.keyed', 'default', 0, 'waiting', '{{}}', 0, 3, g, 0, 30000, 0, '',"
                f" FALSE, '[]', 0, {key if jobs == 'keyed' else 'NULL'}, {1 if jobs == 'keyed' else 'NULL'}"
                f" FROM ({numbers}) AS numbers"
            )
            if vendor == "postgresql":
                cursor.execute("VACUUM ANALYZE durq_job, durq_limit_place, durq_start")
        dialect.prepare_dispatcher_connection()
        clock = time.process_time if vendor == "sqlite" else time.perf_counter
        now_ms, kept, free, done = time.time_ns() // 1_000_000, [], [], 0
        started = clock()
        # Since a running row is its own place, a kept batch frees a place only where one was written.
        frees = "placed" if "placed" in inspect.signature(dialect.complete_and_claim).parameters else "free_places"
        while True:
            _, claimed = dialect.complete_and_claim(
                [], "default", batch, now_ms, "bench:1", kept=kept, limits=limits, **{frees: free}
            )
            if not claimed and not kept:
                break
            kept = [((job.id, job.claim_token), now_ms, None) for job in claimed]
            free = [(job.id, job.claim_token) for job in claimed if job.placed]
            done += len(claimed)
            now_ms += 1
        times.append((clock() - started) / count * 1e6)
        if done != count:
            raise SystemExit(f"ran {done} jobs of {count}")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "mysql"), default="sqlite")
    parser.add_argument("--jobs", choices=("keyed", "rate", "capped", "plain"), default="keyed")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=177)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare", help="A..B or REV (against the working tree), as run.py's --compare takes")
    parser.add_argument("--revision", help="one side only: a revision or a directory holding django_durq/")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.measure:
        print(" ".join(f"{value:.2f}" for value in _measure(args.db, args.jobs, args.count, args.batch, args.rounds)))
        return 0
    if args.compare is not None:
        from .compare import sides

        pair = dict(zip("AB", sides(args.compare), strict=True))
    else:
        pair = {"A": builds.side_for(args.revision) if args.revision else builds.working_tree()}
    best: dict[str, list[float]] = {side: [] for side in pair}
    for repeat in range(args.repeats):
        for name in list(pair) if repeat % 2 == 0 else list(pair)[::-1]:
            side = pair[name]
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(side.source), str(REPO)]),
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DURQ_TEST_DB": args.db,
                "DURQ_TEST_DB_IN_USE": _database(args.db, name),
            }
            command = [sys.executable, "-m", "benchmarks.claim_path", "--measure", "--db", args.db, "--jobs", args.jobs]
            command += ["--count", str(args.count), "--batch", str(args.batch), "--rounds", str(args.rounds)]
            out = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, check=False)
            if out.returncode:
                raise SystemExit(f"{side.label}: {out.stderr[-2000:]}")
            times = [float(value) for value in out.stdout.split()]
            best[name].append(min(times))
            print(f"{name} {side.label}: {min(times):.1f} µs/job (rounds {', '.join(f'{t:.1f}' for t in times)})")
    for name, side in pair.items():
        print(f"{name} = {side.label}: best of each repeat {', '.join(f'{t:.1f}' for t in best[name])} µs/job")
    if len(pair) == 2:
        ratios = [b / a for a, b in zip(best["A"], best["B"], strict=True)]
        print(f"B/A: {statistics.median(ratios):.2f}× ({min(ratios):.2f}×–{max(ratios):.2f}×)")
    return 0


def _database(db: str, side: str) -> str:
    """Each side's own database: a file for SQLite, a database made once on the server otherwise."""
    name = f"durq_claim_path_{side.lower()}"
    if db == "sqlite":
        return str(Path("/tmp") / f"{name}.sqlite3")
    if db == "postgres":
        user = os.environ.get("DURQ_PG_USER", "postgres")
        host = os.environ.get("DURQ_PG_HOST", "127.0.0.1")
        exists = subprocess.run(
            ["psql", "-h", host, "-U", user, "-d", "postgres", "-tAc", f"SELECT 1 FROM pg_database WHERE datname = '{name}'"],
            capture_output=True,
            text=True,
            check=False,
        )
        if exists.stdout.strip() != "1":
            subprocess.run(["psql", "-h", host, "-U", user, "-d", "postgres", "-qc", f"CREATE DATABASE {name}"], check=True)
        return name
    subprocess.run(["mariadb", "-h", "127.0.0.1", "-u", "root", "-e", f"CREATE DATABASE IF NOT EXISTS {name}"], check=True)
    return name


if __name__ == "__main__":
    raise SystemExit(main())
