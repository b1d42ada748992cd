"""A pool's finished jobs: recorded in batches, in the transaction that claims next (see ``pool.py``)."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from django.db import connections

from ..conf import hooks
from ..db import ClaimedJob, Dialect, Lease, counters
from ..execution.executor import Executor
from ..execution.outcomes import DEAD, Completion, log_extra
from ..handlers.context import JobContext
from .attempt import Attempt
from .flow_gate import FlowGate
from .held_places import HeldPlaces

if TYPE_CHECKING:
    from .runtime import Runtime

logger = logging.getLogger("django_durq")

# The longest a finished job's delete waits in memory to share a transaction with others.
COMPLETION_HOLD_MS = 5
# Completions recorded at once at most; reaching it flushes before the hold is over.
FLUSH_BATCH = 256


class PoolCompletions:
    """Completions held in memory and their write (a part of :class:`~.pool.Pool`)."""

    # Set by Pool.__init__.
    queue: str
    runtime: Runtime
    _lock: threading.Lock
    _completions: list[Attempt]
    _finished_results: dict[Lease, Completion]
    _prepared_for: object
    gate: FlowGate
    places: HeldPlaces
    executor: Executor

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
        placed = [attempt.lease for attempt in completions if attempt.job.placed]
        free = self.places.take()
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
        ran = [(a.lease, a.job, a.ctx.started_mono) for a in completions]

        def count_batch(dialect: Dialect, done: set[Lease], jobs: list[ClaimedJob]) -> None:
            counters.completed(dialect, ran, done, jobs, now, time.monotonic())

        def complete_and_claim(dialect: Dialect) -> tuple[set[Lease], list[ClaimedJob]]:
            nonlocal tries
            tries += 1
            hooks.jitter("complete")
            return dialect.complete_and_claim(
                leases, self.queue, limit, now, runtime.worker_id, kept, limits, clock, free, outlook, count_batch, placed
            )

        try:
            try:
                done, jobs = runtime.store.retrying("complete", complete_and_claim)
            except Exception:
                self.places.keep(free + placed)  # the handlers have returned all the same
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
