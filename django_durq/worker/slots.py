"""A pool's slots: threads that take a buffered job, run it and retire it, and the reaping of timed-out handlers."""

from __future__ import annotations

import logging
import math
import threading
import time

from django.db import connections

from ..conf import hooks
from ..execution.outcomes import ABANDONED, PAUSED, log_extra
from .attempt import FINISHING, RUNNING, Attempt
from .claim_ahead import ClaimAhead
from .completions import FLUSH_BATCH
from .pause_guard import PauseGuard
from .slot_connections import SlotConnections

logger = logging.getLogger("django_durq")

# How long past its timeout a handler may run before its slot is given to a new thread.
TIMEOUT_GRACE_MS = 1_000
# A slot idle for longer than this checks its connections before the next handler runs.
IDLE_CHECK_S = 1.0
# A handler running this long no longer counts as a slot about to start buffered jobs (see _wake_for_buffer).
HEAD_STALL_S = 0.005
# A job's time counts in the pool's mean at most this many times the mean (see _learn_job_time).
JOB_TIME_CLIP = 4


class Slots(ClaimAhead):
    """The slot threads (a part of :class:`~.pool.Pool`)."""

    # Set by Pool.__init__.
    kick: threading.Event
    _has_ready: threading.Condition
    _running: set[Attempt]
    _busy: int
    _sleeping: int
    _quick_job_s: float | None
    _closing: bool
    _threads: list[threading.Thread]
    _completions_since: float
    _low_water: int
    pause_guard: PauseGuard

    def _add_thread(self) -> None:
        thread = threading.Thread(target=self._work, name=f"durq-{self.queue}-{len(self._threads)}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def running(self) -> list[Attempt]:
        with self._lock:
            return list(self._running)

    def running_now(self) -> int:
        """How many handlers run, read without the lock: safe in a signal handler."""
        return len(self._running)

    def busy(self) -> int:
        with self._lock:
            return self._busy

    def held(self) -> int:
        """Jobs this pool holds a lease on and has not finished: running plus buffered."""
        with self._lock:
            return self._busy + len(self._ready)

    def _slots_wanted(self, buffered: int) -> int:
        """How many awake slots start ``buffered`` jobs within the prefetch horizon.

        Judged by the pool's quick job time (see ``_learn_job_time``); every slot while that is
        unknown, or when nothing is claimed ahead (``PREFETCH`` 0).
        """
        quick = self._quick_job_s
        if quick is None or not self.prefetch_ms:
            return self.concurrency
        return min(self.concurrency, max(1, math.ceil(buffered * quick * 1000 / self.prefetch_ms)))

    def _learn_job_time(self, took_s: float) -> None:
        """Fold a job's time on its slot into the pool's mean (claiming ahead) and quick time (waking slots).

        The quick time follows the faster jobs: it falls at once and rises by a sixty-fourth of
        the gap. A job's time on its slot includes its waits for the GIL, which grow with every
        slot awake and with the dispatcher's work on a claim; a mean would read those waits as
        longer jobs and wake more slots, which wait longer still.

        The mean moves a quarter of the way to each job's time, taken at most ``JOB_TIME_CLIP``
        times the mean. A slot whose process loses its core mid-job (many worker processes on few
        cores) reads a job of microseconds as one of tens of milliseconds: with 16 processes on 2
        cores the slowest 1% of no-op jobs held 59% of their summed time, and the plain mean, often
        3 and at times 300 times the median, cut the claims ahead to a few jobs each. Jobs that
        really got longer raise the mean within a few dozen, and the first of them to run past 0.25
        s stops claiming ahead at once (``_target``). A long job now and then counts the same way:
        where one job in ten or fewer is much longer, the mean is mostly the quick jobs', and the
        pool holds ahead what they take for the horizon (the long jobs take their slots as they
        come; one past 0.25 s stops claiming ahead and hands back what waited behind it). A quarter,
        not less: a worker's first jobs (its first connections and queries) take milliseconds, and
        the mean forgets them within about 25 jobs, where at an eighth each of 16 new processes made
        claims of a few jobs for its first 46.
        """
        mean, quick = self._mean_job_s, self._quick_job_s
        self._mean_job_s = took_s if mean is None else mean + (min(took_s, JOB_TIME_CLIP * mean) - mean) / 4
        self._quick_job_s = took_s if quick is None or took_s < quick else quick + (took_s - quick) / 64

    def _wake_for_buffer(self, now_mono: float) -> None:
        """Wake sleeping slots until enough are awake for the buffer (the caller holds the lock).

        A pool keeps no more slots awake than its buffered jobs need: for jobs of microseconds one
        slot starts a claim's hundreds within the horizon, and every further awake slot would only
        take Python's GIL in turn with it (each handler's system call hands it over), which slows
        all of them; a surplus slot goes back to sleep (``_next_job``). A slot whose handler has
        run longer than ``HEAD_STALL_S`` at ``now_mono`` is not counted as one that will start
        them, and the dispatcher looks at most that often while jobs wait and a slot sleeps: a
        long job never holds buffered ones back while another slot sleeps.
        """
        sleeping = self._sleeping
        if not sleeping or not self._ready:
            return
        available = self.concurrency - sleeping - self._held_up(now_mono)
        wake = self._slots_wanted(len(self._ready)) - available
        if wake > 0:
            wake = min(wake, sleeping)
            self._sleeping = sleeping - wake
            self._has_ready.notify(wake)

    def _held_up(self, now_mono: float) -> int:
        """Awake slots whose handler has run longer than ``HEAD_STALL_S`` (the caller holds the lock)."""
        since = now_mono - HEAD_STALL_S
        return sum(1 for attempt in self._running if attempt.ctx.started_mono < since)

    def _surplus(self) -> bool:
        """Whether this slot, about to take a buffered job, is one more than the buffer needs (lock held).

        Slots held up by long handlers do not count: the ones between jobs must be enough.
        """
        awake = self.concurrency - self._sleeping
        if awake <= 1:
            return False
        return awake - self._held_up(time.monotonic()) > self._slots_wanted(len(self._ready))

    def _next_job(self, finished: Attempt | None) -> Attempt | None:
        """Retire the slot's finished attempt and take the next buffered one; None when this thread should end.

        One critical section does both, as this runs once per job.
        """
        runtime = self.runtime
        flush = False
        with self._has_ready:
            if finished is not None:
                self._running.discard(finished)
                completion = self._finished_results.pop(finished.lease, None)
                if completion is not None:
                    finished.state = FINISHING
                    finished.result = completion.result
                    if completion.keep:
                        finished.stored, finished.finished_ms = completion.stored, completion.finished_ms
                    self._completions.append(finished)
                    pending = len(self._completions)
                    if pending == 1:
                        self._completions_since = time.monotonic()
                    flush = pending == 1 or pending == FLUSH_BATCH
                else:
                    runtime.book.remove(finished)  # its outcome is recorded, or was never ours to record
                if finished.abandoned:
                    if flush:
                        self.kick.set()
                    return None  # a replacement thread already took this slot
                self._busy -= 1
            # Once claiming stops, buffered jobs are no longer started: the dispatcher hands them back.
            while not self._ready or runtime.stop_claiming.is_set() or self._surplus():
                if self._closing:
                    return None
                self.kick.set()  # a free slot (and maybe a completion): the dispatcher may act
                self._sleeping += 1  # whoever wakes this slot counts it awake again
                self._has_ready.wait()
            attempt = self._ready.popleft()
            attempt.state = RUNNING
            self._busy += 1
            self._running.add(attempt)
            left = len(self._ready)
        if flush or left == 0 or left == self._low_water:
            self.kick.set()  # completions to record, or the buffer needs refilling
        return attempt

    def _paused(self, attempt: Attempt) -> None:
        """``attempt`` did not start, its queue paused (``pause_guard.py``): it and every buffered one
        are handed back, attempts not counted.
        """
        with self._lock:
            self._running.discard(attempt)
            self._busy -= 1
        self._release_unstarted([attempt])
        self._hand_back(everything=True)
        logger.info("durq: queue %r is paused; its jobs claimed ahead were handed back", self.queue)
        self.kick.set()

    def _work(self) -> None:
        runtime = self.runtime
        idle_since = 0.0
        slot_connections = SlotConnections()
        attempt: Attempt | None = None
        while True:
            attempt = self._next_job(attempt)
            if attempt is None:
                break
            started = time.monotonic()
            if started - idle_since > IDLE_CHECK_S:
                slot_connections.after_idle()
            outcome = "error"
            try:
                # Whether the queue is paused is asked last, once every wait before the start is over.
                outcome = self.executor.run(attempt.job, attempt.ctx, may_start=self.pause_guard.may_start)
            except BaseException:  # the database stayed down past every retry
                logger.exception(
                    "durq: could not record the outcome of job %s (%s); its lease will expire",
                    attempt.job.id,
                    attempt.job.name,
                    extra=log_extra(attempt.job),
                )
            if outcome == PAUSED:
                self._paused(attempt)
                attempt = None  # handed back: nothing to retire
                continue
            # The handler has returned; unless a completion carries its place, free that now (or at the next write).
            if attempt.job.placed and attempt.lease not in self._finished_results and not self.places.free([attempt.lease]):
                self.kick.set()
            slot_connections.tidy()
            idle_since = time.monotonic()
            self._learn_job_time(idle_since - started)
            if outcome != ABANDONED:
                runtime.job_done(outcome)
        connections.close_all()  # the slot's, handlers' own included

    def reap_timeouts(self) -> None:
        """Fail attempts that ran past their timeout and give their slot to a fresh thread.

        Python cannot kill a thread: the hung handler keeps running, but its later writes are
        fenced off, and the pool keeps its full number of working slots. A handler of a limited
        job keeps its place (``held_places.py``): it is written before the attempt is failed,
        and freed by whichever of this thread and the handler's own learns second that the
        handler has returned.
        """
        for attempt in self.running():
            overdue_s = attempt.ctx.overdue_by_s()
            if overdue_s is None or overdue_s * 1000 < TIMEOUT_GRACE_MS or attempt.ctx.settled:
                continue
            held = attempt.job.placed
            if held and not self.places.hold_abandoned(attempt.lease, self.runtime.worker_id, self.runtime.clock.now_ms()):
                continue  # the database is away: the timeout is recorded once the place can be
            with self._lock:
                if attempt.abandoned:
                    continue
                returned = attempt not in self._running
                if not returned:
                    attempt.abandoned = True
                    self._running.discard(attempt)
                    self._busy -= 1
            if returned:
                if held:
                    self.places.free([attempt.lease])  # its slot may have freed it before it was written
                continue
            hooks.jitter("reap")
            try:
                if self.executor.record_timeout(attempt.job, attempt.ctx) == ABANDONED and held:
                    # The handler returned first and recorded its own outcome, which frees no place.
                    self.places.free([attempt.lease])
            finally:
                self.runtime.book.remove(attempt)
                self._add_thread()
                self.kick.set()
