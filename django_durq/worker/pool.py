"""A bounded pool for one named queue: a dispatcher thread that claims, slot threads that run.

The dispatcher claims jobs into a small ready buffer and slots take them from it. With
``PREFETCH`` at 0 a pool claims no more than its free slots. Otherwise it may claim ahead as
many jobs as its slots are expected to start within ``PREFETCH`` seconds, judged by the pool's
own recent job durations: short jobs are claimed hundreds at a time, while jobs that take
longer than the horizon are never held back from another worker. Buffered jobs are leased and
heartbeated like running ones, and handed back, attempt uncounted, at shutdown.

Finished jobs are deleted in batches, in the same transaction as the next claim: a finished
job waits in memory at most ``COMPLETION_HOLD_MS`` (or until ``FLUSH_BATCH`` of them have
piled up); a crash in that window runs it again once its lease expires (at-least-once).

An idle dispatcher probes with a read before it claims, so an idle poll on SQLite takes no
write lock, and sleeps until it is kicked (an enqueue, another process's commit, a freed
slot) or the poll interval runs out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .. import wakeup
from ..context import JobContext
from ..db import ClaimedJob
from ..executor import Executor, Failure

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


_UNFINISHED = object()


class Running:
    def __init__(self, job: ClaimedJob, ctx: JobContext) -> None:
        self.job = job
        self.ctx = ctx
        self.abandoned = False


class Pool:
    def __init__(self, queue: str, concurrency: int, runtime: Runtime) -> None:
        self.queue = queue
        self.concurrency = concurrency
        self.runtime = runtime
        self.prefetch_ms = runtime.settings.prefetch_ms(queue)
        self.kick = threading.Event()
        self.finished = threading.Event()  # the dispatcher has stopped and every slot is idle
        self._lock = threading.Lock()
        self._has_ready = threading.Condition(self._lock)
        self._ready: deque[ClaimedJob] = deque()  # claimed, not started
        self._cancel_before_start: set[int] = set()
        self._closing = False
        self._busy = 0
        self._threads: list[threading.Thread] = []
        self._running: dict[int, Running] = {}
        self._completions: list[tuple[ClaimedJob, Any]] = []
        self._finished_results: dict[int, Any] = {}  # job id -> result, until the slot retires it
        self._completions_since = 0.0
        # Mean handler time per job (seconds), smoothed; decides how far ahead to claim.
        self._mean_job_s: float | None = None
        self._low_water = 0  # a slot that leaves this many buffered jobs kicks the dispatcher
        self._named = False  # a wake-up named this queue since the dispatcher last looked
        self._serialized = runtime.store.dialect.serialized_writes
        self._write_free_at = 0.0  # monotonic time before which the dispatcher leaves the write lock alone
        self._sharing_until = 0.0  # another connection wrote lately: share the write lock until then
        self._seen_version: int | None = None
        self._read_version: Callable[[], int] | None = None  # PRAGMA data_version on the dispatcher's connection
        self._prepared_for: object = None  # the driver connection prepare_dispatcher_connection() tuned
        self.executor = Executor(
            runtime.store,
            runtime.settings,
            runtime.clock,
            runtime.worker_id,
            count=runtime.count,
            defer_completion=self._defer_completion,
        )
        self._dispatcher = threading.Thread(target=self._dispatch, name=f"durq-{queue}-dispatch", daemon=True)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        wakeup.subscribe(self.queue, self._wake)
        for _ in range(self.concurrency):
            self._add_thread()
        self._dispatcher.start()

    def _wake(self, named: bool) -> None:
        """Called by ``wakeup``; ``named`` when a notification named this queue (a job was queued)."""
        if named:
            self._named = True
        self.kick.set()

    def _add_thread(self) -> None:
        thread = threading.Thread(target=self._work, name=f"durq-{self.queue}-{len(self._threads)}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def running(self) -> list[Running]:
        with self._lock:
            return list(self._running.values())

    def busy(self) -> int:
        with self._lock:
            return self._busy

    def held(self) -> int:
        """Jobs this pool holds a lease on and has not finished: running plus buffered."""
        with self._lock:
            return self._busy + len(self._ready)

    def buffered_leases(self) -> list[tuple[int, int]]:
        with self._lock:
            return [(job.id, job.claim_token) for job in self._ready]

    def apply_buffer_renewal(self, asked: set[int], held: dict[int, bool]) -> None:
        """Drop buffered jobs whose lease is gone; cancel before they start those an operator stopped.

        ``asked`` holds the ids whose renewal ``held`` answers; jobs claimed since are left alone.
        """
        with self._lock:
            kept: deque[ClaimedJob] = deque()
            for job in self._ready:
                if job.id not in asked:
                    kept.append(job)
                    continue
                if job.id not in held:
                    logger.warning("durq: buffered job %s lost its lease before it started; dropped", job.id)
                    continue
                if held[job.id]:
                    self._cancel_before_start.add(job.id)
                kept.append(job)
            self._ready = kept

    # --- dispatcher ----------------------------------------------------------------------------

    def _target(self) -> int:
        """How many jobs to hold: one per slot, plus those the slots should start within the horizon."""
        mean = self._mean_job_s
        if not self.prefetch_ms or mean is None:
            return self.concurrency
        ahead = self.concurrency * self.prefetch_ms / 1000 / max(mean, 1e-6)
        return self.concurrency + min(MAX_AHEAD, int(ahead))

    def _dispatch(self) -> None:
        runtime = self.runtime
        probe = True
        wait_s = 0.0
        try:
            while not runtime.stop_claiming.is_set():
                if wait_s > 0:
                    self.kick.wait(wait_s)
                    if runtime.stop_claiming.is_set():
                        break  # stopped while waiting: claim nothing more, not even a job just handed back
                self.kick.clear()
                wait_s = runtime.poll_s
                with self._lock:
                    held = self._busy + len(self._ready)
                    ready = len(self._ready)
                    pending = len(self._completions)
                    held_for_s = time.monotonic() - self._completions_since
                target = self._target()
                want = target - held
                # Refill once the buffer is half used (at once when it only covers free slots).
                self._low_water = (target - self.concurrency) // 2
                refill = want > 0 and ready <= self._low_water
                flush = pending > 0 and (pending >= FLUSH_BATCH or held_for_s * 1000 >= COMPLETION_HOLD_MS or refill)
                if not refill and not flush:
                    if pending:
                        wait_s = max(COMPLETION_HOLD_MS / 1000 - held_for_s, 0.0005)
                    continue
                if self._serialized and self._sharing():
                    rest_s = self._write_free_at - time.monotonic()
                    if rest_s > 0:
                        wait_s = rest_s  # leave the database's single write lock to others a while
                        continue
                now = runtime.clock.now_ms()
                named, self._named = self._named, False
                # A notification naming this queue means a job was just queued: claim without
                # probing first. Otherwise probe with a read, so an idle poll takes no write lock.
                if refill and probe and not pending and not named:
                    waiting_due, lease_due = runtime.store.due_times(self.queue)
                    due = min((t for t in (waiting_due, lease_due) if t is not None), default=None)
                    if due is None or due > now:
                        if runtime.burst:
                            if self.held() == 0:
                                break
                            continue
                        poll_ms = runtime.settings.poll_interval_ms
                        wait_s = max(poll_ms if due is None else min(due - now, poll_ms), 1) / 1000
                        continue
                    if lease_due is not None and lease_due <= now:
                        self._bury_expired(now)
                # A flush tops the buffer up too: one transaction both records and claims.
                sharing = self._serialized and time.monotonic() < self._sharing_until
                if sharing:
                    want = min(want, SERIALIZED_CLAIM_MAX)
                limit = runtime.claim_budget(want) if want > 0 else 0
                write_started = time.monotonic()
                jobs = self._record_completions(self._take_completions(), [limit, now] if limit else [])
                if sharing:
                    finished_at = time.monotonic()
                    self._write_free_at = finished_at + (finished_at - write_started) * SERIALIZED_GAP_FACTOR
                runtime.unclaimed(limit - len(jobs))
                if limit:
                    probe = len(jobs) < limit
                if jobs:
                    with self._has_ready:
                        self._ready.extend(jobs)
                        self._has_ready.notify(len(jobs))
                    wait_s = runtime.poll_s
                if self._completions:
                    wait_s = COMPLETION_HOLD_MS / 1000
                elif named and not jobs:
                    wait_s = 0  # another worker was quicker: probe now for the next due time
        except BaseException:
            logger.exception("durq: the dispatcher of queue %r stopped on an unexpected error", self.queue)
            runtime.request_stop("dispatcher failure")
        finally:
            wakeup.unsubscribe(self.queue, self._wake)
            self._hand_back_buffer()
            while self.busy() > 0:
                self.kick.wait(0.05)
                self.kick.clear()
                self.flush_completions()
            self.flush_completions()
            with self._has_ready:
                self._closing = True
                self._has_ready.notify_all()
            self.finished.set()

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

    def _hand_back_buffer(self) -> None:
        """Buffered jobs never started: release them for other workers, the attempt not counted."""
        with self._lock:
            leases = [(job.id, job.claim_token) for job in self._ready]
            self._ready.clear()
        if not leases:
            return
        runtime = self.runtime
        try:
            released = runtime.store.retrying("release", lambda d: d.release(leases))
        except Exception:  # their leases expire; no job is lost
            logger.exception("durq: could not hand back %d buffered job(s); their leases will expire", len(leases))
            return
        runtime.unclaimed(len(leases))
        logger.info("durq: handed back %d buffered job(s) of queue %r that had not started", released, self.queue)

    def _defer_completion(self, job: ClaimedJob, ctx: JobContext, result: Any) -> None:
        # Taken up by the slot's next _next_job(), inside the lock it takes anyway.
        self._finished_results[job.id] = result

    def _take_completions(self) -> list[tuple[ClaimedJob, Any]]:
        with self._lock:
            taken, self._completions = self._completions, []
        return taken

    def flush_completions(self) -> None:
        """Record every finished job still held in memory (at shutdown; the dispatcher does it as it goes)."""
        completions = self._take_completions()
        if completions:
            self._record_completions(completions, [])

    def _prepare_connection(self) -> None:
        """Tune the dispatcher's connection once per driver connection (again after a reconnect)."""
        wrapper = connections[self.runtime.settings.database]
        driver = wrapper.connection
        if driver is None or driver is not self._prepared_for:
            self.runtime.store.retrying("prepare connection", lambda d: d.prepare_dispatcher_connection())
            self._prepared_for = wrapper.connection

    def _record_completions(self, completions: list[tuple[ClaimedJob, Any]], claim: list[int]) -> list[ClaimedJob]:
        """Delete finished jobs and, when ``claim`` is ``[limit, now_ms]``, claim more in the same transaction."""
        runtime = self.runtime
        self._prepare_connection()
        leases = [(job.id, job.claim_token) for job, _ in completions]
        limit, now = claim if claim else (0, 0)
        if not leases:
            return runtime.store.claim(self.queue, limit, now, runtime.worker_id) if limit > 0 else []
        done, jobs = runtime.store.retrying(
            "complete", lambda d: d.complete_and_claim(leases, self.queue, limit, now, runtime.worker_id)
        )
        missing = [job.id for job, _ in completions if job.id not in done]
        if missing:
            # A retried delete matches nothing when the first try committed but its answer was
            # lost with the connection. A row that is gone is finished either way; only a row
            # still there (re-claimed under a newer token) means our lease was lost.
            present = runtime.store.retrying("check completions", lambda d: d.existing_ids(missing))
            done = done | (set(missing) - present)
        self.executor.finished_many([(job, result) for job, result in completions if job.id in done])
        for job, _ in completions:
            if job.id not in done:
                logger.warning(
                    "durq: job %s (%s) finished after its lease was lost; the completion was ignored", job.id, job.name
                )
        return jobs

    def _bury_expired(self, now: int) -> None:
        """Jobs whose worker died on their last attempt become dead letters (no claim can take them)."""
        runtime = self.runtime
        expired = runtime.store.retrying("scan expired", lambda d: d.expired_final_attempts(self.queue, now))
        for job_id, token, name, attempts, errors, holder in expired:
            self.executor.bury_lost(self.queue, (job_id, token), name, attempts, errors, holder)

    # --- slots -------------------------------------------------------------------------------

    def _next_job(self, finished: Running | None) -> Running | None:
        """Retire the slot's finished job and take the next buffered one; None when this thread should end.

        One critical section does both, as this runs once per job. A job an operator cancelled
        while it waited in the buffer starts with its stop request set, and is never run.
        """
        runtime = self.runtime
        flush = False
        with self._has_ready:
            if finished is not None:
                self._running.pop(finished.job.id, None)
                result = self._finished_results.pop(finished.job.id, _UNFINISHED)
                if finished.abandoned:
                    return None  # a replacement thread already took this slot
                self._busy -= 1
                if result is not _UNFINISHED:
                    self._completions.append((finished.job, result))
                    pending = len(self._completions)
                    if pending == 1:
                        self._completions_since = time.monotonic()
                    flush = pending == 1 or pending == FLUSH_BATCH
            # Once claiming stops, buffered jobs are no longer started: the dispatcher hands them back.
            while not self._ready or runtime.stop_claiming.is_set():
                if self._closing:
                    return None
                self.kick.set()  # a free slot (and maybe a completion): the dispatcher may act
                self._has_ready.wait()
            job = self._ready.popleft()
            self._busy += 1
            left = len(self._ready)
            ctx = JobContext(
                job, worker_id=runtime.worker_id, store=runtime.store, clock=runtime.clock, shutdown=runtime.shutdown
            )
            if self._cancel_before_start and job.id in self._cancel_before_start:
                self._cancel_before_start.discard(job.id)
                ctx.stop_requested = True
            entry = self._running[job.id] = Running(job, ctx)
        if flush or left == 0 or left == self._low_water:
            self.kick.set()  # completions to record, or the buffer needs refilling
        return entry

    def _work(self) -> None:
        runtime = self.runtime
        idle_since = 0.0
        slot_connections = SlotConnections()
        entry: Running | None = None
        while True:
            entry = self._next_job(entry)
            if entry is None:
                break
            started = time.monotonic()
            if started - idle_since > IDLE_CHECK_S:
                slot_connections.after_idle()
            outcome = "error"
            try:
                outcome = self.executor.run(entry.job, entry.ctx)
            except BaseException:  # the database stayed down past every retry
                logger.exception("durq: could not record the outcome of job %s; its lease will expire", entry.job.id)
            slot_connections.tidy()
            idle_since = time.monotonic()
            took = idle_since - started
            mean = self._mean_job_s
            self._mean_job_s = took if mean is None else mean + (took - mean) / 8
            if not entry.abandoned:
                runtime.job_done(outcome)

    def reap_timeouts(self, now: int) -> None:
        """Fail attempts that ran past their timeout and give their slot to a fresh thread.

        Python cannot kill a thread: the hung handler keeps running, but its later writes are
        fenced off, and the pool keeps its full number of working slots.
        """
        for entry in self.running():
            ctx = entry.ctx
            if entry.abandoned or ctx.deadline_ms is None or now < ctx.deadline_ms + TIMEOUT_GRACE_MS:
                continue
            with self._lock:
                if entry.abandoned or entry.job.id not in self._running:
                    continue
                entry.abandoned = True
                self._running.pop(entry.job.id, None)
                self._busy -= 1
            timeout_s = (entry.job.timeout_ms or 0) / 1000
            failure = Failure("timeout", f"timed out after {timeout_s:g} s; the handler did not return")
            self.executor.record_failure(entry.job, ctx, failure)
            self._add_thread()
            self.kick.set()


