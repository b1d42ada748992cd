"""Run one claimed job and record its outcome; never dies with the handler.

Any exception from a handler (``SystemExit`` and ``KeyboardInterrupt`` included) is a failed
attempt with its traceback; the job is retried with backoff or, after ``max_attempts``, kept
as a dead letter with every attempt's error. Every write is fenced by the claim token, so an
executor that lost its lease changes nothing.

What a handler could never run is decided before it is called (see ``execution/unknown_types.py``): a
job whose type this process has no handler for is handed back for another worker, attempt not
counted; one whose stored arguments do not fit the handler's signature is a dead letter at once.

The executor is in parts: the handler's call and the transaction it may leave open
(``handler_call.py``), the outcomes other than a finish or a failure (``recording.py``), and the
names and values an outcome is made of (``outcomes.py``). Here: the run, the finish, the failure.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

from ..clock import Clock
from ..conf import DurqSettings, hooks
from ..db import ClaimedJob, Dialect, counters, places
from ..db.store import Store
from ..exceptions import InvalidPayload
from ..handlers.context import JobContext
from ..handlers.payload import decode_arguments, encode_json
from ..handlers.registry import JobDefinition, registry
from ..signals import job_dead, job_finished, job_postrun, job_prerun, send, send_in_handler_thread
from . import tracing
from .handler_call import transaction_state
from .outcomes import (
    ABANDONED,
    CANCELLED_OUTCOME,
    DEAD,
    FINISHED,
    LOST,
    PAUSED,
    RETRYING,
    Completion,
    Failure,
    _announced,
    _exc_info,
    _iso,
    _safe_str,
    _send_each,
    _type_path,
    error_list,
    jobs_log,
    log_extra,
)
from .recording import Recording
from .unknown_types import UnknownTypes

logger = logging.getLogger("django_durq")


class Executor(Recording):
    """Runs attempts and records exactly one outcome for each (see ``JobContext.settle``)."""

    def __init__(
        self,
        store: Store,
        settings: DurqSettings,
        clock: Clock,
        worker_id: str,
        count: Callable[..., None] = lambda queue, outcome, n=1: None,
        defer_completion: Callable[[ClaimedJob, JobContext, Completion], None] | None = None,
        emit: Callable[..., None] = send,
        emit_many: Callable[[Signal, Any, list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.worker_id = worker_id
        self.count = count
        # A worker pool batches the deletes of finished jobs (see Pool.flush_completions).
        self.defer_completion = defer_completion
        # How signals are sent: a worker hands them to its events thread; tests send them inline.
        self.emit = emit
        self.emit_many = emit_many or _send_each
        self.hooks_enabled = settings.test_hooks_dir is not None
        # Per slot thread: its connection, and that connection's transaction state before the
        # handler ran (see reclaim_connection).
        self._local = threading.local()
        self._keep_finished: dict[str, int] = {}  # per queue; looked up for every finished job
        self.unknown_types = UnknownTypes(store, clock, worker_id)

    def run(self, job: ClaimedJob, ctx: JobContext, may_start: Callable[[], bool] | None = None) -> str:
        """Run one attempt to its outcome. ``may_start`` is asked as the last step before the handler's
        run (its signals and its call), after every wait and every step on the way (a lease to
        confirm, a lost lease's error to write, the arguments to decode): False, and the attempt
        ends ``PAUSED``, never started, for the caller to hand back.
        """
        if not ctx.wait_confirmed():
            # Lost while it waited in a buffer: never started, nothing to record; or settled meanwhile by another.
            return LOST if ctx.settle() else ABANDONED
        errors = error_list(job.errors)
        if job.reclaimed_from is not None:
            errors.append(
                self._entry(job.attempts - 1, Failure("lease_expired", "lease expired: worker lost"), job.reclaimed_from)
            )
            job.errors = json.dumps(errors)
            self.store.retrying("record lost lease", lambda d: d.record_errors(ctx.lease, job.errors))
        if self.hooks_enabled:
            hooks.reach("after_claim", job.id)

        if ctx.stop_requested:
            # Cancelled before it started (in a buffer, or before a hand-back): never run.
            return self.record(job, ctx, None, None, errors)
        if job.expires_ms is not None and job.expires_ms <= self.clock.now_ms():
            return self._expire(job, ctx, errors)
        connection = self._connection()
        self._local.before_handler = transaction_state(connection)
        definition = registry.get(job.name)
        result: Any = None
        failure: Failure | None = None
        if definition is None:
            return self._unknown(job, ctx, errors)
        try:
            args, kwargs = decode_arguments(job.arguments)
        except (ValueError, RecursionError) as error:
            failure = Failure("decode", f"payload decode error: {_safe_str(error)}", type=_type_path(error))
        else:
            unfit = definition.unfit_arguments(args, kwargs)
            if unfit is not None:
                # Bound before the call: a TypeError the handler raises itself stays an ordinary failure.
                failure = Failure("arguments", unfit, "TypeError", final=True)
            elif may_start is not None and not may_start():
                # Asked here, not before the steps above: a thread that stalls (a frozen process,
                # a long collection) between its answer and the handler must not start a job of a
                # queue paused meanwhile, and nothing is left to stall in but the run's signals.
                return PAUSED
            else:
                ctx.start()
                # In this thread, around the handler alone: a receiver may set up and tear down
                # what the handler's thread needs (docs/runtime.md, "Signals"). The run span, when
                # tracing is on, holds the handler and those receivers.
                traced = tracing.run_started(job.id, job.name, job.queue, ctx.attempt)
                raised: BaseException | None = None
                try:
                    if job_prerun.receivers:
                        send_in_handler_thread(job_prerun, Executor, None, log_extra(job), **_announced(job, ctx))
                    failure, result = self._call(definition, ctx, args, kwargs)
                    raised = failure.error if failure is not None else None
                    if job_postrun.receivers:
                        announced = _announced(job, ctx)
                        send_in_handler_thread(
                            job_postrun, Executor, raised, log_extra(job), result=result, error=raised, **announced
                        )
                finally:
                    if traced:
                        tracing.run_ended(raised)
        return self.record(job, ctx, failure, result, errors, definition)

    def bury_lost(self, queue: str, lease: tuple[int, int], name: str, attempts: int, errors_text: str, holder: str) -> str:
        """A job whose worker died on its last attempt: a dead letter saying so, if its lease is still expired.

        One an operator asked to stop ends cancelled instead. Either way its end is counted for
        the jobs that wait for it.
        """
        errors = json.loads(errors_text or "[]")
        errors.append(self._entry(attempts, Failure("lease_expired", "lease expired: worker lost"), holder))
        now = self.clock.now_ms()
        hooks.jitter("bury")

        def rows(ended: str | None) -> list[counters.Row]:
            metrics = (counters.CANCELLED,) if ended == "cancelled" else (counters.FAILED, counters.DEAD)
            return [(queue, name, metric, 1) for metric in metrics]

        capped = self.settings.queue(queue).limits.max_running is not None

        def bury(dialect: Dialect) -> str | None:
            ended = dialect.bury_expired(lease, now, json.dumps(errors))
            if ended is not None:  # its worker may still run the handler: its place under limits is kept
                places.hold_buried(dialect, now, lease, capped)
            return ended

        ended = self.store.retrying("bury", lambda d: counters.counted(d, rows, lambda: bury(d)))
        if ended is None:
            return LOST
        self._settle_ids([lease[0]])  # what waits for it is counted at once, as after any other end
        extra = {"job_id": lease[0], "job_name": name, "queue": queue, "attempt": attempts}
        if ended == "cancelled":
            jobs_log.info("durq: job %s (%s) lost its worker after a cancel -> cancelled", lease[0], name, extra=extra)
            return CANCELLED_OUTCOME
        logger.error("durq: job %s (%s) lost its worker on its last attempt -> dead letter", lease[0], name, extra=extra)
        self.count(queue, DEAD)
        self.emit(job_dead, sender=Executor, job_id=lease[0], name=name, queue=queue, errors=errors)
        return DEAD

    def _keep_finished_ms(self, queue: str) -> int:
        keep = self._keep_finished.get(queue)
        if keep is None:
            own = self.settings.queue(queue).keep_finished_ms
            keep = self._keep_finished[queue] = own if own is not None else self.settings.keep_finished_ms
        return keep

    def _finish(
        self, job: ClaimedJob, ctx: JobContext, definition: JobDefinition | None, result: Any, errors: list[dict[str, Any]]
    ) -> str:
        # A job of a workflow, or one others wait for, is kept: its dependents read its result.
        keep = job.workflow_id is not None or bool(job.dependents) or self._keep_finished_ms(job.queue) > 0
        stored: str | None = None
        if keep and result is not None:
            try:
                stored = encode_json(result, "result")
            except InvalidPayload as error:
                failure = Failure(
                    "exception", f"the handler returned a value that is not JSON: {error}", "django_durq.InvalidPayload"
                )
                return self._fail(job, ctx, definition, failure, errors)
        now = self.clock.now_ms() if keep else 0  # a finished time is stored only with the row
        if self.defer_completion is not None:
            self.defer_completion(job, ctx, Completion(result, keep, stored, now))
            return FINISHED
        hooks.jitter("complete")
        done = counters.ended(job, counters.FINISHED, run_ms=(time.monotonic() - ctx.started_mono) * 1000)
        if keep:
            held = bool(
                self.store.retrying(
                    "finish", lambda d: counters.counted(d, done, lambda: d.finish_many([(ctx.lease, now, stored)]))
                )
            )
        else:
            held = bool(self.store.retrying("complete", lambda d: counters.counted(d, done, lambda: d.complete([ctx.lease]))))
        if not held:
            if self.end_cancelled(job, ctx, errors):
                return CANCELLED_OUTCOME
            logger.warning(
                "durq: job %s (%s) finished after its lease was lost; the completion was ignored",
                job.id,
                job.name,
                extra=log_extra(job),
            )
            return LOST
        self.settle_ends([job])
        self.finished_many([(job, ctx, result)])
        return FINISHED

    def finished_many(self, completions: list[tuple[ClaimedJob, JobContext, Any]]) -> None:
        """Count, log and announce a batch of jobs of one queue whose completions are recorded."""
        if not completions:
            return
        self.count(completions[0][0].queue, FINISHED, len(completions))
        if jobs_log.isEnabledFor(logging.INFO):
            now = time.monotonic()
            for job, ctx, _ in completions:
                took = now - ctx.started_mono
                jobs_log.info(
                    "durq: job %s (%s) finished in %.3f s", job.id, job.name, took, extra={**log_extra(job), "duration": took}
                )
        if job_finished.has_listeners(Executor):
            announcements = [
                {"job_id": job.id, "name": job.name, "queue": job.queue, "result": result} for job, _, result in completions
            ]
            self.emit_many(job_finished, Executor, announcements)

    def end_cancelled(self, job: ClaimedJob, ctx: JobContext, errors: list[dict[str, Any]] | None = None) -> bool:
        """End cancelled a job whose outcome write found it asked to stop; False when it was not held.

        The outcome writes leave such a job running (the cancel may have committed after the
        handler's last heartbeat), so that it is recorded, logged and counted as cancelled here.
        """
        return self._cancel(job, ctx, error_list(job.errors) if errors is None else errors) == CANCELLED_OUTCOME

    def _fail(
        self,
        job: ClaimedJob,
        ctx: JobContext,
        definition: JobDefinition | None,
        failure: Failure,
        errors: list[dict[str, Any]],
    ) -> str:
        if ctx.stop_requested:
            return self._cancel(job, ctx, errors)  # a cancel is final: a failure does not bring the job back
        now = self.clock.now_ms()
        errors.append(self._entry(job.attempts, failure, self.worker_id))
        text = json.dumps(errors)
        run_at: int | None = None
        ran_ms = (time.monotonic() - ctx.started_mono) * 1000
        if failure.final or job.attempts >= job.max_attempts:
            rows = counters.ended(job, counters.FAILED, counters.DEAD, run_ms=ran_ms)
            held = self.store.retrying("bury", lambda d: counters.counted(d, rows, lambda: d.bury(ctx.lease, now, text)))
            outcome = DEAD
        else:
            if failure.retry_at_ms is not None:
                run_at = failure.retry_at_ms
            else:
                backoff = (definition.backoff if definition is not None else None) or self.settings.backoff
                run_at = now + backoff.delay_ms(job.attempts)
            # The update itself leaves the job running if an operator asked it to stop meanwhile.
            rows = counters.ended(job, counters.FAILED, counters.RETRIED, run_ms=ran_ms)
            held = self.store.retrying(
                "retry", lambda d: counters.counted(d, rows, lambda: d.retry_later(ctx.lease, run_at, now, text))
            )
            outcome = RETRYING
        if not held:
            if self.end_cancelled(job, ctx, errors):
                return CANCELLED_OUTCOME
            logger.warning(
                "durq: job %s (%s) failed after its lease was lost; the failure was ignored",
                job.id,
                job.name,
                extra=log_extra(job),
            )
            return LOST
        self.settle_ends([job])  # a dead letter, or a retry an operator's cancel made final
        if run_at is not None and run_at <= now:
            self._wake(job.queue)  # due again at once: idle workers elsewhere need not wait for their poll
        extra = {**log_extra(job), "duration": time.monotonic() - ctx.started_mono}
        if outcome == DEAD:
            jobs_log.error(
                "durq: job %s (%s) attempt %s/%s failed: %s -> dead letter",
                job.id,
                job.name,
                job.attempts,
                job.max_attempts,
                failure.message,
                exc_info=_exc_info(failure),
                extra=extra,
            )
        else:
            jobs_log.warning(
                "durq: job %s (%s) attempt %s/%s failed: %s; next attempt at %s",
                job.id,
                job.name,
                job.attempts,
                job.max_attempts,
                failure.message,
                _iso(run_at),
                exc_info=_exc_info(failure),
                extra={**extra, "next_attempt_ms": run_at},
            )
        self.count(job.queue, outcome)
        if outcome == DEAD:
            self.emit(
                job_dead, sender=Executor, error=failure.error, job_id=job.id, name=job.name, queue=job.queue, errors=errors
            )
        return outcome
