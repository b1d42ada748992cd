"""What the harness asks a system's virtualenv to do, one command per process; prints one JSON object.

python -m benchsite.agent enqueue --n 5000 --mode single
python -m benchsite.agent latency --n 200 --gap-ms 20 --out commits.json
python -m benchsite.agent writer --seconds 10 --interval-ms 5
python -m benchsite.agent sqlite-ceiling --path f.sqlite3 --synchronous NORMAL --seconds 5
python -m benchsite.agent mysql-ceiling --database NAME --seconds 5
python -m benchsite.agent durq-fill --finished 900000 --dead 100000 --delayed 100000
python -m benchsite.agent durq-claim-cost --n 300
python -m benchsite.agent admin-render --repeats 5
python -m benchsite.agent durq-hold --n 100000
python -m benchsite.agent durq-feed --n 1000000 --batch 5000 --backlog 20000 --rate 10000
"""

import argparse
import importlib
import json
import os
import sqlite3
import sys
import time

OPS_MODULES = {
    "durq": "bench_durq.ops",
    "tasks-db": "bench_tasksdb.ops",
    "procrastinate": "bench_procrastinate.ops",
    "huey-sqlite": "bench_huey.ops",
    "huey-postgres": "bench_huey.ops",
    "celery-redis": "bench_celery.ops",
}


def setup_django():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")
    import django

    django.setup()


def ops():
    return importlib.import_module(OPS_MODULES[os.environ.get("BENCH_SYSTEM", "durq")])


def cmd_enqueue(args):
    setup_django()
    module = ops()
    numbers = list(range(args.start, args.start + args.n))
    if args.warmup:
        module.enqueue_one(-1)
    started = time.perf_counter()
    if args.mode == "single":
        for i in numbers:
            module.enqueue_one(i)
    else:
        for offset in range(0, len(numbers), args.chunk):
            module.enqueue_bulk(numbers[offset : offset + args.chunk])
    seconds = time.perf_counter() - started
    method = "one call per job, autocommit" if args.mode == "single" else module.BULK_METHOD
    return {"n": args.n, "seconds": seconds, "jobs_per_s": args.n / seconds, "method": method}


def cmd_latency(args):
    setup_django()
    module = ops()
    commits = []
    calls = []
    gap = args.gap_ms / 1000
    next_at = time.monotonic()
    for i in range(args.n):
        called = time.time()
        module.enqueue_one(i)
        commits.append((i, time.time()))
        calls.append((i, called))
        next_at += gap
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            next_at = time.monotonic()
    with open(args.out, "w") as handle:
        json.dump(commits, handle)
    if args.calls_out:  # when each enqueue call began (the wakeup workload)
        with open(args.calls_out, "w") as handle:
            json.dump(calls, handle)
    return {"n": args.n}


def cmd_writer(args):
    """The web app: one ORM insert every interval, each in its own transaction, as a request would."""
    setup_django()
    from bench_app.models import AppRow
    from django.db import OperationalError

    AppRow.objects.create(payload="warm-up")
    latencies = []
    errors = 0
    error_texts = {}
    interval = args.interval_ms / 1000
    started = time.monotonic()
    deadline = started + args.seconds
    next_at = started
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        t0 = time.perf_counter()
        try:
            AppRow.objects.create(payload="request")
        except OperationalError as error:
            errors += 1
            text = str(error)[:80]
            error_texts[text] = error_texts.get(text, 0) + 1
        latencies.append(time.perf_counter() - t0)
        next_at += interval
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            next_at = time.monotonic()  # late: do not burst to catch up
    elapsed = time.monotonic() - started
    latencies.sort()

    def pick(q):
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else None

    return {
        "writes": len(latencies) - errors,
        "errors": errors,
        "error_texts": error_texts,
        "seconds": elapsed,
        "writes_per_s": (len(latencies) - errors) / elapsed,
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
        "max_ms": latencies[-1] * 1000 if latencies else None,
    }


