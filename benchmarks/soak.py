"""Soak: real workers, enqueuers and faults for a while, then drain and give the ledger verdict.

    python benchmarks/soak.py                       # 10 minutes on SQLite
    python benchmarks/soak.py --minutes 60 --db postgres
    python benchmarks/soak.py --db postgres --pg-restart   # a throwaway cluster, restarted every minute
    python benchmarks/soak.py --db sqlite --tests   # the fault suite at full size (DURQ_TEST_HEAVY=1)
    python benchmarks/soak.py --db mysql --model --model-seeds 40   # model-based chaos, long scenarios

For ``--minutes``, several ``durq_worker`` processes work a scratch database while enqueuer
processes add jobs (some with dedupe keys, some delayed), the web app writes to the same SQLite
file, and a chaos loop kills workers with SIGKILL, pauses them past their lease with
SIGSTOP/SIGCONT, restarts them with SIGTERM, and drops their connections (PostgreSQL
``pg_terminate_backend``, MariaDB ``KILL``, on SQLite an outside process holding the write lock).
A process-manager loop restarts every worker that exits. At the end the faults stop, the queue
drains, and the script prints the ledger verdict (lost, duplicated, unexpected, unexplained)
and the workers' memory over time. It exits 1 when the verdict fails.

``--pg-restart`` runs PostgreSQL itself: ``initdb`` and ``pg_ctl`` from
/usr/lib/postgresql/<version>/bin on a temporary directory and port (as the ``postgres`` user
when run as root), restarted with ``pg_ctl restart -m fast`` every ``--restart-every`` seconds.
The shared server is never restarted.

``--model`` runs the model-based chaos test (``tests/faults/test_model_chaos.py``) at its long
size: ``--model-seeds`` scenarios from the seed ``--seed``, each judged on its own, with every
scenario's ledger, actions and worker logs kept in a folder it names. ``--tests`` runs it too,
with fewer seeds, among the rest of the fault suite.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
PG_BIN = Path(os.environ.get("DURQ_PG_BIN", "/usr/lib/postgresql/15/bin"))
LEASE_S, HEARTBEAT_S, POLL_S = 2.0, 0.5, 0.25
# Lines a worker may log at ERROR during a soak: dead letters are an outcome, not a fault.
EXPECTED_ERRORS = ("-> dead letter",)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# --- databases ------------------------------------------------------------------------------------


class Database:
    """A scratch database for the soak: created, migrated, dropped at the end."""

    def __init__(self, vendor: str, workdir: Path, pg_restart: bool) -> None:
        self.vendor = vendor
        self.workdir = workdir
        self.name = f"durq_soak_{os.getpid()}"
        self.env: dict[str, str] = {"DURQ_TEST_DB": vendor}
        self.cluster: Path | None = None
        self.port = 0
        if vendor == "sqlite":
            self.env["DURQ_TEST_DB_IN_USE"] = str(workdir / "soak.sqlite3")
        else:
            self.env["DURQ_TEST_DB_IN_USE"] = self.name
        if pg_restart:
            self._start_cluster()

    # A throwaway PostgreSQL cluster ------------------------------------------------------------

    def _as_postgres(self, *command: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)

    def _start_cluster(self) -> None:
        self.cluster = self.workdir / "pgdata"
        self.cluster.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.workdir, "postgres")
            shutil.chown(self.cluster, "postgres")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        subprocess.run(
            self._as_postgres(str(PG_BIN / "initdb"), "-D", str(self.cluster), "-U", "postgres", "--auth=trust", "-E", "UTF8"),
            check=True,
            capture_output=True,
        )
        self._pg_ctl("start")
        self.env.update(DURQ_PG_HOST="127.0.0.1", DURQ_PG_PORT=str(self.port))
        say(f"throwaway PostgreSQL cluster on port {self.port} ({self.cluster})")

    def _pg_ctl(self, action: str, *extra: str) -> float:
        assert self.cluster is not None
        options = f"-p {self.port} -k {self.cluster} -c listen_addresses=127.0.0.1 -c max_connections=200"
        started = time.monotonic()
        command = [str(PG_BIN / "pg_ctl"), action, "-D", str(self.cluster), "-w", "-o", options]
        command += ["-l", str(self.cluster / "log"), *extra]
        subprocess.run(self._as_postgres(*command), check=True, capture_output=True)
        return time.monotonic() - started

    def restart(self) -> float:
        """``pg_ctl restart -m fast``: every connection is cut; returns how long it took."""
        return self._pg_ctl("restart", "-m", "fast")

    # Create, migrate, drop -----------------------------------------------------------------------

    def _server(self, statement: str) -> None:
        if self.vendor == "postgres":
            import psycopg

            with psycopg.connect(
                host=self.env.get("DURQ_PG_HOST", os.environ.get("DURQ_PG_HOST", "127.0.0.1")),
                port=self.env.get("DURQ_PG_PORT", os.environ.get("DURQ_PG_PORT", "5432")),
                user=os.environ.get("DURQ_PG_USER", "postgres"),
                dbname="postgres",
                autocommit=True,
            ) as server:
                server.execute(statement)
        elif self.vendor == "mysql":
            import MySQLdb

            server = MySQLdb.connect(
                host=os.environ.get("DURQ_MYSQL_HOST", "127.0.0.1"),
                port=int(os.environ.get("DURQ_MYSQL_PORT", "3306")),
                user=os.environ.get("DURQ_MYSQL_USER", "root"),
                password=os.environ.get("DURQ_MYSQL_PASSWORD", ""),
            )
            try:
                server.cursor().execute(statement)
            finally:
                server.close()

    def create(self, environ: dict[str, str]) -> None:
        if self.vendor == "postgres":
            self._server(f"CREATE DATABASE {self.name}")
        elif self.vendor == "mysql":
            self._server(f"CREATE DATABASE {self.name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0", "--skip-checks"],
            cwd=ROOT,
            env=environ,
            check=True,
        )

    def destroy(self) -> None:
        try:
            if self.cluster is not None:
                self._pg_ctl("stop", "-m", "immediate")
            elif self.vendor == "postgres":
                self._server(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
            elif self.vendor == "mysql":
                self._server(f"DROP DATABASE IF EXISTS {self.name}")
        except Exception as error:  # noqa: BLE001 - cleanup is best effort
            say(f"could not drop the scratch database: {error}")


# --- processes --------------------------------------------------------------------------------------


@dataclass
class Worker:
    slot: int
    popen: subprocess.Popen[bytes]
    log: Path
    paused_until: float = 0.0
    terminating: bool = False


@dataclass
class Soak:
    args: argparse.Namespace
    workdir: Path
    env: dict[str, str]
    rng: random.Random
    workers: dict[int, Worker] = field(default_factory=dict)
    logs: list[Path] = field(default_factory=list)
    exits: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    rss: list[tuple[float, int, float]] = field(default_factory=list)  # (minute, pid, MB)
    restarts: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    # Workers, restarted by a process-manager loop ----------------------------------------------------

    def start_worker(self, slot: int) -> None:
        log = self.workdir / f"worker-{slot}-{len(self.logs)}.log"
        self.logs.append(log)
        args = ["--queue", "default:3", "--queue", "fast:1"]
        if slot == 0:
            args += ["--max-jobs", "2000"]  # one worker recycles itself now and then
        with log.open("wb") as sink:
            popen = subprocess.Popen(
                [sys.executable, "-m", "django", "durq_worker", *args],
                cwd=ROOT,
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.workers[slot] = Worker(slot, popen, log)

    def manage(self) -> None:
        """Restart every worker that has exited; resume the ones whose pause is over."""
        now = time.monotonic()
        for slot, worker in list(self.workers.items()):
            if worker.paused_until and now >= worker.paused_until:
                worker.popen.send_signal(signal.SIGCONT)
                worker.paused_until = 0.0
            code = worker.popen.poll()
            if code is not None:
                self.exits[_exit_name(code)] += 1
                self.start_worker(slot)

    def sample_memory(self) -> None:
        minute = (time.monotonic() - self.started) / 60
        for worker in self.workers.values():
            mb = _rss_mb(worker.popen.pid)
            if mb is not None:
                self.rss.append((minute, worker.popen.pid, mb))

    # Faults ----------------------------------------------------------------------------------------

    def chaos(self, vendor: str, database: Database) -> None:
        live = [w for w in self.workers.values() if w.popen.poll() is None and not w.paused_until]
        choices = ["kill", "pause", "term", "cut"]
        fault = self.rng.choice(choices)
        if fault in ("kill", "pause", "term") and not live:
            return
        victim = self.rng.choice(live) if live else None
        if fault == "kill" and victim is not None:
            os.killpg(victim.popen.pid, signal.SIGKILL)
        elif fault == "pause" and victim is not None:
            seconds = self.rng.uniform(LEASE_S, 3 * LEASE_S)
            os.killpg(victim.popen.pid, signal.SIGSTOP)
            victim.paused_until = time.monotonic() + seconds
        elif fault == "term" and victim is not None:
            victim.popen.send_signal(signal.SIGTERM)
        elif fault == "cut":
            resilient(lambda: cut_connections(vendor, self.env, self.rng, self.workdir))
        self.faults[fault] += 1

    def restart_server(self, database: Database) -> None:
        took = database.restart()
        self.restarts.append(took)
        self.faults["pg_restart"] += 1
        say(f"pg_ctl restart -m fast took {took:.1f} s")


def cut_connections(vendor: str, env: dict[str, str], rng: random.Random, workdir: Path) -> None:
    """Drop the workers' connections, or on SQLite hold the write lock from outside for a while."""
    if vendor == "sqlite":
        hold = rng.uniform(1, 4)
        code = (
            "import sqlite3, sys, time\n"
            "db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
            "db.execute('BEGIN EXCLUSIVE'); time.sleep(float(sys.argv[2])); db.execute('ROLLBACK')\n"
        )
        subprocess.Popen([sys.executable, "-c", code, env["DURQ_TEST_DB_IN_USE"], f"{hold:.2f}"])
        return
    from django.db import connection

    with connection.cursor() as cursor:
        if vendor == "postgres":
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
        else:
            cursor.execute("SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()")
            for (backend,) in cursor.fetchall():
                try:
                    cursor.execute(f"KILL {int(backend)}")
                except Exception:  # noqa: BLE001 - it went away by itself
                    pass


