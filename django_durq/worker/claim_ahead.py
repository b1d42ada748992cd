"""A pool's claim-ahead buffer: how many jobs to hold, and the jobs handed back that waited too long (see ``pool.py``)."""

from __future__ import annotations

import logging
import time
from collections import deque

from django.db import transaction

from ..conf import hooks
from ..db import Dialect, counters, places, wakeup
from .attempt import Attempt
from .completions import PoolCompletions

logger = logging.getLogger("django_durq")

# The most jobs a pool claims beyond its free slots, however short its jobs. It binds only for
# jobs of under about 80 µs (four slots start 1,024 of them within the 20 ms of ``PREFETCH``):
# each claim and each completion's transaction costs a commit and a few round trips whatever its
# size, and at 256 the slots of a no-op drain waited for the next batch most of the time. The
# jobs held stay those the slots start within ``PREFETCH``, so a larger bound claims no job
# another worker should run.
MAX_AHEAD = 1024
# The most a pool holds ahead while its claims enforce limits. Such a claim counts every running
# row, the jobs held ahead included, and judges each candidate in Python; where keys allow one
# running job each, a larger batch passes over more jobs whose key it already holds. A per-key
# drain ran 0.63x on PostgreSQL (0.92x on SQLite and MariaDB) at 1,024 ahead, against 256.
LIMITED_MAX_AHEAD = 256

# A job claimed ahead that has waited this long for a slot is handed back for other workers.
BUFFER_MAX_WAIT_S = 0.25


class ClaimAhead(PoolCompletions):
    """The buffer of claimed jobs not started yet (a part of :class:`~.pool.Pool`)."""

    # Set by Pool.__init__.
    concurrency: int
    prefetch_ms: int
    _ready: deque[Attempt]
    _mean_job_s: float | None

    def _target(self, longest_running_s: float) -> int:
        """How many jobs to hold: one per slot, plus those the slots should start within the horizon.

        Nothing is claimed ahead while a slot runs a job longer than the horizon or than
        ``BUFFER_MAX_WAIT_S``, whichever is longer: the jobs it would hold could start sooner on
        another worker. Not the horizon alone: a job of microseconds whose process lost its core
        runs for milliseconds (with 16 worker processes on 2 cores a fifth of the dispatchers'
        looks found a job past 20 ms while the median job took 17 µs), and each such look
        claimed a job or two, each claim a transaction. Jobs held ahead past
        ``BUFFER_MAX_WAIT_S`` behind a job that long are handed back (``_hand_back``).
        """
        mean = self._mean_job_s
        horizon_s = self.prefetch_ms / 1000
        if not self.prefetch_ms or mean is None or longest_running_s > max(horizon_s, BUFFER_MAX_WAIT_S):
            return self.concurrency
        ahead = self.concurrency * horizon_s / max(mean, 1e-6)
        most = MAX_AHEAD if self.gate.claim_limits is None else LIMITED_MAX_AHEAD
        return self.concurrency + min(most, int(ahead))

    def _hand_back(self, everything: bool) -> None:
        """Release buffered jobs that never started for other workers, the attempt not counted."""
        horizon = time.monotonic() - BUFFER_MAX_WAIT_S
        with self._lock:
            if everything:
                taken, self._ready = list(self._ready), deque()
            else:
                taken = [attempt for attempt in self._ready if attempt.buffered_at <= horizon]
                self._ready = deque(attempt for attempt in self._ready if attempt.buffered_at > horizon)
        if not taken:
            return
        released = self._release_unstarted(taken)
        if released:
            logger.info("durq: handed back %d buffered job(s) of queue %r that had not started", released, self.queue)

    def _release_unstarted(self, taken: list[Attempt]) -> int:
        """Give jobs that never started back for other workers, attempts not counted, places freed; how many."""
        runtime = self.runtime
        leases = [attempt.lease for attempt in taken]
        placed = [attempt.lease for attempt in taken if attempt.job.placed]
        for attempt in taken:
            attempt.ctx.settle()
        hooks.jitter("release")
        alias = runtime.settings.database

        def release(dialect: Dialect) -> int:
            with transaction.atomic(using=alias):
                released = dialect.release(leases, started=False, now_ms=runtime.clock.now_ms())
                if released == len(taken):  # which were released is not told: counted when all were
                    counters.add(dialect, [row for a in taken for row in counters.ended(a.job, counters.HANDED_BACK)])
                places.free(dialect, placed)
                wakeup.wake_on_commit(alias, [self.queue], jobs=released)
            return released

        try:
            released = runtime.store.retrying("release", release)
        except Exception:  # their leases expire; no job is lost (their places free with this process)
            logger.exception("durq: could not hand back %d buffered job(s); their leases will expire", len(leases))
            released = 0
        finally:
            for attempt in taken:
                runtime.book.remove(attempt)
        runtime.unclaimed(len(leases))
        return released
