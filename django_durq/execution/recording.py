"""Record an attempt's outcome, once: a timeout, a hand-back, a cancel, an expiry or a job of an unknown type."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import InterfaceError, OperationalError

from ..conf import DurqSettings, hooks
from ..db import ClaimedJob, counters, wakeup
from ..db.dependencies import settle
from ..db.expiry import end_claimed, expiry_message
from ..handlers.context import HAND_BACK_REASONS, LEASE_LOST, TIMED_OUT, JobContext
from ..handlers.registry import JobDefinition, registry
from .handler_call import HandlerCall, reclaim_connection
from .outcomes import (
    ABANDONED,
    CANCELLED_OUTCOME,
    EXPIRED,
    LOST,
    MAX_MESSAGE_CHARS,
    MAX_TRACEBACK_CHARS,
    RELEASED,
    UNKNOWN_TYPE,
    Failure,
    _safe_str,
    _traceback,
    _type_path,
    error_list,
    jobs_log,
    log_extra,
)
from .text import clip, clip_start
from .unknown_types import UnknownTypes

logger = logging.getLogger("django_durq")


class Recording(HandlerCall):
    """Every outcome of an attempt but a finish and a failure (a part of :class:`~.executor.Executor`)."""

    # Set by Executor.__init__.
    settings: DurqSettings
    worker_id: str
    count: Callable[..., None]
    hooks_enabled: bool
    unknown_types: UnknownTypes

    if TYPE_CHECKING:  # the executor's own outcomes (executor.py)

        def _finish(
            self, job: ClaimedJob, ctx: JobContext, definition: JobDefinition | None, result: Any, errors: list[dict[str, Any]]
        ) -> str: ...

        def _fail(
            self,
            job: ClaimedJob,
            ctx: JobContext,
            definition: JobDefinition | None,
            failure: Failure,
            errors: list[dict[str, Any]],
        ) -> str: ...

    def record(
        self,
        job: ClaimedJob,
        ctx: JobContext,
        failure: Failure | None,
        result: Any,
        errors: list[dict[str, Any]],
        definition: JobDefinition | None = None,
    ) -> str:
        """Record this attempt's outcome, unless another recorder (a timeout) already settled it.

        Whatever goes wrong while deciding or writing the outcome — a bad ``Retry(after=...)``,
        a result that is not JSON, a value the database refuses — becomes a failed attempt with
        that error recorded. Only a database that stays unreachable leaves the job to its lease.
        """
        if not ctx.settle():
            logger.warning(
                "durq: job %s (%s) returned after its attempt was settled (timed out or handed back); its outcome is discarded",
                job.id,
                job.name,
                extra=log_extra(job),
            )
            return ABANDONED
        reclaim_connection(self._connection(), getattr(self._local, "before_handler", (0, True)))
        hooks.jitter("outcome")
        if self.hooks_enabled:
            hooks.reach("before_complete", job.id)
        try:
            return self._record(job, ctx, failure, result, errors, definition or registry.get(job.name))
        except (OperationalError, InterfaceError):
            raise
        except Exception as error:
            logger.exception("durq: could not record the outcome of job %s (%s)", job.id, job.name, extra=log_extra(job))
            failed = Failure(
                "outcome", f"could not record the outcome: {_safe_str(error)}", _type_path(error), _traceback(error), error=error
            )
            return self._fail(job, ctx, registry.get(job.name), failed, errors)

    def _record(
        self,
        job: ClaimedJob,
        ctx: JobContext,
        failure: Failure | None,
        result: Any,
        errors: list[dict[str, Any]],
        definition: JobDefinition | None,
    ) -> str:
        reason = ctx.stop_reason()
        if failure is None and reason == TIMED_OUT:
            failure = Failure("timeout", f"timed out after {(job.timeout_ms or 0) / 1000:g} s")
        if reason == LEASE_LOST:
            logger.warning(
                "durq: job %s (%s) lost its lease while running; its outcome is discarded", job.id, job.name, extra=log_extra(job)
            )
            return LOST
        if ctx.stop_requested:
            return self._cancel(job, ctx, errors)
        if failure is None and ctx.stop_seen and (reason in HAND_BACK_REASONS or ctx.seen_reason in HAND_BACK_REASONS):
            # The handler returned because it was told to: it may not have done all its work.
            return self.hand_back(job, ctx, errors)
        if failure is None:
            return self._finish(job, ctx, definition, result, errors)
        return self._fail(job, ctx, definition, failure, errors)

    def record_timeout(self, job: ClaimedJob, ctx: JobContext) -> str:
        """Fail the attempt from outside the handler's thread (a timeout the handler ignored)."""
        timeout_s = (job.timeout_ms or 0) / 1000
        failure = Failure("timeout", f"timed out after {timeout_s:g} s; the handler did not return")
        if not ctx.settle():
            return ABANDONED
        return self._fail(job, ctx, registry.get(job.name), failure, error_list(job.errors))

    def _unknown(self, job: ClaimedJob, ctx: JobContext, errors: list[dict[str, Any]]) -> str:
        """A job whose type this process has no handler for: handed back for a worker that has one.

        Its attempt is not counted; once no worker that claimed it had a handler for
        ``UNKNOWN_TYPE_LIMIT_MS``, it is a dead letter saying so.
        """
        if not ctx.settle():
            return ABANDONED
        if ctx.stop_requested:
            return self._cancel(job, ctx, errors)
        verdict = self.unknown_types.judge(job, errors)
        if verdict.failure_message is not None:
            failure = Failure("unknown_job", verdict.failure_message, final=True)
            return self._fail(job, ctx, None, failure, errors)
        handed = counters.ended(job, counters.HANDED_BACK)
        if not self.store.retrying(
            "hand back", lambda d: counters.counted(d, handed, lambda: self.unknown_types.hand_back(d, job, ctx, verdict))
        ):
            return LOST
        self.count(job.queue, UNKNOWN_TYPE)
        self.settle_ends([job])  # an operator's cancel makes the hand-back an end
        return UNKNOWN_TYPE

    def hand_back(self, job: ClaimedJob, ctx: JobContext, errors: list[dict[str, Any]]) -> str:
        """Give a started job back for another worker, its attempt not counted.

        Each hand-back of a started job counts: after ``MAX_HANDBACKS`` of them (a job that
        always outlives the shutdown grace, or always trips --max-memory) it becomes a dead
        letter saying so, instead of being handed back forever.
        """
        handbacks = job.handbacks + 1
        if handbacks >= self.settings.max_handbacks:
            detail = ctx.stop_detail() or "stopping"
            failure = Failure(
                "handed_back",
                f'handed back {handbacks} times without finishing (last: {detail}); DURQ["MAX_HANDBACKS"] is '
                f"{self.settings.max_handbacks}",
                final=True,
            )
            return self._fail(job, ctx, registry.get(job.name), failure, errors)
        hooks.jitter("release")
        handed = counters.ended(job, counters.HANDED_BACK)
        released = self.store.retrying(
            "release",
            lambda d: counters.counted(d, handed, lambda: d.release([ctx.lease], started=True, now_ms=self.clock.now_ms())),
        )
        if not released:
            return LOST
        self.settle_ends([job])  # an operator's cancel makes the hand-back an end
        self._wake(job.queue)
        if jobs_log.isEnabledFor(logging.INFO):
            detail = ctx.stop_detail() or "stopping"
            jobs_log.info("durq: job %s (%s) handed back (%s)", job.id, job.name, detail, extra=log_extra(job))
        return RELEASED

    def _cancel(self, job: ClaimedJob, ctx: JobContext, errors: list[dict[str, Any]]) -> str:
        errors.append(self._entry(job.attempts, Failure("cancelled", "stopped at an operator's request"), self.worker_id))
        now = self.clock.now_ms()
        rows = counters.ended(job, counters.CANCELLED)
        held = self.store.retrying(
            "cancel", lambda d: counters.counted(d, rows, lambda: d.cancel_running(ctx.lease, now, json.dumps(errors)))
        )
        if held:
            self.settle_ends([job])
        if held and jobs_log.isEnabledFor(logging.INFO):
            jobs_log.info("durq: job %s (%s) cancelled", job.id, job.name, extra=log_extra(job))
        return CANCELLED_OUTCOME if held else LOST

    def _expire(self, job: ClaimedJob, ctx: JobContext, errors: list[dict[str, Any]]) -> str:
        """End a job claimed after its expiry without running it; the claim's attempt is given back.

        The claim reads no expiry (the claim is the same for every job), so this is where "never
        started after its expiry" holds: no handler runs past this check, on the worker's clock
        (the database's, on PostgreSQL and MariaDB).
        """
        if not ctx.settle():
            return ABANDONED
        now = self.clock.now_ms()
        message = expiry_message(job.expires_ms or 0)
        errors.append(self._entry(job.attempts - 1, Failure("expired", message), self.worker_id))
        text = json.dumps(errors)
        rows = counters.ended(job, counters.CANCELLED)
        held = self.store.retrying("expire", lambda d: counters.counted(d, rows, lambda: end_claimed(d, ctx.lease, now, text)))
        if not held:
            return LOST
        self.settle_ends([job])  # what waits for it is cancelled (or released, with on_failure="run")
        jobs_log.info("durq: job %s (%s) %s -> cancelled", job.id, job.name, message, extra=log_extra(job))
        return EXPIRED

    def settle_ends(self, jobs: list[ClaimedJob]) -> None:
        """Count the ends of these jobs for the jobs that wait for them (``db/dependencies.py``).

        Right after the end's own commit; what fails here (the database went away, the process
        dies) the maintenance sweep counts instead, a moment later. A job still waiting (one
        that will be retried) has no end to count: its edges are left as they are.
        """
        self._settle_ids([job.id for job in jobs if job.dependents])

    def _settle_ids(self, ids: list[int]) -> None:
        if not ids:
            return
        hooks.jitter("settle")  # a worker stalled between an end's commit and its count
        now = self.clock.now_ms()
        try:
            self.store.retrying("settle", lambda d: settle(d, now, ids), give_up_after_s=5.0)
        except Exception:  # noqa: BLE001 - the sweep counts them
            logger.warning("durq: could not count the end of job(s) %s for their dependents; the sweep will", ids)

    def _wake(self, queue: str) -> None:
        """Tell idle workers, here and in other processes, that a job of ``queue`` is due now."""
        try:
            self.store.retrying("wake", lambda d: wakeup.wake_on_commit(self.store.alias, [queue]), give_up_after_s=1.0)
        except Exception:
            logger.debug("durq: could not wake other workers for queue %r", queue, exc_info=True)

    def _entry(self, attempt: int, failure: Failure, worker: str) -> dict[str, Any]:
        return {
            "attempt": attempt,
            "at_ms": self.clock.now_ms(),
            "worker": worker,
            "kind": failure.kind,
            "type": failure.type,
            "message": clip(failure.message, MAX_MESSAGE_CHARS),
            "traceback": clip_start(failure.traceback, MAX_TRACEBACK_CHARS),
        }