def resilient(operation: Callable[[], T], limit_s: float = 120.0) -> T:
    """Run a query of this script's own through restarts and cut connections: reconnect and retry."""
    from django.db import InterfaceError, OperationalError, connections

    deadline = time.monotonic() + limit_s
    while True:
        try:
            return operation()
        except (OperationalError, InterfaceError):
            connections.close_all()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _exit_name(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


# --- enqueuers (run as child processes of this script) -----------------------------------------------


def enqueuer(out: Path, seconds: float, rate: float, seed: int) -> int:
    """Add jobs at ``rate`` per second for ``seconds``; append every acknowledged id to ``out``.

    Every call tags its jobs with its own sequence number. A call that fails may still have
    committed (the connection dropped after the commit): its tag is written as ``?tag``, and the
    verdict counts an effect carrying it as an indeterminate enqueue, not as an unexpected job.
    """
    import django

    django.setup()
    from datetime import timedelta

    from django.db import DatabaseError, connections

    from tests.ledger import jobs

    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    sequence = 0
    with out.open("a") as acked:
        while time.monotonic() < deadline:
            batch = rng.randint(1, 10)
            sequence += 1
            tag = f"soak:{seed}:{sequence}"
            try:
                kind = rng.random()
                if kind < 0.15:
                    # A dedupe key from a small space: often still active, so the existing job comes back.
                    created = [jobs.effect.using(unique=f"key-{rng.randint(0, 300)}").enqueue(tag=tag)]
                elif kind < 0.30:
                    delay = timedelta(seconds=rng.uniform(0, 20))
                    created = jobs.effect.using(run_in=delay).enqueue_many([{"tag": tag}] * batch)
                elif kind < 0.35:
                    created = [jobs.effect.enqueue(tag=tag, sleep=rng.uniform(2, 5))]  # outlives the lease
                elif kind < 0.55:
                    created = jobs.effect_fast.enqueue_many([{"tag": tag}] * batch)
                else:
                    created = jobs.effect.enqueue_many([{"tag": tag, "sleep": rng.uniform(0, 0.2)} for _ in range(batch)])
            except DatabaseError as error:
                # Not acknowledged; it may or may not have committed.
                acked.write(f"?{tag}\n")
                acked.flush()
                print(f"enqueue failed: {type(error).__name__}: {str(error).strip()[:120]}", file=sys.stderr, flush=True)
                connections.close_all()  # as a web request ends: the next call reconnects
                time.sleep(0.5)
                continue
            acked.write("".join(f"{job.pk}\n" for job in created))
            acked.flush()
            time.sleep(rng.expovariate(rate / batch) if rate > 0 else 1)
    return 0


# --- the run ------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="durq-soak-"))
    os.chmod(workdir, 0o755)
    database = Database(args.db, workdir, args.pg_restart)
    env = {
        **os.environ,
        **database.env,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "DURQ_TEST_LEASE": str(LEASE_S),
        "DURQ_TEST_HEARTBEAT": str(HEARTBEAT_S),
        "DURQ_TEST_POLL": str(POLL_S),
        # Kept rows keep their error history, which explains each duplicate; --delete-finished runs
        # the default instead (finished jobs deleted in batches) and checks claim tokens only.
        "DURQ_TEST_KEEP_FINISHED": "" if args.delete_finished else "86400",
    }
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    ok = False
    try:
        database.create(env)
        import django

        django.setup()
        soak = Soak(args, workdir, env, random.Random(args.seed))
        ok = drive(soak, database)
    finally:
        database.destroy()
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"logs and data kept in {workdir}")
    return 0 if ok else 1


