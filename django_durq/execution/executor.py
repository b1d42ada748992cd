"""Run one claimed job and record its outcome; never dies with the handler.

Any exception from a handler (``SystemExit`` and ``KeyboardInterrupt`` included) is a failed
attempt with its traceback; the job is retried with backoff or, after ``max_attempts``, kept
as a dead letter with every attempt's error. Every write is fenced by the claim token, so an
executor that lost its lease changes nothing.

What a handler could never run is decided before it is called (see ``execution/unknown_types.py``): a
job whose type this process has no handler for is handed back for another worker, attempt not
counted; one whose stored arguments do not fit the handler's signature is a dead letter at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from asgiref.sync import async_to_sync
from django.db import InterfaceError, OperationalError, connections
from django.dispatch import Signal

from ..clock import Clock, datetime_to_ms, ms_to_datetime, seconds_to_ms
from ..conf import DurqSettings, hooks
from ..db import ClaimedJob, wakeup
from ..db.dependencies import settle
from ..db.expiry import end_claimed, expiry_message
from ..db.store import Store
from ..exceptions import Abort, InvalidPayload, Retry
from ..handlers.context import HAND_BACK_REASONS, LEASE_LOST, TIMED_OUT, JobContext
from ..handlers.payload import decode_arguments, encode_json
from ..handlers.registry import JobDefinition, registry
from ..signals import job_dead, job_finished, job_postrun, job_prerun, send, send_in_handler_thread
from .text import clip, clip_start
from .unknown_types import UnknownTypes

logger = logging.getLogger("django_durq")
# One line per job outcome (finished with its duration, failed, dead, cancelled, expired, handed
# back), with the job's id, name, queue and attempt as structured ``extra`` fields. Every other
# line about one job carries the same fields. A line quotes a message whole, never cut.
jobs_log = logging.getLogger("django_durq.jobs")

MAX_TRACEBACK_CHARS = 20_000
MAX_MESSAGE_CHARS = 2_000

# Outcomes, as counted by the worker.
FINISHED = "finished"
RETRYING = "retrying"
DEAD = "dead"
RELEASED = "released"
CANCELLED_OUTCOME = "cancelled"
LOST = "lost"
EXPIRED = "expired"  # claimed after its expiry: ended cancelled, never started
ABANDONED = "abandoned"  # another recorder (a timeout) settled this attempt first
UNKNOWN_TYPE = "unknown type"  # handed back: this process has no handler for the job's type


@dataclass
class Completion:
    """A finished attempt whose completion a worker pool commits in a batch."""

    result: Any  # the handler's return value, for job_finished
    keep: bool  # keep the finished row (retention on) rather than delete it
    stored: str | None  # the result as stored when kept
    finished_ms: int


@dataclass
class Failure:
    kind: str  # exception, timeout, unknown_job, decode, arguments, lease_expired, worker_lost, retry
    message: str
    type: str = ""
    traceback: str = ""
    retry_at_ms: int | None = None
    final: bool = False
    error: BaseException | None = None  # the exception itself (a Retry too), for receivers and log handlers


class Executor:
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

    def run(self, job: ClaimedJob, ctx: JobContext) -> str:
        if ctx.lease_lost:
            ctx.settle()
            return LOST  # lost while it waited in a buffer: never started, nothing to record
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
        ctx.start()
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
            else:
                # In this thread, around the handler alone: a receiver may set up and tear down
                # what the handler's thread needs (docs/runtime.md, "Signals").
                if job_prerun.receivers:
                    send_in_handler_thread(job_prerun, Executor, None, log_extra(job), **_announced(job, ctx))
                failure, result = self._call(definition, ctx, args, kwargs)
                if job_postrun.receivers:
                    raised = failure.error if failure is not None else None
                    announced = _announced(job, ctx)
                    send_in_handler_thread(
                        job_postrun, Executor, raised, log_extra(job), result=result, error=raised, **announced
                    )
        return self.record(job, ctx, failure, result, errors, definition)

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
        if not self.store.retrying("hand back", lambda d: self.unknown_types.hand_back(d, job, ctx, verdict)):
            return LOST
        self.count(job.queue, UNKNOWN_TYPE)
        self.settle_ends([job])  # an operator's cancel makes the hand-back an end
        return UNKNOWN_TYPE

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
        released = self.store.retrying("release", lambda d: d.release([ctx.lease], started=True, now_ms=self.clock.now_ms()))
        if not released:
            return LOST
        self.settle_ends([job])  # an operator's cancel makes the hand-back an end
        self._wake(job.queue)
        if jobs_log.isEnabledFor(logging.INFO):
            detail = ctx.stop_detail() or "stopping"
            jobs_log.info("durq: job %s (%s) handed back (%s)", job.id, job.name, detail, extra=log_extra(job))
        return RELEASED

    def bury_lost(self, queue: str, lease: tuple[int, int], name: str, attempts: int, errors_text: str, holder: str) -> str:
        """A job whose worker died on its last attempt: a dead letter saying so, if its lease is still expired.

        One an operator asked to stop ends cancelled instead. Either way its end is counted for
        the jobs that wait for it.
        """
        errors = json.loads(errors_text or "[]")
        errors.append(self._entry(attempts, Failure("lease_expired", "lease expired: worker lost"), holder))
        now = self.clock.now_ms()
        hooks.jitter("bury")
        ended = self.store.retrying("bury", lambda d: d.bury_expired(lease, now, json.dumps(errors)))
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

    def _call(
        self, definition: JobDefinition, ctx: JobContext, args: list[Any], kwargs: dict[str, Any]
    ) -> tuple[Failure | None, Any]:
        try:
            if definition.is_async:
                # async_to_sync runs thread-sensitive sync_to_async calls (the ORM) back in this
                # thread, so the handler's queries use this worker thread's own connection.
                return None, async_to_sync(definition.func)(ctx, *args, **kwargs)
            return None, definition.func(ctx, *args, **kwargs)
        except Retry as retry:
            try:
                retry_at = self._retry_at(retry)
            except Exception as error:  # noqa: BLE001 - a bad Retry is the handler's failure
                message = f"Retry(after={retry.after!r}) is invalid: {_safe_str(error)}"
                return Failure("exception", message, _type_path(error), _traceback(error), error=error), None
            return Failure("retry", retry.reason or "retry requested", retry_at_ms=retry_at, error=retry), None
        except Abort as abort:
            return Failure("exception", _safe_str(abort), _type_path(abort), _traceback(abort), final=True, error=abort), None
        except BaseException as error:  # noqa: BLE001 - a handler must never take the worker down
            return Failure("exception", _safe_str(error), _type_path(error), _traceback(error), error=error), None

    def _retry_at(self, retry: Retry) -> int:
        if isinstance(retry.after, datetime):
            return datetime_to_ms(retry.after)
        return self.clock.now_ms() + seconds_to_ms(retry.after)

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
        if keep:
            held = bool(self.store.retrying("finish", lambda d: d.finish_many([(ctx.lease, now, stored)])))
        else:
            held = bool(self.store.retrying("complete", lambda d: d.complete([ctx.lease])))
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
        if failure.final or job.attempts >= job.max_attempts:
            held = self.store.retrying("bury", lambda d: d.bury(ctx.lease, now, text))
            outcome = DEAD
        else:
            if failure.retry_at_ms is not None:
                run_at = failure.retry_at_ms
            else:
                backoff = (definition.backoff if definition is not None else None) or self.settings.backoff
                run_at = now + backoff.delay_ms(job.attempts)
            # The update itself turns the job cancelled if an operator asked meanwhile.
            held = self.store.retrying("retry", lambda d: d.retry_later(ctx.lease, run_at, now, text))
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

    def end_cancelled(self, job: ClaimedJob, ctx: JobContext, errors: list[dict[str, Any]] | None = None) -> bool:
        """End cancelled a job whose outcome write found it asked to stop; False when it was not held.

        The outcome writes leave such a job running (the cancel may have committed after the
        handler's last heartbeat), so that it is recorded, logged and counted as cancelled here.
        """
        return self._cancel(job, ctx, error_list(job.errors) if errors is None else errors) == CANCELLED_OUTCOME

    def _cancel(self, job: ClaimedJob, ctx: JobContext, errors: list[dict[str, Any]]) -> str:
        errors.append(self._entry(job.attempts, Failure("cancelled", "stopped at an operator's request"), self.worker_id))
        now = self.clock.now_ms()
        held = self.store.retrying("cancel", lambda d: d.cancel_running(ctx.lease, now, json.dumps(errors)))
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
        held = self.store.retrying("expire", lambda d: end_claimed(d, ctx.lease, now, text))
        if not held:
            return LOST
        self.settle_ends([job])  # what waits for it is cancelled (or released, with on_failure="run")
        jobs_log.info("durq: job %s (%s) %s -> cancelled", job.id, job.name, message, extra=log_extra(job))
        return EXPIRED

    def _connection(self) -> Any:
        """This thread's connection to the queue's database, looked up once per thread."""
        try:
            return self._local.connection
        except AttributeError:
            self._local.connection = connections[self.store.alias]
            return self._local.connection

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


def transaction_state(connection: Any) -> tuple[int, bool]:
    """(atomic blocks open, autocommit) of a connection, without connecting."""
    return len(connection.atomic_blocks), connection.connection is None or connection.autocommit


def reclaim_connection(connection: Any, before: tuple[int, bool] = (0, True)) -> None:
    """Take back this thread's connection from a transaction the handler left open.

    A handler that called ``set_autocommit(False)`` (or entered ``atomic()`` without leaving it)
    would otherwise hold the outcome's writes in its own transaction, to be rolled back with
    it. The open transaction is discarded, as it would be if the handler had crashed. ``before``
    is the state the handler found: code that runs jobs inside its own transaction (a test's
    ``drain()``) keeps it.
    """
    depth, autocommit = transaction_state(connection)
    if depth == before[0] and autocommit:
        return  # as the handler found it: nearly always
    alias = connection.alias
    if depth > before[0]:
        logger.warning("durq: a handler left a transaction open on %r; rolling it back", alias)
        if before[0] == 0:
            _reset_atomic_state(connection)
    elif before[1] and not autocommit and not connection.in_atomic_block:
        logger.warning("durq: a handler turned autocommit off on %r; rolling back and turning it on", alias)
        try:
            connection.rollback()
            connection.set_autocommit(True)
        except Exception:  # noqa: BLE001 - a broken connection: Django opens a new one on next use
            _reset_atomic_state(connection)


def _reset_atomic_state(connection: Any) -> None:
    try:
        connection.close()
    except Exception:  # noqa: BLE001 - closing a broken connection
        pass
    connection.connection = None
    connection.in_atomic_block = False
    connection.atomic_blocks = []
    connection.savepoint_ids = []
    connection.needs_rollback = False
    connection.closed_in_transaction = False
    connection.commit_on_exit = True


def _send_each(signal: Signal, sender: Any, each: list[dict[str, Any]]) -> None:
    for kwargs in each:
        send(signal, sender, **kwargs)


def _iso(ms: int | None) -> str:
    moment = ms_to_datetime(ms)
    return moment.isoformat(timespec="milliseconds") if moment is not None else "?"


def log_extra(job: ClaimedJob) -> dict[str, Any]:
    """The structured fields of every log line about one attempt of a job."""
    return {"job_id": job.id, "job_name": job.name, "queue": job.queue, "attempt": job.attempts}


def _announced(job: ClaimedJob, ctx: JobContext) -> dict[str, Any]:
    """What ``job_prerun`` and ``job_postrun`` say about the attempt."""
    return {"job_id": job.id, "name": job.name, "queue": job.queue, "attempt": job.attempts, "ctx": ctx}


def _exc_info(failure: Failure) -> tuple[type[BaseException], BaseException, Any] | None:
    error = failure.error
    if error is None or failure.kind == "retry":
        return None  # a Retry the handler asked for is no error to trace
    return (type(error), error, error.__traceback__)


def error_list(text: str) -> list[dict[str, Any]]:
    # Most jobs have no errors: skip the JSON parse on the hot path.
    return [] if not text or text == "[]" else list(json.loads(text))


def _safe_str(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
        try:
            text = repr(error)
        except Exception:  # noqa: BLE001
            text = f"<unprintable {type(error).__name__}>"
    return text or type(error).__name__


def _type_path(error: BaseException) -> str:
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _traceback(error: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(error))
    except Exception:  # noqa: BLE001
        return f"{_type_path(error)}: <traceback unavailable>"
