"""A bounded pool for one named queue: a dispatcher thread that claims, slot threads that run.

The dispatcher claims jobs into a small ready buffer and slots take them from it. With
``PREFETCH`` at 0 a pool claims no more than its free slots. Otherwise it may claim ahead as
many jobs as its slots are expected to start within ``PREFETCH`` seconds, judged by the pool's
own recent job durations: short jobs are claimed hundreds at a time, while jobs that take
longer than the horizon are never held back from another worker. Buffered jobs are leased and
heartbeated like running ones, and handed back, attempt uncounted, at shutdown.

Every claim is an :class:`~.attempt.Attempt`, entered in the process's book before a slot can
see it and left there until its outcome is committed; the lease keeper renews what the book
holds. Bookkeeping here is by attempt, never by job id, so a stale attempt of a job (abandoned
at its timeout, or whose lease lapsed) cannot disturb a newer one of the same job.

Finished jobs are deleted in batches, in the same transaction as the next claim: a finished
job waits in memory at most ``COMPLETION_HOLD_MS`` plus the write in progress, and at most
``FLUSH_BATCH`` of them wait at once; a crash in that window runs them again once their leases
expire (at-least-once). Jobs claimed ahead that wait longer than ``BUFFER_MAX_WAIT_S`` (a long
job took the slot they were meant for) are handed back, attempt uncounted, for idle workers.

An idle dispatcher probes with a read before it claims, so an idle poll on SQLite takes no
write lock, and sleeps until it is kicked (an enqueue, another process's commit, a freed
slot) or the poll interval runs out; while a rate holds its queue's due jobs back, until the
rate's window opens.

Flow control on the worker's side (the claim does the rest, ``db/flow.py``): a slot starts a job
only while its queue was seen not paused lately (``pause_guard.py``), and a job claimed under a
running limit holds a place until the handler's thread is done with it (``held_places.py``):
freed with its completion, right after any other outcome (a timed-out handler's only when its
thread returns at last), or with its hand-back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import connections, transaction

from ..conf import hooks
from ..db import ClaimedJob, Dialect, Lease, places, wakeup
from ..execution.executor import ABANDONED, DEAD, Completion, Executor, log_extra
from ..handlers.context import JobContext
from .attempt import FINISHING, RUNNING, Attempt
from .flow_gate import FlowGate
from .held_places import HeldPlaces
from .pause_guard import PauseGuard
from .slot_connections import SlotConnections

if TYPE_CHECKING:
    from .runtime import Runtime

logger = logging.getLogger("django_durq")

# How long past its timeout a handler may run before its slot is given to a new thread.
TIMEOUT_GRACE_MS = 1_000
# A slot idle for longer than this checks its connections before the next handler runs.
IDLE_CHECK_S = 1.0
# The longest a finished job's delete waits in memory to share a transaction with others.
COMPLETION_HOLD_MS = 5
# Completions recorded at once at most; reaching it flushes before the hold is over.
FLUSH_BATCH = 256
# The most jobs a pool claims beyond its free slots, however short its jobs.
MAX_AHEAD = 256
# Where writers are serialized (SQLite) and another connection has written lately: the most jobs
# claimed in one transaction, and how long the lock is then left free, as a multiple of the time
# the transaction held it. Without other writers the dispatcher writes back to back.
SERIALIZED_CLAIM_MAX = 64
SERIALIZED_GAP_FACTOR = 1.0
# How long after another connection last wrote the dispatcher keeps sharing the lock that way.
SHARING_S = 0.25


# A job claimed ahead that has waited this long for a slot is handed back for other workers.
BUFFER_MAX_WAIT_S = 0.25


class Pool:
    def __init__(self, queue: str, concurrency: int, runtime: Runtime) -> None:
        self.queue = queue
        self.concurrency = concurrency
        self.runtime = runtime
        self.prefetch_ms = runtime.settings.prefetch_ms(queue)
        self._heartbeat_ms = runtime.settings.heartbeat_interval_ms
        self.kick = threading.Event()
        self.finished = threading.Event()  # the dispatcher has stopped and every slot is idle
        self._lock = threading.Lock()
        self._has_ready = threading.Condition(self._lock)
        self._ready: deque[Attempt] = deque()  # claimed, not started
        self._running: set[Attempt] = set()  # handlers running on a slot (abandoned ones excluded)
        self._completions: list[Attempt] = []  # finished, completion not committed yet
        self._finished_results: dict[Lease, Completion] = {}  # set by the executor on the slot's thread
        self._closing = False
        self._busy = 0
        self._threads: list[threading.Thread] = []
        self._completions_since = 0.0
        # Mean handler time per job (seconds), smoothed; decides how far ahead to claim.
        self._mean_job_s: float | None = None
        self._low_water = 0  # a slot that leaves this many buffered jobs kicks the dispatcher
        self._named = False  # a wake-up named this queue since the dispatcher last looked
        self._offered = 0  # jobs this pool said it had a free slot for since then (see _wake)
        self._claiming = 0  # slots the dispatcher's claim in flight may fill (see _wake)
        self._serialized = runtime.store.dialect.serialized_writes
        self._write_free_at = 0.0  # monotonic time before which the dispatcher leaves the write lock alone
        self._sharing_until = 0.0  # another connection wrote lately: share the write lock until then
        self._seen_version: int | None = None
        self._read_version: Callable[[], int] | None = None  # PRAGMA data_version on the dispatcher's connection
        self._prepared_for: object = None  # the driver connection prepare_dispatcher_connection() tuned
        self.gate = FlowGate(queue, runtime)
        self.pause_guard = PauseGuard(queue, runtime)
        self.places = HeldPlaces(runtime.store)
        self.executor = Executor(
            runtime.store,
            runtime.settings,
            runtime.clock,
            runtime.worker_id,
            count=runtime.count,
            defer_completion=self._defer_completion,
            emit=runtime.events.emit,
            emit_many=runtime.events.emit_many,
        )
        self._dispatcher = threading.Thread(target=self._dispatch, name=f"durq-{queue}-dispatch", daemon=True)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        wakeup.subscribe(self.queue, self._wake)
        for _ in range(self.concurrency):
            self._add_thread()
        self._dispatcher.start()

    def _wake(self, named: bool) -> bool:
        """Called by ``wakeup``; ``named`` when a notification named this queue (a job was queued).

        True when a slot is free for the job, counting the jobs already offered since the
        dispatcher last looked and the slots its claim in flight may fill: a ring this pool cannot
        serve at once goes on to another worker. A claim in flight read its time before the ring
        came, so it may not see the job as due; once it is in, the pool looks again (``_named``).
        """
        room = False
        if named:
            runtime = self.runtime
            with self._lock:
                self._named = True
                if not runtime.stop_claiming.is_set() and runtime.book.may_claim(time.monotonic()):
                    room = self._busy + len(self._ready) + self._offered + self._claiming < self.concurrency
                    self._offered += room
        self.kick.set()
        return room

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

    # --- dispatcher ----------------------------------------------------------------------------

    def _target(self, longest_running_s: float) -> int:
        """How many jobs to hold: one per slot, plus those the slots should start within the horizon.

        Nothing is claimed ahead while a slot runs a job longer than the horizon: the jobs it
        would hold could start sooner on another worker.
        """
        mean = self._mean_job_s
        horizon_s = self.prefetch_ms / 1000
        if not self.prefetch_ms or mean is None or longest_running_s > horizon_s:
            return self.concurrency
        ahead = self.concurrency * horizon_s / max(mean, 1e-6)
        return self.concurrency + min(MAX_AHEAD, int(ahead))

    def _dispatch(self) -> None:
        runtime = self.runtime
        probe = True
        wait_s = 0.0
        try:
            while not runtime.stop_claiming.is_set():
                self._claiming = 0  # no claim in flight from here until the next look
                if wait_s > 0:
                    self.kick.wait(self.gate.until_window(wait_s))
                    if runtime.stop_claiming.is_set():
                        break  # stopped while waiting: claim nothing more, not even a job just handed back
                self.kick.clear()
                hooks.jitter("dispatch")
                wait_s = runtime.poll_s
                with self._lock:
                    now_mono = time.monotonic()
                    # How long the slot busy longest has run: decides claiming ahead and hand-backs.
                    longest_s = max((now_mono - attempt.ctx.started_mono for attempt in self._running), default=0.0)
                    held = self._busy + len(self._ready)
                    ready = len(self._ready)
                    pending = len(self._completions) + len(self.places)
                    held_for_s = now_mono - self._completions_since
                    target = self._target(longest_s)
                    # Jobs claimed ahead that waited too long because a long job took their slot
                    # (not merely because every commit is slow) go back to other workers.
                    stale = ready > 0 and now_mono - self._ready[0].buffered_at >= BUFFER_MAX_WAIT_S
                if stale and longest_s >= BUFFER_MAX_WAIT_S:
                    self._hand_back(everything=False)  # the counts above then overstate what is held: no over-claim
                want = target - held
                # Refill once the buffer is half used (at once when it only covers free slots).
                self._low_water = (target - self.concurrency) // 2
                # While a lease this process holds is unconfirmed (see AttemptBook), or the presence
                # lock may be gone, claim nothing: a job taken now might be given to another worker.
                refill = want > 0 and ready <= self._low_water and runtime.book.may_claim(now_mono) and runtime.presence_held()
                overdue = held_for_s * 1000 >= COMPLETION_HOLD_MS
                flush = pending > 0 and (pending >= FLUSH_BATCH or overdue or refill)
                if ready:
                    wait_s = min(wait_s, BUFFER_MAX_WAIT_S)
                if not refill and not flush:
                    if pending:
                        wait_s = max(COMPLETION_HOLD_MS / 1000 - held_for_s, 0.0005)
                    continue
                # Completions held past their window do not wait for the write lock to be shared.
                if self._serialized and not overdue and self._sharing():
                    rest_s = self._write_free_at - time.monotonic()
                    if rest_s > 0:
                        wait_s = rest_s  # leave the database's single write lock to others a while
                        continue
                now_mono = time.monotonic()
                now = runtime.clock.now_ms()
                with self._lock:
                    named, self._named, self._offered = self._named, False, 0
                    self._claiming = want if refill else 0
                # A notification naming this queue means a job was just queued: claim without
                # probing first. Otherwise probe with a read, so an idle poll takes no write lock.
                probed_due = False
                if refill and probe and not pending and not named:
                    due = self.gate.next_due(now)
                    probed_due = due is not None and due <= now
                    if due is None or due > now:
                        if runtime.burst:
                            if self.held() == 0:
                                break
                            continue
                        poll_ms = runtime.poll_s * 1000
                        wait_s = max(poll_ms if due is None else min(due - now, poll_ms), 1) / 1000
                        continue
                # A flush tops the buffer up too: one transaction both records and claims.
                sharing = self._serialized and time.monotonic() < self._sharing_until
                if sharing:
                    want = min(want, SERIALIZED_CLAIM_MAX)
                # Checked after the claim's time was read: no lease this process holds has expired at it.
                refill = refill and runtime.book.may_claim(time.monotonic())
                limit = runtime.claim_budget(want) if refill and want > 0 else 0
                write_started = time.monotonic()
                jobs = self._record_completions(self._take_completions(), [limit, now] if limit else [])
                if sharing:
                    finished_at = time.monotonic()
                    self._write_free_at = finished_at + (finished_at - write_started) * SERIALIZED_GAP_FACTOR
                runtime.unclaimed(limit - len(jobs))
                if limit:
                    probe = len(jobs) < limit
                    self.gate.claimed(short=len(jobs) < limit)
                    if self.gate.learn(found_none=not jobs and (probed_due or named)) and not jobs:
                        wait_s = 0  # claim again, now through the limited claim
                        continue
                if jobs:
                    self._enter(jobs, now_mono)
                    wait_s = runtime.poll_s
                if self._completions:
                    wait_s = COMPLETION_HOLD_MS / 1000
                elif named and not jobs:
                    wait_s = 0  # another worker was quicker: probe now for the next due time
                elif runtime.burst and probe and self.held() == 0:
                    wait_s = 0  # the last claim came back short and nothing is held: probe now, and end if none is due
        except BaseException as error:
            logger.exception("durq: the dispatcher of queue %r stopped on an unexpected error", self.queue)
            runtime.fail("dispatcher failure", error)
        finally:
            wakeup.unsubscribe(self.queue, self._wake)
            self._hand_back(everything=True)
            while self.busy() > 0:
                self.kick.wait(0.05)
                self.kick.clear()
                self.flush_completions()
            self.flush_completions()
            with self._has_ready:
                self._closing = True
                self._has_ready.notify_all()
            connections.close_all()  # this thread's: the server sees the session end, not a dropped socket
            self.finished.set()
            runtime.wake_main()

    def _enter(self, jobs: list[ClaimedJob], claimed_mono: float) -> None:
        """Make claimed jobs attempts: into the book (so their leases are kept), then the buffer."""
        runtime = self.runtime
        attempts = []
        for job in jobs:
            ctx = JobContext(
                job,
                worker_id=runtime.worker_id,
                store=runtime.store,
                clock=runtime.clock,
                shutdown=runtime.shutdown,
                stop_cause=runtime.stop_cause,
                claimed_mono=claimed_mono,
                presence_held_since=runtime.presence_held_since,
            )
            attempts.append(Attempt(job, ctx, self))
        runtime.book.add(attempts)
        if any(job.lease_ms < 3 * self._heartbeat_ms for job in jobs):
            runtime.keeper_kick()  # renewals of so short a lease are due before the next heartbeat
        with self._has_ready:
            self.pause_guard.saw_active(claimed_mono)  # the claim that took them read the queue not paused
            self._ready.extend(attempts)
            self._has_ready.notify(len(attempts))

    def _sharing(self) -> bool:
        """Whether another connection wrote to the database lately (SQLite's ``data_version`` moved)."""
        try:
            if self._read_version is None:
                self._read_version = self.runtime.store.dialect.data_version_reader()  # type: ignore[attr-defined]
            version = self._read_version()
        except Exception:  # noqa: BLE001 - the connection was replaced; read through Django this once
            self._read_version = None
            version = self.runtime.store.retrying("data version", lambda d: d.data_version())  # type: ignore[attr-defined]
        now = time.monotonic()
        if self._seen_version is not None and version != self._seen_version:
            self._sharing_until = now + SHARING_S
        self._seen_version = version
        return now < self._sharing_until

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

    def _defer_completion(self, job: ClaimedJob, ctx: JobContext, completion: Completion) -> None:
        # Taken up by the slot's next _next_job(), inside the lock it takes anyway.
        self._finished_results[ctx.lease] = completion

    def _take_completions(self) -> list[Attempt]:
        with self._lock:
            taken, self._completions = self._completions, []
        return taken

    def flush_completions(self) -> None:
        """Record every finished job still held in memory (at shutdown; the dispatcher does it as it goes)."""
        completions = self._take_completions()
        if completions or len(self.places):
            self._record_completions(completions, [])

    def _prepare_connection(self) -> None:
        """Tune the dispatcher's connection once per driver connection (again after a reconnect)."""
        wrapper = connections[self.runtime.settings.database]
        driver = wrapper.connection
        if driver is None or driver is not self._prepared_for:
            self.runtime.store.retrying("prepare connection", lambda d: d.prepare_dispatcher_connection())
            self._prepared_for = wrapper.connection

    def _record_completions(self, completions: list[Attempt], claim: list[int]) -> list[ClaimedJob]:
        """Delete finished jobs and, when ``claim`` is ``[limit, now_ms]``, claim more in the same transaction.

        A completion counts (stats, log, ``job_finished``) only when this attempt's own fenced
        delete removed the row. A row already gone was completed by another attempt — unless the
        delete had to be retried after a lost connection while this attempt's lease was still
        confirmed, in which case the first try committed it.
        """
        runtime = self.runtime
        self._prepare_connection()
        limit, now = claim if claim else (0, 0)
        limits = self.gate.claim_limits
        # A limited claim reads the time again once it has its turn: never past the book's bound.
        clock = runtime.clock if limits is None else runtime.book.claim_clock(runtime.clock)
        outlook = self.gate.claim_outlook
        # Handlers that returned: their places under limits are freed in the transaction that claims next.
        free = [attempt.lease for attempt in completions if attempt.job.placed] + self.places.take()
        if not completions:
            if free:
                self.places.free(free)
            if limit <= 0:
                return []
            return runtime.store.claim(self.queue, limit, now, runtime.worker_id, limits, clock, outlook)
        leases = [attempt.lease for attempt in completions if attempt.finished_ms is None]
        kept = [(a.lease, a.finished_ms, a.stored) for a in completions if a.finished_ms is not None]
        first_try = time.monotonic()
        tries = 0

        def complete_and_claim(dialect: Dialect) -> tuple[set[Lease], list[ClaimedJob]]:
            nonlocal tries
            tries += 1
            hooks.jitter("complete")
            return dialect.complete_and_claim(
                leases, self.queue, limit, now, runtime.worker_id, kept, limits, clock, free, outlook
            )

        try:
            try:
                done, jobs = runtime.store.retrying("complete", complete_and_claim)
            except Exception:
                self.places.keep(free)  # the handlers have returned all the same
                raise
            missing = [attempt for attempt in completions if attempt.lease not in done]
            if missing and tries > 1:
                # The first try may have committed before its answer was lost: a deleted row is
                # gone, a kept one is finished under this attempt's own token.
                finished_here = runtime.store.retrying(
                    "check completions", lambda d: d.finished_leases([a.lease for a in missing])
                )
                present = runtime.store.retrying("check completions", lambda d: d.existing_ids([a.job.id for a in missing]))
                done |= finished_here
                done |= {
                    a.lease
                    for a in missing
                    if a.finished_ms is None and a.job.id not in present and a.ctx.confirmed_until > first_try
                }
            self.executor.settle_ends([a.job for a in completions if a.lease in done])
            self.executor.finished_many([(a.job, a.ctx, a.result) for a in completions if a.lease in done])
            for attempt in completions:
                if attempt.lease not in done and not self.executor.end_cancelled(attempt.job, attempt.ctx):
                    logger.warning(
                        "durq: job %s (%s) finished after its lease was lost; the completion was ignored",
                        attempt.job.id,
                        attempt.job.name,
                        extra=log_extra(attempt.job),
                    )
        finally:
            runtime.book.remove_many(completions)
        return jobs

    def bury_expired(self, now: int) -> int:
        """Jobs whose worker died on their last attempt become dead letters (no claim can take them).

        An attempt this process still holds is not one of them, however late its renewal.
        """
        runtime = self.runtime
        if not self.gate.lost_possible(now, fresh_s=2 * runtime.poll_s):
            return 0
        expired = runtime.store.retrying("scan expired", lambda d: d.expired_final_attempts(self.queue, now))
        buried = 0
        for job_id, token, name, attempts, errors, holder in expired:
            if runtime.book.holds((job_id, token)):
                continue  # its handler runs here, only its renewal is late: never a lost worker's
            buried += self.executor.bury_lost(self.queue, (job_id, token), name, attempts, errors, holder) == DEAD
        return buried

    # --- slots -------------------------------------------------------------------------------

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
            while not self._ready or runtime.stop_claiming.is_set():
                if self._closing:
                    return None
                self.kick.set()  # a free slot (and maybe a completion): the dispatcher may act
                self._has_ready.wait()
            attempt = self._ready.popleft()
            attempt.state = RUNNING
            self._busy += 1
            self._running.add(attempt)
            left = len(self._ready)
        if flush or left == 0 or left == self._low_water:
            self.kick.set()  # completions to record, or the buffer needs refilling
        return attempt

    def _may_start(self, attempt: Attempt) -> bool:
        """Whether the slot may start ``attempt`` (see ``pause_guard.py``); if its queue is paused, the
        attempt and every buffered one are handed back, attempts not counted.
        """
        if self.pause_guard.may_start():
            return True
        with self._lock:
            self._running.discard(attempt)
            self._busy -= 1
        self._release_unstarted([attempt])
        self._hand_back(everything=True)
        logger.info("durq: queue %r is paused; its jobs claimed ahead were handed back", self.queue)
        self.kick.set()
        return False

    def _work(self) -> None:
        runtime = self.runtime
        idle_since = 0.0
        slot_connections = SlotConnections()
        attempt: Attempt | None = None
        while True:
            attempt = self._next_job(attempt)
            if attempt is None:
                break
            if not self._may_start(attempt):
                attempt = None  # handed back: nothing to retire
                continue
            started = time.monotonic()
            if started - idle_since > IDLE_CHECK_S:
                slot_connections.after_idle()
            outcome = "error"
            try:
                outcome = self.executor.run(attempt.job, attempt.ctx)
            except BaseException:  # the database stayed down past every retry
                logger.exception(
                    "durq: could not record the outcome of job %s (%s); its lease will expire",
                    attempt.job.id,
                    attempt.job.name,
                    extra=log_extra(attempt.job),
                )
            # The handler has returned; unless a completion carries its place, free that now (or at the next write).
            if attempt.job.placed and attempt.lease not in self._finished_results and not self.places.free([attempt.lease]):
                self.kick.set()
            slot_connections.tidy()
            idle_since = time.monotonic()
            took = idle_since - started
            mean = self._mean_job_s
            self._mean_job_s = took if mean is None else mean + (took - mean) / 8
            if outcome != ABANDONED:
                runtime.job_done(outcome)
        connections.close_all()  # the slot's, handlers' own included

    def reap_timeouts(self) -> None:
        """Fail attempts that ran past their timeout and give their slot to a fresh thread.

        Python cannot kill a thread: the hung handler keeps running, but its later writes are
        fenced off, and the pool keeps its full number of working slots.
        """
        for attempt in self.running():
            overdue_s = attempt.ctx.overdue_by_s()
            if overdue_s is None or overdue_s * 1000 < TIMEOUT_GRACE_MS or attempt.ctx.settled:
                continue
            with self._lock:
                if attempt.abandoned or attempt not in self._running:
                    continue
                attempt.abandoned = True
                self._running.discard(attempt)
                self._busy -= 1
            hooks.jitter("reap")
            try:
                self.executor.record_timeout(attempt.job, attempt.ctx)
            finally:
                self.runtime.book.remove(attempt)
                self._add_thread()
                self.kick.set()