def drive(soak: Soak, database: Database) -> bool:
    args = soak.args
    seconds = args.minutes * 60
    say(
        f"soak on {args.db} for {args.minutes:g} min: {args.workers} workers, {args.enqueuers} enqueuers "
        f"at {args.rate:g} jobs/s, a fault every ~{args.chaos_every:g} s"
        + (f", pg_ctl restart every {args.restart_every:g} s" if args.pg_restart else "")
        + f"; lease {LEASE_S:g} s, heartbeat {HEARTBEAT_S:g} s, poll {POLL_S:g} s; seed {args.seed}"
    )
    for slot in range(args.workers):
        soak.start_worker(slot)
    acked_files = [soak.workdir / f"acked-{i}.txt" for i in range(args.enqueuers)]
    enqueuers = [
        subprocess.Popen(
            [
                *(sys.executable, __file__, "--role", "enqueuer", "--out", str(path), "--seconds", str(seconds)),
                *("--rate", str(args.rate / args.enqueuers), "--seed", str(args.seed * 100 + i)),
            ],
            cwd=ROOT,
            env=soak.env,
        )
        for i, path in enumerate(acked_files)
    ]
    web = None
    if args.db == "sqlite":
        web = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.webapp", "--seconds", str(seconds), "--rate", "50"],
            cwd=ROOT,
            env=soak.env,
            stdout=subprocess.PIPE,
        )

    try:
        return _run_phases(soak, database, enqueuers, acked_files, web, seconds)
    finally:
        for popen in [*enqueuers, *([web] if web is not None else [])]:
            if popen.poll() is None:
                popen.kill()
                popen.wait()
        for worker in soak.workers.values():
            if worker.popen.poll() is None:
                os.killpg(worker.popen.pid, signal.SIGKILL)
                worker.popen.wait()


