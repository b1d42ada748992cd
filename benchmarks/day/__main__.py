"""Run the compressed day: ``python -m benchmarks.day --db postgres --minutes 30``.

Producers queue 1–50 ms jobs at a steady ``--rate`` through ``--producers`` processes (web
servers); ``--workers`` ``durq_worker`` processes run them, each with the default queue at
``--concurrency`` slots; the harness restarts every worker every ``--restart-every`` seconds,
kills one every ``--kill-every`` seconds on average and restarts the database once, half-way (see
``harness.py``). Then producers stop, the queue drains, and the report says what was lost, run
twice, burned, and how long takeovers and starts took. It exits 1 when the day fails.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .harness import ROOT, Day, resilient, say
from .report import print_report, read_acked, verdict
from .servers import make_server


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.day", description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "mysql"], default="postgres")
    parser.add_argument("--minutes", type=float, default=30.0, help="how long producers run (default 30)")
    parser.add_argument("--rate", type=float, default=1000.0, help="jobs per second, all producers together (default 1000)")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=12, help="slots of each worker's default queue (default 12)")
    parser.add_argument("--restart-every", type=float, default=300.0, help="seconds between rolling restarts (default 300)")
    parser.add_argument(
        "--kill-every", type=float, default=60.0, help="mean seconds between SIGKILLs, each gap 0.5 to 1.5 times it (default 60)"
    )
    parser.add_argument("--keep-finished", type=float, default=120.0, help="KEEP_FINISHED in seconds (default 120)")
    parser.add_argument(
        "--direct-listen",
        action="store_true",
        help="PostgreSQL: give the workers a direct connection for LISTEN and presence (LISTEN_DATABASE), as "
        "docs/postgresql.md describes; by default nothing says the database goes through PgBouncer",
    )
    parser.add_argument("--drain-limit", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--keep", action="store_true", help="keep the logs and ledger even when the day passes")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    workdir = Path(tempfile.mkdtemp(prefix="durq-day-"))
    workdir.chmod(0o755)
    (workdir / "ledger").mkdir()
    (workdir / "ledger").chmod(0o777)
    server = make_server(args.db, workdir, args.direct_listen)
    ok = False
    try:
        server.start()
        env = {
            **os.environ,
            **server.env,
            "DJANGO_SETTINGS_MODULE": "benchmarks.day.settings",
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "DURQ_DAY_LEDGER": str(workdir / "ledger"),
            "DURQ_DAY_CONCURRENCY": str(args.concurrency),
            "DURQ_DAY_KEEP_FINISHED": str(args.keep_finished),
        }
        os.environ.update(env)
        subprocess.run([sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
        import django

        django.setup()
        day = Day(args, workdir, env, server, random.Random(args.seed), workdir / "release.txt")
        day.release_file.write_text("0")
        ok = drive(day)
    finally:
        server.stop()
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"logs, ledger and data kept in {workdir}")
    return 0 if ok else 1


def drive(day: Day) -> bool:
    args = day.args
    seconds = args.minutes * 60
    say(
        f"compressed day on {args.db} for {args.minutes:g} min: {args.producers} producers at {args.rate:g} jobs/s, "
        f"{args.workers} workers x {args.concurrency} slots, a rolling restart every {args.restart_every:g} s, "
        f"a SIGKILL every {args.kill_every:g} s, one database restart half-way; seed {args.seed}"
    )
    for slot in range(args.workers):
        day.start_worker(slot, 0)
    acked_files = [day.workdir / f"acked-{i}.txt" for i in range(args.producers)]
    producers = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "benchmarks.day.producer", str(path), str(day.release_file), str(seconds)),
                *(str(args.rate / args.producers), str(args.seed * 100 + i)),
            ],
            cwd=ROOT,
            # The web servers run every release's code; the release file says which jobs they queue.
            env={**day.env, "DURQ_DAY_RELEASE": str(int(seconds // args.restart_every) + 1)},
        )
        for i, path in enumerate(acked_files)
    ]
    try:
        run_phases(day, seconds)
        problem = day.server.problem()
        if problem is not None:
            say(f"DAY FAIL: {problem}")
            return False
        say("producers finish; draining")
        exits = [popen.wait(timeout=300) for popen in producers]
        if any(exits):
            say(f"a producer failed (exit statuses {exits}): the day is not valid")
            return False
        acked, failed_calls, failed_jobs = read_acked(acked_files)
        drained = drain(day, acked, args.drain_limit)
        for worker in day.workers.values():
            worker.popen.send_signal(signal.SIGTERM)
        for worker in day.workers.values():
            worker.popen.wait(timeout=120)
        result = verdict(day, acked, (failed_calls, failed_jobs), drained)
        return print_report(day, result, " ".join(["python -m benchmarks.day", *sys.argv[1:]]))
    finally:
        for popen in producers:
            if popen.poll() is None:
                popen.kill()
                popen.wait()
        for worker in day.workers.values():
            if worker.popen.poll() is None:
                os.killpg(worker.popen.pid, signal.SIGKILL)
                worker.popen.wait()


def run_phases(day: Day, seconds: float) -> None:
    args = day.args
    start = time.monotonic()
    deadline = start + seconds
    next_kill = start + args.kill_every
    next_rolling = start + args.restart_every
    restart_at = start + seconds / 2
    next_memory, next_size, next_report = start, start, start + 60
    while time.monotonic() < deadline and day.server.problem() is None:
        now = time.monotonic()
        day.manage()
        day.step_rolling()
        day.watch_kills()
        if now >= next_kill:
            day.kill_one()
            # On average every --kill-every seconds, never in step with the lease: with a fixed minute
            # and a minute's lease, jobs taken over when their lease ran out are claimed again just
            # as the next kill strikes, and the same jobs lose an attempt at each kill.
            next_kill = now + args.kill_every * day.rng.uniform(0.5, 1.5)
        if now >= next_rolling and day.rolling is None:
            day.begin_rolling()
            next_rolling = now + args.restart_every
        if restart_at and now >= restart_at:
            day.restart_database()
            restart_at = 0
        if now >= next_memory:
            day.sample_memory()
            next_memory = now + 10
        if now >= next_size:
            day.sample_sizes()
            next_size = now + 30
        if now >= next_report:
            taken = ", ".join(f"{kill.taken_s:.2f}" for kill in day.kills[-5:] if kill.taken_s is not None)
            say(f"kills {len(day.kills)} (last takeovers in s: {taken}); release {day.worker_release}")
            next_report = now + 60
        time.sleep(0.05)
    day.sample_sizes()


def drain(day: Day, acked: set[int], limit_s: float) -> bool:
    from django_durq.models import Job

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        day.manage()
        day.step_rolling()
        day.watch_kills()
        if not resilient(lambda: Job.objects.active().exists()):
            return True
        time.sleep(0.5)
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
