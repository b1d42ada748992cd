"""The compressed day's process manager and fault loop: workers, rolling restarts, kills, one database restart.

Every ``--restart-every`` seconds a rolling restart stops each worker in turn with SIGTERM (a
graceful stop: its running jobs finish or are handed back) and starts its replacement before
the next one stops; every other one deploys a new release, the web servers first. Every
``--kill-every`` seconds one worker that is not being restarted is killed with SIGKILL (frozen
with SIGSTOP for 50 ms before, while the harness reads which jobs it holds) and started again a
second later, as a process manager would. Half-way through, the database is
restarted once (``servers.py``). Meanwhile the harness samples the workers' memory and the
table's size, and times each takeover: from the kill until no job of the killed worker is left
``running`` under its id.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .servers import Server

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent.parent
RESTART_DELAY_S = 1.0  # a process manager's RestartSec


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def resilient(operation: Callable[[], T], limit_s: float = 180.0) -> T:
    """A query of the harness's own, through the database's restart: reconnect and retry."""
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


@dataclass
class Worker:
    slot: int
    release: int
    popen: subprocess.Popen[bytes]
    log: Path
    worker_id: str = ""


@dataclass
class Kill:
    at: float  # monotonic
    worker_id: str
    running: set[int]  # its jobs left running at the kill: in flight
    taken_s: float | None = None


@dataclass
class Rolling:
    release: int
    slots: list[int]
    began_ms: int
    stopping: Worker | None = None


@dataclass
class Day:
    args: Any
    workdir: Path
    env: dict[str, str]
    server: Server
    rng: random.Random
    release_file: Path
    workers: dict[int, Worker] = field(default_factory=dict)
    logs: list[Path] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    in_flight: set[int] = field(default_factory=set)  # jobs running at a kill or at the database's restart
    releases: list[tuple[float, int]] = field(default_factory=list)
    db_restart: str = ""
    rss: list[tuple[float, float]] = field(default_factory=list)  # (minute, MB)
    sizes: list[tuple[float, int, int]] = field(default_factory=list)  # (minute, table bytes, claim index bytes)
    rolling: Rolling | None = None
    # Wall-clock spans (epoch ms) of each rolling restart and of the database's restart, for the
    # latency of jobs queued outside them.
    windows: list[tuple[int, int]] = field(default_factory=list)
    pending_starts: dict[int, tuple[float, int]] = field(default_factory=dict)  # slot -> (when, release)
    started: float = field(default_factory=time.monotonic)
    release: int = 0
    worker_release: int = 0

    # --- workers ----------------------------------------------------------------------------------

    def start_worker(self, slot: int, release: int) -> Worker:
        log = self.workdir / f"worker-{slot}-{len(self.logs)}.log"
        self.logs.append(log)
        env = {**self.env, "DURQ_DAY_RELEASE": str(release)}
        with log.open("wb") as sink:
            popen = subprocess.Popen(
                [sys.executable, "-m", "django", "durq_worker"],
                cwd=ROOT,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Worker(slot, release, popen, log)
        self.workers[slot] = worker
        return worker

    def worker_id(self, worker: Worker) -> str:
        if not worker.worker_id:
            from django_durq.models import WorkerProcess

            found = resilient(
                lambda: WorkerProcess.objects.filter(pid=worker.popen.pid).values_list("worker_id", flat=True).first()
            )
            worker.worker_id = found or ""
        return worker.worker_id

    def manage(self) -> None:
        """Start the workers whose restart is due; restart any that exited by itself."""
        now = time.monotonic()
        for slot, (when, release) in list(self.pending_starts.items()):
            if now >= when:
                del self.pending_starts[slot]
                self.start_worker(slot, release)
        rolling_slot = self.rolling.stopping.slot if self.rolling and self.rolling.stopping else None
        for slot, worker in list(self.workers.items()):
            if slot in self.pending_starts or slot == rolling_slot:
                continue
            if worker.popen.poll() is not None:
                say(f"worker {slot} exited by itself ({worker.popen.returncode}); restarting it")
                self.start_worker(slot, worker.release)

    # --- faults -----------------------------------------------------------------------------------

    def kill_one(self) -> None:
        from django_durq.models import Job

        rolling_slot = self.rolling.stopping.slot if self.rolling and self.rolling.stopping else None
        live = [w for w in self.workers.values() if w.popen.poll() is None and w.slot != rolling_slot]
        live = [w for w in live if w.slot not in self.pending_starts and self.worker_id(w)]
        if not live:
            return
        victim = self.rng.choice(live)
        # Frozen first, so that what it holds can be read before it dies: a claim it sent just
        # before commits within the pause, and a frozen process claims nothing more. Its lock,
        # and with it the takeover, goes only with the SIGKILL.
        os.killpg(victim.popen.pid, signal.SIGSTOP)
        time.sleep(0.05)
        running = set(
            resilient(
                lambda: list(Job.objects.filter(claimed_by=victim.worker_id, status="running").values_list("id", flat=True))
            )
        )
        os.killpg(victim.popen.pid, signal.SIGKILL)
        at = time.monotonic()
        victim.popen.wait()
        self.kills.append(Kill(at, victim.worker_id, running))
        self.in_flight |= running
        self.pending_starts[victim.slot] = (at + RESTART_DELAY_S, victim.release)

    def watch_kills(self) -> None:
        from django_durq.models import Job

        for kill in self.kills:
            if kill.taken_s is not None or not kill.running:
                continue
            left = resilient(
                lambda kill=kill: Job.objects.filter(pk__in=kill.running, claimed_by=kill.worker_id, status="running").exists()
            )
            if not left:
                kill.taken_s = time.monotonic() - kill.at

    def restart_database(self) -> None:
        from django_durq.models import Job

        def running() -> set[int]:
            return set(resilient(lambda: list(Job.objects.filter(status="running").values_list("id", flat=True))))

        began = time.time_ns() // 1_000_000
        self.in_flight |= running()
        self.db_restart = self.server.restart()
        self.in_flight |= running()  # claims whose answer the restart cut off
        self.windows.append((began, time.time_ns() // 1_000_000))
        say(self.db_restart)

    # --- rolling restarts -------------------------------------------------------------------------

    def begin_rolling(self) -> None:
        new = self.worker_release + 1 if len(self.releases) % 2 == 0 else self.worker_release
        if new != self.worker_release:
            self.release_file.write_text(str(new))  # the web servers first
        self.releases.append((time.monotonic(), new))
        self.rolling = Rolling(new, sorted(self.workers), began_ms=time.time_ns() // 1_000_000)
        say(f"rolling restart of {len(self.workers)} workers, release {new}")

    def step_rolling(self) -> None:
        rolling = self.rolling
        if rolling is None:
            return
        if rolling.stopping is not None:
            if rolling.stopping.popen.poll() is None:
                return
            self.start_worker(rolling.stopping.slot, rolling.release)
            rolling.stopping = None
            return
        if not rolling.slots:
            self.worker_release = rolling.release
            self.windows.append((rolling.began_ms, time.time_ns() // 1_000_000))
            self.rolling = None
            return
        slot = rolling.slots[0]
        worker = self.workers.get(slot)
        if worker is None or slot in self.pending_starts or not self.worker_id(worker):
            return  # being restarted after a kill, or not registered yet: wait
        rolling.slots.pop(0)
        worker.popen.send_signal(signal.SIGTERM)
        rolling.stopping = worker

    # --- samples ----------------------------------------------------------------------------------

    def sample_memory(self) -> None:
        minute = (time.monotonic() - self.started) / 60
        for worker in self.workers.values():
            try:
                status = Path(f"/proc/{worker.popen.pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    self.rss.append((minute, int(line.split()[1]) / 1024))

    def sample_sizes(self) -> None:
        minute = (time.monotonic() - self.started) / 60
        self.sizes.append((minute, *resilient(table_sizes)))


def table_sizes() -> tuple[int, int]:
    """Bytes of ``durq_job`` (with its indexes) and of its claim index, as the database reports them."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_total_relation_size('durq_job'), pg_relation_size('durq_job_claim')")
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT (SELECT data_length + index_length FROM information_schema.tables WHERE table_schema = DATABASE()"
                " AND table_name = 'durq_job'), (SELECT stat_value * @@innodb_page_size FROM mysql.innodb_index_stats"
                " WHERE database_name = DATABASE() AND table_name = 'durq_job' AND index_name = 'durq_job_claim'"
                " AND stat_name = 'size')"
            )
        else:
            cursor.execute(
                "SELECT (SELECT SUM(pgsize) FROM dbstat WHERE name LIKE 'durq_job%'),"
                " (SELECT SUM(pgsize) FROM dbstat WHERE name = 'durq_job_claim')"
            )
        table, claim = cursor.fetchone()
    return int(table or 0), int(claim or 0)