def _run_phases(
    soak: Soak,
    database: Database,
    enqueuers: list[subprocess.Popen[bytes]],
    acked_files: list[Path],
    web: subprocess.Popen[bytes] | None,
    seconds: float,
) -> bool:
    args = soak.args
    deadline = time.monotonic() + seconds
    next_fault = time.monotonic() + soak.rng.expovariate(1 / args.chaos_every)
    next_restart = time.monotonic() + args.restart_every
    next_sample = time.monotonic()
    next_report = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = time.monotonic()
        soak.manage()
        if now >= next_fault:
            soak.chaos(args.db, database)
            next_fault = now + soak.rng.expovariate(1 / args.chaos_every)
        if args.pg_restart and now >= next_restart:
            soak.restart_server(database)
            next_restart = time.monotonic() + args.restart_every
        if now >= next_sample:
            soak.sample_memory()
            next_sample = now + 10
        if now >= next_report:
            say(f"faults so far: {dict(soak.faults)}; worker exits: {dict(soak.exits)}; {_progress()}")
            next_report = now + 60
        time.sleep(0.1)

    say("faults stop; enqueuers finish; draining")
    for popen in enqueuers:
        popen.wait(timeout=120)
    web_report = None
    if web is not None:
        out, _ = web.communicate(timeout=60)
        web_report = json.loads(out.decode().strip().splitlines()[-1])
    for worker in soak.workers.values():
        if worker.paused_until:
            worker.popen.send_signal(signal.SIGCONT)
            worker.paused_until = 0.0
    lines = [line for path in acked_files if path.exists() for line in path.read_text().split()]
    acked = {int(line) for line in lines if not line.startswith("?")}
    unknown = {line[1:] for line in lines if line.startswith("?")}
    drained = _drain(soak, acked, limit_s=args.drain_limit)
    for worker in soak.workers.values():
        worker.popen.send_signal(signal.SIGTERM)
    final_exits = Counter(_exit_name(worker.popen.wait(timeout=60)) for worker in soak.workers.values())
    return report(soak, acked, unknown, drained, final_exits, web_report)


