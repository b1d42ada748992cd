"""Run one claimed job and record its outcome; never dies with the handler.

Any exception from a handler (``SystemExit`` and ``KeyboardInterrupt`` included) is a failed
attempt with its traceback; the job is retried with backoff or, after ``max_attempts``, kept
as a dead letter with every attempt's error. Every write is fenced by the claim token, so an
executor that lost its lease changes nothing.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from asgiref.sync import async_to_sync

from . import hooks
from .clock import Clock, datetime_to_ms, seconds_to_ms
from .conf import DurqSettings
from .context import CANCELLED, LEASE_LOST, SHUTDOWN, TIMED_OUT, JobContext
from .db import ClaimedJob
from .exceptions import Abort, InvalidPayload, Retry
from .payload import decode_arguments, encode_json
from .registry import JobDefinition, registry
from .signals import job_dead, job_finished
from .store import Store

logger = logging.getLogger("django_durq")

MAX_TRACEBACK_CHARS = 20_000
MAX_MESSAGE_CHARS = 2_000

# Outcomes, as counted by the worker.
FINISHED = "finished"
RETRYING = "retrying"
DEAD = "dead"
RELEASED = "released"
CANCELLED_OUTCOME = "cancelled"
LOST = "lost"


@dataclass
class Failure:
    kind: str  # exception, timeout, unknown_job, decode, lease_expired, retry
    message: str
    type: str = ""
    traceback: str = ""
    retry_at_ms: int | None = None
    final: bool = False


class Executor:
    def __init__(
        self,
        store: Store,
        settings: DurqSettings,
        clock: Clock,
        worker_id: str,
        count: Callable[..., None] = lambda queue, outcome, n=1: None,
        defer_completion: Callable[[ClaimedJob, JobContext, Any], None] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.worker_id = worker_id
        self.count = count
        # A worker pool batches the deletes of finished jobs (see Pool.flush_completions).
        self.defer_completion = defer_completion
        self.hooks_enabled = settings.test_hooks_dir is not None
        self._keep_finished: dict[str, int] = {}  # per queue; looked up for every finished job

    def run(self, job: ClaimedJob, ctx: JobContext) -> str:
        errors = _error_list(job.errors)
        if job.reclaimed_from is not None:
            errors.append(
                self._entry(job.attempts - 1, Failure("lease_expired", "lease expired: worker lost"), job.reclaimed_from)
            )
            job.errors = json.dumps(errors)
            self.store.retrying("record lost lease", lambda d: d.record_errors(ctx.lease, job.errors))
        if self.hooks_enabled:
            hooks.reach("after_claim", job.id)

        if ctx.stop_requested:
            return self._cancel(job, ctx, errors)  # an operator cancelled it while it waited in the buffer
        definition = registry.get(job.name)
        result: Any = None
        failure: Failure | None = None
        if definition is None:
            failure = Failure("unknown_job", f"unknown job type {job.name!r}: no handler is registered under this name")
        else:
            try:
                args, kwargs = decode_arguments(job.arguments)
            except (ValueError, RecursionError) as error:
                failure = Failure("decode", f"payload decode error: {_safe_str(error)}", type=_type_path(error))
            else:
                failure, result = self._call(definition, ctx, args, kwargs)

        ctx.settled = True
        reason = ctx.stop_reason()
        if failure is None and reason == TIMED_OUT:
            failure = Failure("timeout", f"timed out after {(job.timeout_ms or 0) / 1000:g} s")
        if self.hooks_enabled:
            hooks.reach("before_complete", job.id)
        if reason == LEASE_LOST:
            logger.warning("durq: job %s (%s) lost its lease while running; its outcome is discarded", job.id, job.name)
            return LOST
        if reason == CANCELLED:
            return self._cancel(job, ctx, errors)
        if reason == SHUTDOWN and ctx.stop_seen and failure is None:
            released = self.store.retrying("release", lambda d: d.release([ctx.lease]))
            return RELEASED if released else LOST
        if failure is None:
            return self._finish(job, ctx, definition, result, errors)
        return self._fail(job, ctx, definition, failure, errors)

    def record_failure(self, job: ClaimedJob, ctx: JobContext, failure: Failure) -> str:
        """Fail the attempt from outside the handler's thread (a timeout the handler ignored)."""
        return self._fail(job, ctx, registry.get(job.name), failure, _error_list(job.errors))

    def bury_lost(self, queue: str, lease: tuple[int, int], name: str, attempts: int, errors_text: str, holder: str) -> str:
        """A job whose worker died on its last attempt: a dead letter saying so."""
        errors = json.loads(errors_text or "[]")
        errors.append(self._entry(attempts, Failure("lease_expired", "lease expired: worker lost"), holder))
        now = self.clock.now_ms()
        if not self.store.retrying("bury", lambda d: d.bury(lease, now, json.dumps(errors))):
            return LOST
        logger.error("durq: job %s (%s) lost its worker on its last attempt -> dead letter", lease[0], name)
        self.count(queue, DEAD)
        job_dead.send(sender=Executor, job_id=lease[0], name=name, queue=queue, errors=errors)
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
            return Failure("retry", retry.reason or "retry requested", retry_at_ms=self._retry_at(retry)), None
        except Abort as abort:
            return Failure("exception", _safe_str(abort), _type_path(abort), _traceback(abort), final=True), None
        except BaseException as error:  # noqa: BLE001 - a handler must never take the worker down
            return Failure("exception", _safe_str(error), _type_path(error), _traceback(error)), None

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
        if self._keep_finished_ms(job.queue) > 0:
            try:
                stored = encode_json(result, "result") if result is not None else None
            except InvalidPayload as error:
                failure = Failure(
                    "exception", f"the handler returned a value that is not JSON: {error}", "django_durq.InvalidPayload"
                )
                return self._fail(job, ctx, definition, failure, errors)
            now = self.clock.now_ms()
            held = self.store.retrying("finish", lambda d: d.finish(ctx.lease, now, stored, None))
        elif self.defer_completion is not None:
            self.defer_completion(job, ctx, result)
            return FINISHED
        else:
            held = bool(self.store.retrying("complete", lambda d: d.complete([ctx.lease])))
        if not held:
            logger.warning("durq: job %s (%s) finished after its lease was lost; the completion was ignored", job.id, job.name)
            return LOST
        self.finished(job, result)
        return FINISHED

    def finished(self, job: ClaimedJob, result: Any) -> None:
        """Count and announce a job whose completion is recorded."""
        self.finished_many([(job, result)])

    def finished_many(self, completions: list[tuple[ClaimedJob, Any]]) -> None:
        """Count and announce a batch of jobs of one queue whose completions are recorded."""
        if not completions:
            return
        self.count(completions[0][0].queue, FINISHED, len(completions))
        if job_finished.receivers:
            for job, result in completions:
                job_finished.send(sender=Executor, job_id=job.id, name=job.name, queue=job.queue, result=result)

    def _fail(
        self,
        job: ClaimedJob,
        ctx: JobContext,
        definition: JobDefinition | None,
        failure: Failure,
        errors: list[dict[str, Any]],
    ) -> str:
        now = self.clock.now_ms()
        errors.append(self._entry(job.attempts, failure, self.worker_id))
        text = json.dumps(errors)
        if failure.final or job.attempts >= job.max_attempts:
            held = self.store.retrying("bury", lambda d: d.bury(ctx.lease, now, text))
            outcome = DEAD
        else:
            if failure.retry_at_ms is not None:
                run_at = failure.retry_at_ms
            else:
                backoff = (definition.backoff if definition is not None else None) or self.settings.backoff
                run_at = now + backoff.delay_ms(job.attempts)
            held = self.store.retrying("retry", lambda d: d.retry_later(ctx.lease, run_at, text))
            outcome = RETRYING
        if not held:
            logger.warning("durq: job %s (%s) failed after its lease was lost; the failure was ignored", job.id, job.name)
            return LOST
        log = logger.error if outcome == DEAD else logger.warning
        log(
            "durq: job %s (%s) attempt %s/%s failed: %s%s",
            job.id,
            job.name,
            job.attempts,
            job.max_attempts,
            failure.message[:200],
            " -> dead letter" if outcome == DEAD else "",
        )
        self.count(job.queue, outcome)
        if outcome == DEAD:
            job_dead.send(sender=Executor, job_id=job.id, name=job.name, queue=job.queue, errors=errors)
        return outcome

    def _cancel(self, job: ClaimedJob, ctx: JobContext, errors: list[dict[str, Any]]) -> str:
        errors.append(self._entry(job.attempts, Failure("cancelled", "stopped at an operator's request"), self.worker_id))
        now = self.clock.now_ms()
        held = self.store.retrying("cancel", lambda d: d.cancel_running(ctx.lease, now, json.dumps(errors)))
        return CANCELLED_OUTCOME if held else LOST

    def _entry(self, attempt: int, failure: Failure, worker: str) -> dict[str, Any]:
        return {
            "attempt": attempt,
            "at_ms": self.clock.now_ms(),
            "worker": worker,
            "kind": failure.kind,
            "type": failure.type,
            "message": failure.message[:MAX_MESSAGE_CHARS],
            "traceback": failure.traceback[-MAX_TRACEBACK_CHARS:],
        }


def _error_list(text: str) -> list[dict[str, Any]]:
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
