"""One worker process: a pool per named queue, signals, graceful shutdown.

Signal handlers only record, taking no lock the main thread may hold; the signal's arrival wakes
the main loop (``main_bell.py``), which then decides. The first SIGTERM or SIGINT stops
claiming and makes ``ctx.should_stop()`` true; running jobs get the grace period, then the
leases of jobs still running are released so another worker takes them at once. Repeated
SIGTERMs change nothing (process managers resend them); a second SIGINT (Ctrl-C twice) or a
SIGQUIT exits at once, leaving those leases to expire.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType

from django.db import connections

from ..clock import Clock, ServerClock, get_clock
from ..conf import DurqSettings
from ..db import dialect_for, pooler, presence
from ..execution.outcomes import RELEASED, error_list, log_extra
from ..models import WorkerProcess
from . import exit_status
from .keeper import LeaseKeeper
from .main_bell import MainBell
from .maintenance import MaintenanceRunner
from .monitor import Monitor
from .pool import Pool
from .row_presence import BEAT_MS, RowBeat
from .runtime import Runtime
from .watcher import Watcher

logger = logging.getLogger("django_durq")

# The main thread sleeps until rung (a stop, a pool that finished, a signal); this only bounds a
# wake-up that went astray. A burst run's progress line is redrawn at the faster pace.
MAIN_WAIT_S = 1.0
PROGRESS_S = 0.1


class Supervisor:
    def __init__(
        self,
        queues: dict[str, int],
        settings: DurqSettings,
        *,
        clock: Clock | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        max_memory_mb: float | None = None,
        grace_ms: int | None = None,
        worker_id: str | None = None,
        on_tick: Callable[[Runtime], None] | None = None,
    ) -> None:
        self.queues = queues
        self.settings = settings
        self.runtime = Runtime(settings=settings, clock=clock or get_clock(), worker_id=worker_id, burst=burst, max_jobs=max_jobs)
        self.pools = [Pool(name, size, self.runtime) for name, size in queues.items()]
        self.keeper = LeaseKeeper(self.runtime)
        self.runtime.keeper_kick = self.keeper.kick.set
        self.monitor = Monitor(self.runtime, self.pools, max_memory_mb)
        self.watcher = Watcher(settings.database, settings.listen_database, self.runtime.worker_id)
        self.maintenance = MaintenanceRunner(self.runtime)
        self.grace_ms = settings.shutdown_grace_ms if grace_ms is None else grace_ms
        self.on_tick = on_tick
        self._signals = 0
        self._interrupts = 0
        self._started_ms = 0

    # --- signals -------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGQUIT, self._on_quit)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:
                self._on_quit(signum, frame)
        self._signals += 1
        if self._signals == 1:
            running = sum(pool.running_now() for pool in self.pools)
            again = "press Ctrl-C again" if signum == signal.SIGINT else "send SIGQUIT"
            os.write(
                2,
                f"durq: stopping: finishing {running} running job(s), up to {self.grace_ms / 1000:g} s; "
                f"{again} to stop now (their attempts will count)\n".encode(),
            )
        self.runtime.stop_on_signal(f"received {signal.Signals(signum).name}")

    def _on_quit(self, signum: int, frame: FrameType | None) -> None:
        os.write(2, b"durq: exiting now; leases of running jobs will expire\n")
        os._exit(exit_status.ABORTED)

    # --- lifecycle ---------------------------------------------------------------------------

    def run(self) -> int:
        runtime = self.runtime
        alias = self.settings.database
        dialect = dialect_for(connections[alias])
        logger.info(
            "durq: worker %s started; queues %s; database %r (%s): claims are exclusive across %s",
            runtime.worker_id,
            ", ".join(f"{name}:{size}" for name, size in self.queues.items()),
            alias,
            dialect.vendor,
            dialect.exclusivity,
        )
        try:
            self._report_clock()
            session_alias = self._session_alias()
            self.watcher.listen_alias = session_alias
            # The lock is held before the row exists, so a row with a released lock is a dead worker's.
            runtime.presence = presence.announce(alias, runtime.worker_id, session_alias)
            self._register()
            if runtime.presence is None:  # no lock vouches for this worker: its row does, written every few seconds
                runtime.beat = RowBeat(
                    alias, runtime.worker_id, runtime.clock, lambda now: self._write_row(now, runtime.jobs_done)
                )
                runtime.beat.start()
        except Exception:
            if not runtime.stop_claiming.is_set():
                raise
            if runtime.presence is not None:
                runtime.presence.withdraw()
            logger.info("durq: worker %s stopped during start-up (%s)", runtime.worker_id, runtime.stop_reason)
            return exit_status.CLEAN
        self.bell = MainBell()
        self.bell.hear_signals()
        runtime.wake_main = self.bell.ring
        self.watcher.start()
        if self.watcher.active:
            runtime.hears_wakeups()
        runtime.events.start()
        self.keeper.start()
        for pool in self.pools:
            pool.start()
        self.monitor.start()
        if runtime.burst:
            # One maintenance pass, so schedules that are due fire in a burst run too.
            self.maintenance.run_once(runtime.clock.now_ms())
        else:
            self.maintenance.start()
        connections.close_all()  # the main thread needs no connection until the worker stops
        pace_s = MAIN_WAIT_S if self.on_tick is None else PROGRESS_S
        try:
            while not all(pool.finished.is_set() for pool in self.pools):
                if runtime.stop_claiming.is_set():
                    self._drain()
                    break
                self.bell.wait(pace_s)
                if self.on_tick is not None:
                    self.on_tick(runtime)
        finally:
            self.maintenance.stop()
            self.monitor.stop()
            self.keeper.stop()
            self.monitor.flush(runtime.clock.now_ms())
            runtime.events.stop()
            self.watcher.stop()
            if runtime.beat is not None:
                runtime.beat.stop()  # before the row goes: a beat that found no row would write it anew
            self._unregister()
            if runtime.presence is not None:
                runtime.presence.withdraw()
            connections.close_all()
            runtime.wake_main = lambda: None
            self.bell.close()
        handed_back = runtime.outcomes.get(RELEASED, 0)
        failed = runtime.exit_status != exit_status.CLEAN
        logger.log(
            logging.ERROR if failed else logging.INFO,
            "durq: worker %s stopped (%s); %d jobs done, %d handed back%s",
            runtime.worker_id,
            runtime.stop_reason or "burst done",
            runtime.jobs_done - handed_back,
            handed_back,
            f"; it exits with status {runtime.exit_status}" if failed else "",
        )
        return runtime.exit_status

    def _drain(self) -> None:
        """Wait up to the grace period for running jobs, then hand back the leases still held."""
        runtime = self.runtime
        deadline = time.monotonic() + self.grace_ms / 1000
        for pool in self.pools:
            pool.kick.set()
        while time.monotonic() < deadline:
            if all(pool.finished.is_set() for pool in self.pools):
                return
            if all(pool.busy() == 0 for pool in self.pools):
                time.sleep(0.01)
                continue
            self.bell.wait(0.05)
        for pool in self.pools:
            pool.flush_completions()
        # Handlers still running past the grace: their attempts are settled here, so whatever
        # they do next records nothing, and handed back (counted towards MAX_HANDBACKS).
        released = 0
        for pool in self.pools:
            for attempt in pool.running():
                ctx = attempt.ctx
                if not ctx.settle():
                    continue
                ctx.lease_lost = True
                try:
                    outcome = pool.executor.hand_back(attempt.job, ctx, error_list(attempt.job.errors))
                except Exception:
                    job = attempt.job
                    logger.exception(
                        "durq: could not hand back job %s (%s); its lease will expire", job.id, job.name, extra=log_extra(job)
                    )
                    continue
                finally:
                    runtime.book.remove(attempt)
                runtime.job_done(outcome)
                released += outcome == RELEASED
        if released:
            logger.warning("durq: shutdown grace ran out; released %d running job(s) for other workers", released)

    def _session_alias(self) -> str | None:
        """Where this worker may keep session state on PostgreSQL (LISTEN, session locks); None for nowhere.

        ``DURQ["LISTEN_DATABASE"]`` names it (the queue's database unless set), but only a
        connection that keeps its server session will do: through a transaction pooler, found out
        by asking the server (``db/pooler.py``), the worker keeps none. Presence and leadership
        then go through rows, and idle pools find new jobs at their poll interval.
        """
        listen_alias = self.settings.listen_database
        if connections[self.settings.database].vendor != "postgresql":
            return listen_alias  # SQLite's and MariaDB's presence and wake-ups need no such session
        if listen_alias is None:
            logger.info('durq: DURQ["LISTEN_DATABASE"] is None: idle workers find new jobs at their poll interval')
            return None
        try:
            pooled = pooler.lends_sessions(connections[listen_alias])
        except Exception as error:  # noqa: BLE001 - a session it cannot vouch for is not used
            logger.warning(
                "durq: cannot tell whether database %r keeps its sessions (%s); this worker keeps no session state there",
                listen_alias,
                error,
            )
            return None
        if pooled:
            # durq.W006 has said why, among the start-up checks; this says what the worker does.
            logger.info(
                "durq: database %r goes through a transaction pooler: no LISTEN, session lock or prepared claim there; "
                "presence and maintenance duties through rows; idle pools look for new jobs every %g s",
                listen_alias,
                self.runtime.poll_s,
            )
            return None
        return listen_alias

    def _report_clock(self) -> None:
        """Say how far this host's clock is from the database's, whose timeline the queue uses."""
        clock = self.runtime.clock
        if not isinstance(clock, ServerClock):
            return
        self.runtime.store.retrying("clock check", lambda d: clock.measure(), give_up=self.runtime.stop_claiming)
        if abs(clock.offset_ms) >= 1_000:
            logger.warning(
                "durq: this host's clock is %+.1f s off the database server's; leases, due times and schedules use "
                "the database server's clock (to within %.1f ms), but run NTP on every host all the same",
                -clock.offset_ms / 1000,
                clock.uncertainty_ms,
            )

    def _register(self) -> None:
        self.runtime.register = self._write_row
        now = self.runtime.clock.now_ms()
        self.runtime.store.retrying("register worker", lambda d: self._write_row(now, 0), give_up=self.runtime.stop_claiming)

    def _write_row(self, now: int, jobs_done: int) -> None:
        WorkerProcess.objects.using(self.settings.database).update_or_create(
            worker_id=self.runtime.worker_id,
            defaults={
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "queues": json.dumps(self.queues),
                "started_ms": self._started_ms or now,
                "last_seen_ms": now,
                "jobs_done": jobs_done,
                "holds_lock": self.runtime.presence is not None,
                "beat_ms": BEAT_MS if self.runtime.presence is None else None,
            },
        )
        self._started_ms = self._started_ms or now

    def _unregister(self) -> None:
        try:
            WorkerProcess.objects.using(self.settings.database).filter(worker_id=self.runtime.worker_id).delete()
        except Exception:  # noqa: BLE001 - the row ages out; exiting matters more
            logger.warning("durq: could not remove this worker's row; it will age out")


def run_in_thread(supervisor: Supervisor) -> threading.Thread:
    """Run a supervisor without signal handlers (embedding and tests)."""
    thread = threading.Thread(target=supervisor.run, name="durq-supervisor", daemon=True)
    thread.start()
    return thread