def _progress() -> str:
    from django_durq.models import Job

    counts = resilient(lambda: Counter(Job.objects.values_list("status", flat=True)))
    return "jobs " + ", ".join(f"{status} {count}" for status, count in sorted(counts.items()))


def _drain(soak: Soak, acked: set[int], limit_s: float) -> bool:
    from django_durq.models import Job

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        soak.manage()
        if not resilient(lambda: Job.objects.active().filter(pk__in=acked).exists()):
            return True
        time.sleep(0.5)
    return False


def report(
    soak: Soak, acked: set[int], unknown: set[str], drained: bool, final_exits: Counter[str], web: dict[str, Any] | None
) -> bool:
    from django_durq.models import Job
    from tests.ledger import checker
    from tests.ledger.models import Effect

    args = soak.args
    maybe = set(Effect.objects.filter(tag__in=unknown).values_list("job_id", flat=True)) if unknown else set()
    verdict = resilient(lambda: checker.check(acked, indeterminate=maybe, history_deleted=args.delete_finished))
    problems: Counter[str] = Counter()
    for log in soak.logs:
        for line in log.read_text(errors="replace").splitlines():
            if (" ERROR " in line or " CRITICAL " in line) and not any(e in line for e in EXPECTED_ERRORS):
                problems[line.split(" ERROR ", 1)[-1][:100]] += 1
            elif line.startswith("Traceback"):
                problems["Traceback"] += 1
    attempts = Counter(Job.objects.filter(pk__in=acked).values_list("attempts", flat=True))
    print()
    variant = (" with pg_ctl restarts" if args.pg_restart else "") + (", finished jobs deleted" if args.delete_finished else "")
    print(f"=== durq soak: {args.db}{variant}, {args.minutes:g} min ===")
    print(f"command                {' '.join(['python', 'benchmarks/soak.py', *sys.argv[1:]])}")
    print(f"faults                 {dict(sorted(soak.faults.items()))}")
    print(f"worker exits (mid-run) {dict(sorted(soak.exits.items()))}; incarnations {len(soak.logs)}")
    print(f"worker exits at end    {dict(final_exits)} (SIGTERM after the drain)")
    if soak.restarts:
        print(f"pg_ctl restarts        {len(soak.restarts)}, {min(soak.restarts):.1f}-{max(soak.restarts):.1f} s each")
    print(f"drained                {'yes' if drained else f'NO: still active after {args.drain_limit:g} s'}")
    kept = " (rows left: dead letters)" if args.delete_finished else ""
    print(f"attempts per job       {dict(sorted(attempts.items()))}{kept}")
    runs = Counter(Counter(Effect.objects.filter(job_id__in=acked).values_list("job_id", flat=True)).values())
    print(f"runs per job           {dict(sorted(runs.items()))}")
    print(f"failed enqueue calls   {len(unknown)} (of which ran anyway, committed before the drop: {len(maybe)} jobs)")
    for line in verdict.lines():
        if args.delete_finished and line.startswith("lease expiries"):
            line = "lease expiries         not recorded (finished rows are deleted)"
        print(line)
    print(f"ERROR lines / tracebacks in worker logs (dead letters excepted): {sum(problems.values())}")
    for text, count in problems.most_common(5):
        print(f"    {count} x {text}")
    if web is not None:
        print(f"web app (50 inserts/s, timeout 5 s): {web}")
    print("worker RSS (MB) by minute: live workers, median, max")
    by_minute: dict[int, list[float]] = {}
    for minute, _, mb in soak.rss:
        by_minute.setdefault(int(minute), []).append(mb)
    for minute in sorted(by_minute):
        values = by_minute[minute]
        print(f"    min {minute:>3}  {len(values) / 6:5.1f}  {statistics.median(values):7.1f}  {max(values):7.1f}")
    ok = verdict.ok and drained and not problems
    print(f"SOAK {'PASS' if ok else 'FAIL'}")
    return ok


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long faults run (default 10; an hour: 60)")
    parser.add_argument("--db", choices=["sqlite", "postgres", "mysql"], default="sqlite")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--enqueuers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=30.0, help="jobs per second, all enqueuers together")
    parser.add_argument("--chaos-every", type=float, default=5.0, help="mean seconds between faults")
    parser.add_argument("--pg-restart", action="store_true", help="run a throwaway PostgreSQL cluster and restart it")
    parser.add_argument("--restart-every", type=float, default=60.0)
    parser.add_argument(
        "--delete-finished",
        action="store_true",
        help="delete finished jobs (the default outside tests); duplicates are then judged by claim tokens only",
    )
    parser.add_argument("--drain-limit", type=float, default=300.0, help="seconds the final drain may take")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--keep", action="store_true", help="keep logs and the SQLite file even when it passes")
    parser.add_argument("--tests", action="store_true", help="run the fault suite at full size instead (DURQ_TEST_HEAVY=1)")
    parser.add_argument("--model", action="store_true", help="run the model-based chaos test's long scenarios instead")
    parser.add_argument("--model-seeds", type=int, default=20, help="how many scenarios --model runs (default 20)")
    parser.add_argument("--role", choices=["enqueuer"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pg_restart and args.db != "postgres":
        parser.error("--pg-restart needs --db postgres")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.role == "enqueuer":
        sys.path.insert(0, str(ROOT))
        return enqueuer(args.out, args.seconds, args.rate, args.seed)
    if args.model:
        return run_model(args)
    if args.tests:
        env = {**os.environ, "DURQ_TEST_DB": args.db, "DURQ_TEST_HEAVY": "1", "DURQ_MODEL_FIRST_SEED": str(args.seed)}
        return subprocess.run([sys.executable, "-m", "pytest", "tests/faults", "-q"], cwd=ROOT, env=env).returncode
    return run(args)


def run_model(args: argparse.Namespace) -> int:
    """The model-based chaos test's long scenarios, seeds ``--seed`` onwards; a failure names its seed and files."""
    folder = Path(tempfile.mkdtemp(prefix="durq-model-"))
    env = {
        **os.environ,
        "DURQ_TEST_DB": args.db,
        "DURQ_TEST_HEAVY": "1",
        "DURQ_MODEL_FIRST_SEED": str(args.seed),
        "DURQ_MODEL_SEEDS": str(args.model_seeds),
        "DURQ_MODEL_ARTIFACTS": str(folder),
    }
    say(f"model-based chaos on {args.db}: {args.model_seeds} long scenarios from seed {args.seed}; files in {folder}")
    command = [sys.executable, "-m", "pytest", "tests/faults/test_model_chaos.py", "-k", "heavy", "-q", "-rfE"]
    return subprocess.run(command, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