class SlotConnections:
    """One slot thread's database connections, kept in hand between jobs.

    Asking Django's thread-local for each connection after every job costs more than a short
    job itself, so a slot looks the wrappers up once (no connection is opened by that) and
    again after it has been idle. Wrappers outlive ``close()``: Django reconnects them on use.
    """

    def __init__(self) -> None:
        self.wrappers: list[BaseDatabaseWrapper] = []

    def after_idle(self) -> None:
        """Close connections the server dropped while this slot was idle, before a handler gets them.

        A server restart, a failover or ``idle_session_timeout`` kills idle connections; without
        this check the next handler on every slot would fail its attempt on its first query.
        """
        self.wrappers = [connections[alias] for alias in connections]
        for connection in self.wrappers:
            if connection.connection is not None and not connection.in_atomic_block and not connection.is_usable():
                connection.close()

    def tidy(self) -> None:
        """Drop connections a handler broke or left inside a transaction; keep healthy ones open.

        Unlike ``close_old_connections()``, a healthy connection survives between jobs even with
        ``CONN_MAX_AGE = 0``: reconnecting for every job would cost more than most jobs.
        """
        for connection in self.wrappers:
            if connection.connection is None:
                continue
            if connection.in_atomic_block:
                logger.warning("durq: a handler left a transaction open on %r; rolling it back", connection.alias)
                connection.close()
            elif connection.errors_occurred and not connection.is_usable():
                connection.close()
            elif connection.close_at is not None and connection.settings_dict["CONN_MAX_AGE"]:
                connection.close_if_unusable_or_obsolete()