def cmd_sqlite_ceiling(args):
    conn = sqlite3.connect(args.path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={args.synchronous}")
    conn.execute("CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)")
    conn.execute("INSERT OR IGNORE INTO counter VALUES (1, 0)")
    commits = 0
    started = time.perf_counter()
    deadline = started + args.seconds
    while time.perf_counter() < deadline:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE counter SET value = value + 1 WHERE id = 1")
        conn.execute("COMMIT")
        commits += 1
    seconds = time.perf_counter() - started
    return {"commits": commits, "seconds": seconds, "commits_per_s": commits / seconds}


def cmd_mysql_ceiling(args):
    import MySQLdb

    conn = MySQLdb.connect(
        host=os.environ.get("DURQ_MYSQL_HOST", "127.0.0.1"),
        port=int(os.environ.get("DURQ_MYSQL_PORT", "3306")),
        user=os.environ.get("DURQ_MYSQL_USER", "root"),
        password=os.environ.get("DURQ_MYSQL_PASSWORD", ""),
        database=args.database,
    )
    conn.autocommit(True)
    cursor = conn.cursor()
    cursor.execute("CREATE TABLE counter (id INT PRIMARY KEY, value BIGINT NOT NULL) ENGINE=InnoDB")
    cursor.execute("INSERT INTO counter VALUES (1, 0)")
    commits = 0
    started = time.perf_counter()
    deadline = started + args.seconds
    while time.perf_counter() < deadline:
        cursor.execute("UPDATE counter SET value = value + 1 WHERE id = 1")
        commits += 1
    seconds = time.perf_counter() - started
    return {"commits": commits, "seconds": seconds, "commits_per_s": commits / seconds}


def cmd_durq_fill(args):
    """Add finished, dead and delayed rows to durq_job in bulk, straight in SQL."""
    setup_django()
    from benchsite import durq_scale

    return durq_scale.fill(args.finished, args.dead, args.delayed)


def cmd_durq_claim_cost(args):
    setup_django()
    from benchsite import durq_scale

    return durq_scale.claim_cost(args.n, args.batch)


def cmd_durq_hold(args):
    setup_django()
    from benchsite import durq_feed

    return durq_feed.hold(args.n, args.chunk)


def cmd_durq_feed(args):
    setup_django()
    from benchsite import durq_feed

    return durq_feed.feed(args.n, args.batch, args.backlog, args.rate)


def cmd_durq_workflow(args):
    """One workflow of ``n`` no-op jobs and a callback that waits for all of them, in one transaction."""
    setup_django()
    from bench_durq.jobs import callback, noop

    from django_durq import Workflow

    started = time.perf_counter()
    flow = Workflow("fan-out")
    members = [flow.add(noop, i=i) for i in range(args.n)]
    flow.add(callback, after=members)
    flow.enqueue()
    return {"n": args.n, "seconds": time.perf_counter() - started}


def cmd_durq_switch(args):
    """Pause or resume the queue; the wall-clock time once it committed."""
    setup_django()
    from django_durq import ops

    changed = (ops.pause if args.pause else ops.resume)(args.queue)
    return {"changed": changed, "committed_at": time.time()}


def cmd_admin_render(args):
    setup_django()
    from benchsite import durq_scale

    return durq_scale.admin_render(args.repeats)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="benchsite.agent")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("enqueue")
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--mode", choices=["single", "bulk"], default="single")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--chunk", type=int, default=5000)
    p.add_argument("--warmup", action="store_true")
    p.set_defaults(func=cmd_enqueue)
    p = sub.add_parser("latency")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--gap-ms", type=float, default=20)
    p.add_argument("--out", required=True)
    p.add_argument("--calls-out", help="also write when each enqueue call began")
    p.set_defaults(func=cmd_latency)
    p = sub.add_parser("writer")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--interval-ms", type=float, default=5)
    p.set_defaults(func=cmd_writer)
    p = sub.add_parser("sqlite-ceiling")
    p.add_argument("--path", required=True)
    p.add_argument("--synchronous", default="NORMAL")
    p.add_argument("--seconds", type=float, default=5)
    p.set_defaults(func=cmd_sqlite_ceiling)
    p = sub.add_parser("mysql-ceiling")
    p.add_argument("--database", required=True)
    p.add_argument("--seconds", type=float, default=5)
    p.set_defaults(func=cmd_mysql_ceiling)
    p = sub.add_parser("durq-fill")
    p.add_argument("--finished", type=int, default=0)
    p.add_argument("--dead", type=int, default=0)
    p.add_argument("--delayed", type=int, default=0)
    p.set_defaults(func=cmd_durq_fill)
    p = sub.add_parser("durq-claim-cost")
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--batch", type=int, default=4)
    p.set_defaults(func=cmd_durq_claim_cost)
    p = sub.add_parser("durq-hold")
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--chunk", type=int, default=5000)
    p.set_defaults(func=cmd_durq_hold)
    p = sub.add_parser("durq-feed")
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--backlog", type=int, default=20000)
    p.add_argument("--rate", type=float, default=0, help="jobs a second at most (0: as fast as drained)")
    p.set_defaults(func=cmd_durq_feed)
    p = sub.add_parser("durq-workflow")
    p.add_argument("--n", type=int, required=True)
    p.set_defaults(func=cmd_durq_workflow)
    p = sub.add_parser("durq-switch")
    p.add_argument("--queue", default="default")
    p.add_argument("--pause", action="store_true", help="pause (default: resume)")
    p.set_defaults(func=cmd_durq_switch)
    p = sub.add_parser("admin-render")
    p.add_argument("--repeats", type=int, default=5)
    p.set_defaults(func=cmd_admin_render)
    args = parser.parse_args(argv)
    result = args.func(args)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
