"""Waiting for a job's result: its handler's return value once it finished, or why there is none.

A result is read from the job's row, so there is one only while the finished job is kept:
``DURQ["KEEP_FINISHED"]`` (an hour by default; a queue's ``keep_finished`` overrides it). With 0 a
finished job is deleted as it finishes, its return value never stored, and a wait is refused at
once. A job of a workflow, or one that others wait for, is kept whatever the setting says.

The wait reads the row again and again (every 10 ms at first, then less often, at most every
0.5 s) until the job has ended or the timeout has passed, measured on this process's monotonic
clock. It must run outside a transaction on the queue's database: a job queued in the open
transaction cannot start before it commits, and on SQLite that transaction holds the write lock
the worker needs to record the end.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections

from ..clock import seconds_to_ms
from ..conf import get_settings
from ..exceptions import DurqError
from ..handlers.options import check_duration

if TYPE_CHECKING:
    from ..models import Job

FIRST_LOOK_S = 0.01
LONGEST_LOOK_S = 0.5


class JobFailed(DurqError):
    """The job is a dead letter: its last attempt failed (or it raised ``Abort``)."""

    def __init__(self, message: str, job_id: int, errors: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.errors = errors  # every attempt's error, the last one last


class JobCancelled(DurqError):
    """The job was cancelled: by an operator, or with a job it waited for in a workflow."""

    def __init__(self, message: str, job_id: int) -> None:
        super().__init__(message)
        self.job_id = job_id


class JobExpired(JobCancelled):
    """The job was not started before its expiry, and never ran."""


class ResultTimeout(DurqError, TimeoutError):
    """The job had not ended when the timeout passed; it goes on, and can be waited for again."""


class ResultNotKept(DurqError, LookupError):
    """The job's row is not in the table: never queued, deleted once kept long enough, or not kept at all."""


class WaitInTransaction(DurqError, RuntimeError):
    """A wait inside a transaction on the queue's database, for a job that has not ended."""


# What a wait reads of the row, and nothing more (a job's arguments may be large).
_COLUMNS = ("status", "result", "name", "queue", "errors", "workflow_id", "dependents")


def result(job: Job | int, timeout: float | timedelta) -> Any:
    """Wait up to ``timeout`` (seconds or a timedelta; 0 reads once) for ``job`` (a ``Job`` or its
    id) to end, and return what its handler returned (``None`` for a handler that returned nothing).

    Raises :class:`JobFailed` for a dead letter, :class:`JobCancelled` for a cancelled job
    (:class:`JobExpired` when it expired before it started), :class:`ResultTimeout` (a
    ``TimeoutError``) when it has not ended in time, :class:`ResultNotKept` when its row is gone
    or its result will not be kept, and :class:`WaitInTransaction` when it would have to wait
    inside a transaction on the queue's database.
    """
    check_duration("timeout", timeout, allow_zero=True)
    timeout_s = seconds_to_ms(timeout) / 1000
    job_id = job if isinstance(job, int) else int(job.pk)
    alias = get_settings().database
    deadline = time.monotonic() + timeout_s
    look_s = FIRST_LOOK_S
    checked = False
    while True:
        row = _read(job_id, alias)
        if row is None:
            raise ResultNotKept(_gone(job_id, checked))
        status, stored, name, queue, errors, workflow_id, dependents = row
        label = f"job {job_id} ({name})"
        if status == "finished":
            return json.loads(stored) if stored is not None else None
        if status in ("dead", "cancelled"):
            raise _ended(label, job_id, status, errors)
        if not checked:
            _check_kept(label, queue, workflow_id is not None or bool(dependents))
            _check_outside_transaction(label, alias)
            checked = True
        left = deadline - time.monotonic()
        if left <= 0:
            raise ResultTimeout(f"{label} is still {status} after {timeout_s:g} s")
        time.sleep(min(look_s, left))
        look_s = min(look_s * 2, LONGEST_LOOK_S)


def _read(job_id: int, alias: str) -> tuple[Any, ...] | None:
    from ..models import Job  # app loading: importing django_durq loads no model

    return Job.objects.using(alias).filter(pk=job_id).values_list(*_COLUMNS).first()


def _ended(label: str, job_id: int, status: str, errors_text: str) -> DurqError:
    errors = list(json.loads(errors_text or "[]"))
    last = errors[-1] if errors else {}
    if status == "dead":
        return JobFailed(f"{label} is a dead letter: {last.get('message', 'no error was recorded')}", job_id, errors)
    if last.get("kind") == "expired":
        return JobExpired(f"{label} {last.get('message')}", job_id)
    return JobCancelled(f"{label} was cancelled", job_id)


def _check_kept(label: str, queue: str, kept_anyway: bool) -> None:
    settings = get_settings()
    own = settings.queue(queue).keep_finished_ms
    keep_ms = own if own is not None else settings.keep_finished_ms
    if keep_ms == 0 and not kept_anyway:
        raise ResultNotKept(
            f'{label} will be deleted when it finishes: DURQ["KEEP_FINISHED"] is 0 for queue {queue!r}, so its result '
            "is never stored; set KEEP_FINISHED (or the queue's keep_finished) above 0 to read results"
        )


def _check_outside_transaction(label: str, alias: str) -> None:
    if connections[alias].in_atomic_block:
        raise WaitInTransaction(
            f"{label} has not ended, and this wait is inside a transaction on database {alias!r}: a job queued in it "
            "cannot start before it commits (and on SQLite it holds the lock the worker needs); wait outside "
            "transaction.atomic() (with ATOMIC_REQUESTS, mark the view transaction.non_atomic_requests)"
        )


def _gone(job_id: int, seen: bool) -> str:
    if seen:
        return (
            f"job {job_id} is no longer in the queue's table: deleted while this waited (purged, or pruned once "
            "kept for KEEP_FINISHED or KEEP_DEAD)"
        )
    return (
        f"no job {job_id} in the queue's table: never queued, or deleted (a finished job is deleted "
        'DURQ["KEEP_FINISHED"] after it finishes, at once when that is 0)'
    )
