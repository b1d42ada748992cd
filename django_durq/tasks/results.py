"""A job row as Django's ``TaskResult``, and the result ids that name rows.

A result id is ``"<job id>-<key>"``. The key is a random number stored in the row when a task
is queued (``Job.result_key``), or the row's ``created_ms`` for a task queued by name (a cron
schedule). A database may hand a rolled-back row's id to the next insert (SQLite does); the key
makes such an id name nothing rather than someone else's task.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings as django_settings
from django.utils import timezone

from ..clock import ms_to_datetime
from ..exceptions import DurqError
from .framework import TaskError, TaskResult, TaskResultStatus

if TYPE_CHECKING:
    from ..models import Job

__all__ = [
    "STATUS_MAP",
    "TaskCancelled",
    "finished_result",
    "new_result_key",
    "parse_result_id",
    "result_for_job",
    "run_after_us",
]

STATUS_MAP = {
    "waiting": TaskResultStatus.READY,  # queued, deferred, or waiting for a retry
    "running": TaskResultStatus.RUNNING,
    "finished": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}

_FINAL = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
_RESULT_ID = re.compile(r"([0-9]{1,19})-([0-9]{1,19})")
_MAX_BIGINT = 2**63 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class TaskCancelled(DurqError):
    """An operator cancelled the task; named in ``TaskResult.errors`` of a cancelled task."""


def new_result_key() -> int:
    return secrets.randbits(62)


def parse_result_id(result_id: Any) -> tuple[int, int] | None:
    """(job id, key) of a well-formed result id, or None."""
    match = _RESULT_ID.fullmatch(str(result_id))
    if match is None:
        return None
    job_id, key = int(match[1]), int(match[2])
    return (job_id, key) if job_id <= _MAX_BIGINT and key <= _MAX_BIGINT else None


def result_key_of(job: Job) -> int:
    return job.result_key if job.result_key is not None else job.created_ms


def run_after_us(value: datetime) -> int:
    """An aware or naive ``run_after`` as epoch microseconds (naive: in the current time zone)."""
    aware = value if timezone.is_aware(value) else timezone.make_aware(value)
    return (aware - _EPOCH) // _MICROSECOND


def result_for_job(job: Job, task: Any, alias: str, *, copy_task: bool = True) -> Any:
    """The ``TaskResult`` a job row stands for.

    ``started_at`` and ``last_attempted_at`` are both the start of the latest attempt: durq keeps
    one start time per job. ``errors`` has one entry per failed attempt, ``worker_ids`` one per
    attempt. With ``copy_task`` the result's task carries what the row was queued with: queue,
    priority, ``run_after``, and of durq's options ``unique`` and a ``max_attempts`` other than
    the task's own (``lease`` and ``timeout`` stay the task's).
    """
    status = STATUS_MAP[job.status]
    entries = job.error_list
    # A hand-back by a worker without the handler (``counted: false``) was no attempt of the task.
    errors = [_task_error(entry) for entry in entries if isinstance(entry, dict) and entry.get("counted") is not False]
    said = ("cancelled", "expired")
    if job.status == "cancelled" and not any(entry.get("kind") in said for entry in entries if isinstance(entry, dict)):
        errors.append(TaskError(exception_class_path=_CANCELLED, traceback=f"{_CANCELLED}: cancelled before it ran"))
    if copy_task:
        run_after = _local(_EPOCH + job.run_after_us * _MICROSECOND) if job.run_after_us is not None else None
        changes: dict[str, Any] = {"queue_name": job.queue, "priority": job.priority, "run_after": run_after, "backend": alias}
        if hasattr(task, "unique"):  # a DurqTask
            changes["unique"] = job.unique_key
            if job.max_attempts != (task.max_attempts or getattr(task.get_backend(), "max_attempts", None)):
                changes["max_attempts"] = job.max_attempts
        task = _copy_task(task, **changes)
    result: Any = TaskResult(
        task=task,
        id=f"{job.pk}-{result_key_of(job)}",
        status=status,
        enqueued_at=_local(ms_to_datetime(job.created_ms)),
        started_at=_local(ms_to_datetime(job.started_ms)),
        finished_at=_local(ms_to_datetime(job.finished_ms))
        if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
        else None,
        last_attempted_at=_local(ms_to_datetime(job.started_ms)),
        args=job.args,
        kwargs=job.kwargs,
        backend=alias,
        errors=errors,
        worker_ids=_worker_ids(job, entries),
    )
    if status == TaskResultStatus.SUCCESSFUL and job.result is not None:
        object.__setattr__(result, "_return_value", json.loads(job.result))
    return result


def finished_result(running: Any, return_value: Any) -> Any:
    """A running result turned successful (when the job row was not kept to read it back)."""
    result: Any = dataclasses.replace(running, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now())
    object.__setattr__(result, "_return_value", return_value)
    return result


_CANCELLED = f"{TaskCancelled.__module__}.{TaskCancelled.__qualname__}"

# What a durq failure kind stands for, as the exception class path Django reports.
_KIND_CLASSES = {
    "retry": "django_durq.exceptions.Retry",
    "timeout": "builtins.TimeoutError",
    "lease_expired": "django_durq.exceptions.LeaseLost",
    "worker_lost": "django_durq.exceptions.LeaseLost",
    "unknown_job": "django_durq.exceptions.UnknownJobType",
    "cancelled": _CANCELLED,
    "expired": _CANCELLED,  # not started before its expiry: cancelled
}


def _task_error(entry: dict[str, Any]) -> Any:
    kind = str(entry.get("kind") or "")
    recorded = str(entry.get("type") or "")
    if recorded and "." not in recorded:
        recorded = f"builtins.{recorded}"  # durq records builtins without their module
    path = recorded if kind in ("exception", "decode") and recorded else _KIND_CLASSES.get(kind) or recorded
    path = path or "builtins.Exception"
    traceback = str(entry.get("traceback") or "") or f"{path}: {entry.get('message', '')}"
    return TaskError(exception_class_path=path, traceback=traceback)


def _worker_ids(job: Job, entries: list[Any]) -> list[str]:
    by_attempt = {
        entry["attempt"]: str(entry.get("worker") or "")
        for entry in entries
        if isinstance(entry, dict) and isinstance(entry.get("attempt"), int)
    }
    return [by_attempt.get(attempt) or job.claimed_by for attempt in range(1, job.attempts + 1)]


def _copy_task(task: Any, **changes: Any) -> Any:
    """A copy of a frozen Task with ``changes``, without validating it again.

    A stored result stays readable when the settings changed since it was queued (a queue
    dropped from ``QUEUES``, say); ``dataclasses.replace`` would reject it.
    """
    clone = object.__new__(type(task))
    for item in dataclasses.fields(task):
        object.__setattr__(clone, item.name, changes.get(item.name, getattr(task, item.name)))
    return clone


def _local(value: datetime | None) -> datetime | None:
    """A stored instant as Django hands out datetimes: aware, or naive when ``USE_TZ`` is off."""
    if value is not None and not django_settings.USE_TZ:
        return timezone.make_naive(value)
    return value
