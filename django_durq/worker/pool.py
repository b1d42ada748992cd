"""A bounded pool for one named queue: claim no more than the free slots, run each job in a thread.

The dispatcher thread probes with a read before it claims (on SQLite an idle poll then takes
no write lock), claims one batch of at most ``free`` jobs, and sleeps until it is kicked (an
enqueue, a freed slot, another process's commit) or the poll interval runs out.
"""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
from typing import TYPE_CHECKING, Any

from django.db import connections

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
        self.kick = threading.Event()
        self.finished = threading.Event()  # the dispatcher has stopped and every slot is idle
        self._inbox: queue_module.SimpleQueue[ClaimedJob | None] = queue_module.SimpleQueue()
        self._lock = threading.Lock()
        self._busy = 0
        self._threads: list[threading.Thread] = []
        self._running: dict[int, Running] = {}
        self._completions: list[tuple[ClaimedJob, Any]] = []
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
        wakeup.subscribe(self.queue, self.kick)
        for _ in range(self.concurrency):
            self._add_thread()
        self._dispatcher.start()

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

    # --- dispatcher ----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        runtime = self.runtime
        probe = True
        try:
            while not runtime.stop_claiming.is_set():
                self.kick.clear()
                free = self.concurrency - self.busy()
                completions = self._take_completions()
                if free <= 0:
                    if completions:
                        self._record_completions(completions, [])
                    else:
                        self.kick.wait(runtime.poll_s)
                    continue
                now = runtime.clock.now_ms()
                if probe and not completions:
                    due = runtime.store.next_due_ms(self.queue)
                    if due is None or due > now:
                        if runtime.burst:
                            if self.busy() == 0:
                                break
                            self.kick.wait(runtime.poll_s)
                            continue
                        poll_ms = runtime.settings.poll_interval_ms
                        wait_ms = poll_ms if due is None else min(due - now, poll_ms)
                        self.kick.wait(max(wait_ms, 1) / 1000)
                        continue
                    self._bury_expired(now)
                free = runtime.claim_budget(free)
                jobs = self._record_completions(completions, [free, now])
                runtime.unclaimed(free - len(jobs))
                probe = len(jobs) < free
                if jobs:
                    with self._lock:
                        self._busy += len(jobs)
                    for job in jobs:
                        self._inbox.put(job)
        except BaseException:
            logger.exception("durq: the dispatcher of queue %r stopped on an unexpected error", self.queue)
            runtime.request_stop("dispatcher failure")
        finally:
            wakeup.unsubscribe(self.queue, self.kick)
            while self.busy() > 0:
                self.kick.wait(0.05)
                self.kick.clear()
                self.flush_completions()
            self.flush_completions()
            for _ in self._threads:
                self._inbox.put(None)
            self.finished.set()

    def _defer_completion(self, job: ClaimedJob, ctx: JobContext, result: Any) -> None:
        # No kick here: the slot thread kicks once it has freed its slot, a moment later.
        with self._lock:
            self._completions.append((job, result))

    def _take_completions(self) -> list[tuple[ClaimedJob, Any]]:
        with self._lock:
            taken, self._completions = self._completions, []
        return taken

    def flush_completions(self) -> None:
        """Record every finished job still held in memory (at shutdown; the dispatcher does it as it goes)."""
        completions = self._take_completions()
        if completions:
            self._record_completions(completions, [])

    def _record_completions(self, completions: list[tuple[ClaimedJob, Any]], claim: list[int]) -> list[ClaimedJob]:
        """Delete finished jobs and, when ``claim`` is ``[limit, now_ms]``, claim more in the same transaction.

        Finished jobs wait here at most one dispatcher cycle (a few milliseconds); a crash in that
        window re-runs them once their lease expires, as at-least-once delivery allows.
        """
        runtime = self.runtime
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
        for job, result in completions:
            if job.id in done:
                self.executor.finished(job, result)
            else:
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

    def _work(self) -> None:
        runtime = self.runtime
        idle_since = 0.0
        while True:
            job = self._inbox.get()
            if job is None:
                break
            if time.monotonic() - idle_since > IDLE_CHECK_S:
                _drop_dead_connections()
            ctx = JobContext(
                job, worker_id=runtime.worker_id, store=runtime.store, clock=runtime.clock, shutdown=runtime.shutdown
            )
            entry = Running(job, ctx)
            with self._lock:
                self._running[job.id] = entry
            outcome = "error"
            try:
                outcome = self.executor.run(job, ctx)
            except BaseException:  # the database stayed down past every retry
                logger.exception("durq: could not record the outcome of job %s; its lease will expire", job.id)
            _tidy_connections()
            idle_since = time.monotonic()
            with self._lock:
                self._running.pop(job.id, None)
                if not entry.abandoned:
                    self._busy -= 1
            if entry.abandoned:
                return  # a replacement thread already took this slot
            runtime.job_done(outcome)
            self.kick.set()

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


def _drop_dead_connections() -> None:
    """Close connections the server dropped while this slot was idle, before a handler gets them.

    A server restart, a failover or ``idle_session_timeout`` kills idle connections; without this
    check the next handler on every slot would fail its attempt on its first query.
    """
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None and not connection.in_atomic_block and not connection.is_usable():
            connection.close()


def _tidy_connections() -> None:
    """Drop connections a handler broke or left inside a transaction; keep healthy ones open.

    Unlike ``close_old_connections()``, a healthy connection survives between jobs even with
    ``CONN_MAX_AGE = 0``: reconnecting for every job would cost more than most jobs.
    """
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            logger.warning("durq: a handler left a transaction open on %r; rolling it back", connection.alias)
            connection.close()
        elif connection.errors_occurred and not connection.is_usable():
            connection.close()
        elif connection.close_at is not None and connection.settings_dict["CONN_MAX_AGE"]:
            connection.close_if_unusable_or_obsolete()
