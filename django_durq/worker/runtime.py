"""What the pools, the monitor and the supervisor of one worker process share."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable

from ..clock import Clock
from ..conf import DurqSettings
from ..db.presence import WorkerPresence
from ..db.store import Store
from ..execution.outcomes import DEAD, FINISHED, RETRYING, UNKNOWN_TYPE
from . import exit_status
from .attempt import AttemptBook
from .events import Events
from .row_presence import RowBeat

# Database connections a worker process holds besides one per slot and one per queue's dispatcher:
# the monitor, the lease keeper, the maintenance runner and the events thread (once a signal
# receiver uses the database). The main thread closes its own once the worker has started, and
# the wake-up watcher (PostgreSQL, MariaDB) opens one more outside Django's connection handling,
# on PostgreSQL to DURQ["LISTEN_DATABASE"] (the queue's database unless that goes through a pooler).
SHARED_CONNECTIONS = 4

# An idle pool's probe interval when DURQ["POLL_INTERVAL"] is not set: where nothing wakes the
# worker when a job is queued (PostgreSQL without LISTEN_DATABASE), the probe is how it finds
# jobs; where something does, the probe only finds what no wake-up announced (a row inserted by
# raw SQL, a lease that ran out after the last probe), and a longer interval saves the idle CPU.
POLL_WITHOUT_WAKEUPS_MS = 1_000
POLL_WITH_WAKEUPS_MS = 5_000


def connections_needed(concurrencies: list[int]) -> int:
    """Connections from Django's pool that one worker running queues of these sizes holds at most."""
    return sum(size + 1 for size in concurrencies) + SHARED_CONNECTIONS


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Runtime:
    def __init__(
        self,
        *,
        settings: DurqSettings,
        clock: Clock,
        worker_id: str | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.store = Store(settings.database)
        self.worker_id = worker_id or new_worker_id()
        # Set while a lock vouches that the process is alive (a file's, a session's): see presence.py.
        self.presence: WorkerPresence | None = None
        # Where none does: its row, written every few seconds (row_presence.py).
        self.beat: RowBeat | None = None
        self.burst = burst
        self.max_jobs = max_jobs
        # The longest an idle pool sleeps before it looks for due jobs; see ``hears_wakeups``.
        self.poll_s = (settings.poll_interval_ms or POLL_WITHOUT_WAKEUPS_MS) / 1000
        self.stop_claiming = threading.Event()  # no new claims (signal, --max-jobs, --max-memory, error)
        self.shutdown = threading.Event()  # running handlers are asked to stop (any stop the worker decides)
        # Wakes the supervisor's main thread (a stop was requested, a pool finished): set by it.
        self.wake_main: Callable[[], None] = lambda: None
        self.stop_reason = ""
        # The process's exit status (exit_status.py): set by the first part of the worker that fails.
        self.exit_status = exit_status.CLEAN
        # Every attempt this process holds a lease for; the lease keeper renews exactly these. It
        # also says until when this process may claim (``book.may_claim``).
        self.book = AttemptBook()
        self.keeper_kick: Callable[[], None] = lambda: None
        # Writes this worker's row anew (now_ms, jobs done): set by the supervisor.
        self.register: Callable[[int, int], None] = lambda now_ms, jobs_done: None
        self.events = Events()
        self._lock = threading.Lock()
        self._claimed = 0
        self.jobs_done = 0
        self.outcomes: dict[str, int] = defaultdict(int)
        self._stats: dict[tuple[str, int], list[int]] = {}

    def hears_wakeups(self) -> None:
        """New jobs wake this process (a bell, LISTEN, MariaDB's watcher): the probe is only the safety net.

        Unless ``DURQ["POLL_INTERVAL"]`` says otherwise, an idle pool then looks every
        ``POLL_WITH_WAKEUPS_MS``: every look is a read, and its wake-up costs an idle worker
        more CPU than anything else it does.
        """
        if self.settings.poll_interval_ms is None:
            self.poll_s = POLL_WITH_WAKEUPS_MS / 1000

    def request_stop(self, reason: str = "stopping") -> None:
        """Stop claiming and ask running handlers to stop (``ctx.should_stop()``), saying why.

        Handlers hear it at once, before any grace period starts, whatever decided the stop.
        """
        with self._lock:
            if not self.stop_reason:
                self.stop_reason = reason
        self.stop_claiming.set()
        self.shutdown.set()
        self.wake_main()

    def fail(self, reason: str, error: BaseException) -> None:
        """A part of the worker stopped on ``error``: stop as ``request_stop()`` does, and exit non-zero."""
        with self._lock:
            if self.exit_status == exit_status.CLEAN:
                self.exit_status = exit_status.of_failure(error)
        self.request_stop(reason)

    def stop_cause(self) -> str:
        return self.stop_reason

    def presence_held_since(self) -> float | None:
        """Since when this process's presence (its lock, or else its row's beats) has held without a break.

        0.0 where it has neither: nothing but the jobs' leases vouches for it.
        """
        if self.presence is not None:
            return self.presence.held_since()
        return self.beat.held_since() if self.beat is not None else 0.0

    def presence_held(self) -> bool:
        """False while the presence may be gone: other workers may then take this one's jobs over."""
        return self.presence_held_since() is not None

    def stop_on_signal(self, reason: str) -> None:
        """``request_stop()`` for a signal handler, which takes no lock the main thread may hold.

        A handler runs in the main thread between two bytecodes, possibly inside a wait of the
        supervisor's: setting an event whose lock that wait holds would deadlock. The main
        thread never waits on these two events; the signal itself woke it (``main_bell.py``),
        and it reads ``stop_claiming`` once the handler has run. Claiming stops before handlers
        are told to, so a job a handler hands back is not claimed again by this worker.
        """
        if not self.stop_reason:
            self.stop_reason = reason
        self.stop_claiming.set()
        self.shutdown.set()

    def claim_budget(self, free: int) -> int:
        """How many of ``free`` slots may claim, honouring ``--max-jobs``; reserves them."""
        with self._lock:
            if self.max_jobs is None:
                return free
            allowed = max(0, min(free, self.max_jobs - self._claimed))
            self._claimed += allowed
            return allowed

    def unclaimed(self, count: int) -> None:
        """Give back budget reserved for claims that came back short."""
        if self.max_jobs is None or count <= 0:
            return
        with self._lock:
            self._claimed -= count

    def job_done(self, outcome: str) -> None:
        with self._lock:
            self.jobs_done += 1
            self.outcomes[outcome] += 1
            done = self.jobs_done
        if self.max_jobs is not None and done >= self.max_jobs:
            self.request_stop(f"--max-jobs {self.max_jobs} reached")

    def count(self, queue: str, outcome: str, n: int = 1) -> None:
        minute = self.clock.now_ms() // 60_000 * 60_000
        with self._lock:
            row = self._stats.setdefault((queue, minute), [0, 0, 0, 0])
            if outcome == FINISHED:
                row[0] += n
            elif outcome == RETRYING:
                row[1] += n
            elif outcome == DEAD:
                row[1] += n
                row[2] += n
            elif outcome == UNKNOWN_TYPE:
                row[3] += n

    def take_stats(self) -> list[tuple[str, int, int, int, int, int]]:
        with self._lock:
            stats, self._stats = self._stats, {}
        return [(queue, minute, *counts) for (queue, minute), counts in sorted(stats.items())]  # type: ignore[misc]
