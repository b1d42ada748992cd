"""A backend for Django's tasks framework: ``TASKS = {"default": {"BACKEND": "django_durq.backend.DurqBackend"}}``.

A ``Task.enqueue()`` inserts a durq job named after the task's ``module_path``, in the caller's
transaction, and ``durq_worker`` runs it with leases, retries, dead letters and the admin. A
result id is the job's id; the result is read back from the job row, so it lives as long as
the row does (``DURQ["KEEP_FINISHED"]`` for successful tasks, see ``check()``).

Django 6.0+ ships the framework as ``django.tasks``; on Django 5.2 the ``django-tasks``
backport provides the same API, and is used when ``django.tasks`` is absent.

This module imports no model at import time: Django builds the backend while it defines tasks,
which can happen before the app registry is ready.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from asgiref.sync import sync_to_async
from django.apps import apps
from django.conf import settings as django_settings
from django.core import checks
from django.utils import timezone

from . import tasks_bridge
from .clock import ms_to_datetime, seconds_to_ms
from .conf import get_settings
from .context import JobContext
from .exceptions import DurqError

try:  # Django >= 6.0
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2 with the django-tasks backport
    try:
        from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef,assignment]
        from django_tasks.base import (  # type: ignore[no-redef,assignment]
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
        )
        from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef,assignment]
        from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef,assignment]
        from django_tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[no-redef,assignment] # noqa: F401
        from django_tasks.utils import normalize_json  # type: ignore[no-redef,assignment]
    except ImportError as error:
        raise ImportError(
            "django_durq.backend.DurqBackend needs Django's tasks framework: Django >= 6.0, "
            "or on Django 5.2 the backport (pip install django-tasks)"
        ) from error

if TYPE_CHECKING:
    from .models import Job

__all__ = [
    "DurqBackend",
    "DurqTask",
    "DurqTaskContext",
    "TaskCancelled",
    "durq_options",
]

# A result id is a job id: digits only, within a signed 64-bit integer.
_RESULT_ID = re.compile(r"[0-9]{1,19}")
_MAX_JOB_ID = 2**63 - 1
_MAX_NAME = 200  # Job.name
_KNOWN_OPTIONS = {"MODULES"}

STATUS_MAP = {
    "waiting": TaskResultStatus.READY,  # queued, deferred, or waiting for a retry
    "running": TaskResultStatus.RUNNING,
    "finished": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


class TaskCancelled(DurqError):
    """An operator cancelled the task; named in ``TaskResult.errors`` of a cancelled task."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DurqTask(Task):  # type: ignore[misc]
    """The ``task_class`` of :class:`DurqBackend`: a Django ``Task`` with durq's own options.

    ``max_attempts`` (attempts before the task fails for good), ``unique`` (a dedupe key: while
    a task with this key is waiting or running, enqueueing another returns that one), ``lease``
    and ``timeout`` (seconds or a timedelta). ``None`` means durq's default. On Django 6.1 they
    are keyword arguments of ``@task``; on every version ``using()`` and :func:`durq_options`
    set them.
    """

    max_attempts: int | None = None
    unique: str | None = None
    lease: timedelta | float | None = None
    timeout: timedelta | float | None = None

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        max_attempts: int | None = None,
        unique: str | None = None,
        lease: timedelta | float | None = None,
        timeout: timedelta | float | None = None,
    ) -> DurqTask:
        """A copy with these defaults changed; ``None`` keeps the current value."""
        # Task.using is called explicitly: zero-argument super() does not work in a slots dataclass.
        task = cast(DurqTask, Task.using(self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend))
        changes: dict[str, Any] = {
            key: value
            for key, value in {"max_attempts": max_attempts, "unique": unique, "lease": lease, "timeout": timeout}.items()
            if value is not None
        }
        return dataclasses.replace(task, **changes) if changes else task


def durq_options(
    *,
    max_attempts: int | None = None,
    unique: str | None = None,
    lease: timedelta | float | None = None,
    timeout: timedelta | float | None = None,
) -> Callable[[Any], DurqTask]:
    """Give a task durq's options at definition time, on any Django version::

        @durq_options(max_attempts=3, timeout=60)
        @task
        def send_report(user_id): ...

    On Django 6.1 ``@task(max_attempts=3, timeout=60)`` does the same.
    """

    def apply(task: Any) -> DurqTask:
        if not isinstance(task, DurqTask):
            raise InvalidTask(
                f"durq_options() needs a task of a DurqBackend (got {type(task).__name__}); "
                "put it above @task, and point the task's backend at django_durq.backend.DurqBackend"
            )
        configured = task.using(max_attempts=max_attempts, unique=unique, lease=lease, timeout=timeout)
        tasks_bridge.register(configured, replace=True)
        return configured

    return apply


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DurqTaskContext(TaskContext):  # type: ignore[misc]
    """Django's ``TaskContext`` with durq's view of the running attempt.

    ``heartbeat()`` extends the lease now (False once another worker took the task over);
    ``should_stop()`` is True on shutdown, timeout, cancellation or a lost lease;
    ``is_last_attempt()`` is True when a failure now fails the task for good; ``progress()``
    shows progress in the admin. In an ``async def`` task, await ``aheartbeat()`` and
    ``aprogress()``: they write to the database.
    """

    job_context: JobContext = dataclasses.field(repr=False, compare=False)

    def heartbeat(self) -> bool:
        return self.job_context.heartbeat()

    async def aheartbeat(self) -> bool:
        return bool(await sync_to_async(self.job_context.heartbeat)())

    def should_stop(self) -> bool:
        return self.job_context.should_stop()

    def is_last_attempt(self) -> bool:
        return self.job_context.is_last_attempt()

    def progress(self, done: int, total: int | None = None) -> bool:
        return self.job_context.progress(done, total)

    async def aprogress(self, done: int, total: int | None = None) -> bool:
        return bool(await sync_to_async(self.job_context.progress)(done, total))


class DurqBackend(BaseTaskBackend):  # type: ignore[misc]
    """Runs Django tasks as durq jobs. ``OPTIONS["MODULES"]`` lists modules, besides every
    installed app's ``tasks.py``, that define tasks and that workers must import."""

    task_class = DurqTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: Any) -> None:
        """Django's rules, durq's options, then register the task so that workers can find it.

        Django calls this when ``@task`` builds a Task: that is the moment the task's module is
        imported, and so the moment to register it (see ``tasks_bridge``).
        """
        super().validate_task(task)
        queue = task.queue_name
        if not isinstance(queue, str) or not queue or ":" in queue or len(queue) > 100:
            raise InvalidTask(f"queue_name {queue!r} is not a durq queue name: 1 to 100 characters, no ':'")
        name = task.module_path
        if len(name) > _MAX_NAME:
            raise InvalidTask(f"the task's module path {name!r} is longer than {_MAX_NAME} characters")
        if isinstance(task, DurqTask):
            _validate_options(task)
        try:
            tasks_bridge.register(task)
        except ValueError as error:
            raise InvalidTask(str(error)) from None

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        from .enqueue import enqueue_one

        args = normalize_json(list(args))
        kwargs = normalize_json(dict(kwargs))
        options: dict[str, Any] = {"queue": task.queue_name, "priority": task.priority}
        if task.run_after is not None:
            run_after = task.run_after
            options["run_at"] = run_after if timezone.is_aware(run_after) else timezone.make_aware(run_after)
        if isinstance(task, DurqTask):
            for key in ("max_attempts", "unique", "lease", "timeout"):
                options[key] = getattr(task, key)
        job = enqueue_one(tasks_bridge.definition_for(task).using(**options), args, kwargs)
        if job.deduplicated:
            # Nothing was queued: the result is that of the task already holding the key.
            return result_for_job(job, tasks_bridge.task_named(job.name) or task, self.alias)
        result = result_for_job(job, task, self.alias, copy_task=False)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: Any) -> Any:
        """The result of the task queued as job ``result_id``; ``TaskResultDoesNotExist`` for an
        id that is unknown, no longer kept, or not a task this process has imported."""
        from .models import Job

        text = str(result_id)
        job = None
        if _RESULT_ID.fullmatch(text) and int(text) <= _MAX_JOB_ID:
            job = Job.objects.using(get_settings().database).filter(pk=int(text)).first()
        task = tasks_bridge.task_named(job.name) if job is not None else None
        if job is None or task is None:
            raise TaskResultDoesNotExist(result_id)
        return result_for_job(job, task, self.alias)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """``durq.E101``: results of successful tasks would be deleted at once;
        ``durq.W101``: a queue no worker works by default; ``durq.E102``: app not installed;
        ``durq.E103``: bad ``OPTIONS``."""
        messages: list[checks.CheckMessage] = list(super().check(**kwargs))
        label = f'TASKS["{self.alias}"]'
        if not apps.is_installed("django_durq"):
            messages.append(
                checks.Error(
                    f"{label} uses DurqBackend, but django_durq is not in INSTALLED_APPS",
                    hint='Add "django_durq" to INSTALLED_APPS.',
                    id="durq.E102",
                )
            )
            return messages
        messages.extend(self._option_problems(label))
        settings = get_settings()
        queues = sorted(self.queues) if self.queues else sorted(settings.queues)
        unserved = [queue for queue in queues if queue not in settings.queues]
        if unserved:
            messages.append(
                checks.Warning(
                    f'{label} accepts queue(s) {", ".join(unserved)}, which DURQ["QUEUES"] does not define: '
                    'durq_worker works only the queues of DURQ["QUEUES"] unless started with --queue',
                    hint=f'Add them to DURQ["QUEUES"], for example "{unserved[0]}": {{"concurrency": 4}}.',
                    id="durq.W101",
                )
            )
        unkept = [queue for queue in queues if _keep_finished_ms(queue) == 0]
        if unkept:
            messages.append(
                checks.Error(
                    f"{label}: finished jobs of queue(s) {', '.join(unkept)} are deleted as soon as they succeed "
                    '(DURQ["KEEP_FINISHED"] is 0), so get_result() and refresh() could not report a successful '
                    "task or its return value",
                    hint='Keep finished jobs for as long as results are read, for example DURQ["KEEP_FINISHED"] = '
                    'timedelta(days=1), or "keep_finished" per queue in DURQ["QUEUES"].',
                    id="durq.E101",
                )
            )
        return messages

    def _option_problems(self, label: str) -> list[checks.CheckMessage]:
        problems: list[checks.CheckMessage] = []
        options = self.options if isinstance(self.options, dict) else {}
        unknown = sorted(set(options) - _KNOWN_OPTIONS)
        if not isinstance(self.options, dict) or unknown:
            problems.append(
                checks.Error(
                    f'{label}["OPTIONS"] must be a dict with the keys {", ".join(sorted(_KNOWN_OPTIONS))}'
                    + (f"; unknown: {', '.join(map(str, unknown))}" if unknown else ""),
                    hint='Write for example "OPTIONS": {"MODULES": ["myproject.emails"]}.',
                    id="durq.E103",
                )
            )
        modules = options.get("MODULES", [])
        if not isinstance(modules, (list, tuple)) or not all(isinstance(module, str) for module in modules):
            problems.append(
                checks.Error(
                    f'{label}["OPTIONS"]["MODULES"] must be a list of module paths',
                    hint='Write for example ["myproject.emails"]; each app\'s tasks.py is imported anyway.',
                    id="durq.E103",
                )
            )
        return problems


def result_for_job(job: Job, task: Any, alias: str, *, copy_task: bool = True) -> Any:
    """The ``TaskResult`` a job row stands for.

    ``started_at`` and ``last_attempted_at`` are both the start of the latest attempt: durq keeps
    one start time per job. ``errors`` has one entry per failed attempt, ``worker_ids`` one per
    attempt. With ``copy_task`` the result's task carries the row's queue and priority.
    """
    status = STATUS_MAP[job.status]
    entries = job.error_list
    errors = [_task_error(entry) for entry in entries if isinstance(entry, dict)]
    if job.status == "cancelled" and not any(entry.get("kind") == "cancelled" for entry in entries if isinstance(entry, dict)):
        errors.append(TaskError(exception_class_path=_CANCELLED, traceback=f"{_CANCELLED}: cancelled before it ran"))
    if copy_task:
        run_after = _datetime(job.run_at_ms) if job.run_at_ms > job.created_ms else None
        task = _copy_task(task, queue_name=job.queue, priority=job.priority, run_after=run_after, backend=alias)
    result: Any = TaskResult(
        task=task,
        id=str(job.pk),
        status=status,
        enqueued_at=_datetime(job.created_ms),
        started_at=_datetime(job.started_ms),
        finished_at=_datetime(job.finished_ms) if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None,
        last_attempted_at=_datetime(job.started_ms),
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


def task_context(result: Any, ctx: JobContext) -> DurqTaskContext:
    return DurqTaskContext(task_result=result, job_context=ctx)


# --- helpers ---------------------------------------------------------------------------------

_CANCELLED = f"{TaskCancelled.__module__}.{TaskCancelled.__qualname__}"

# What a durq failure kind stands for, as the exception class path Django reports.
_KIND_CLASSES = {
    "retry": "django_durq.exceptions.Retry",
    "timeout": "builtins.TimeoutError",
    "lease_expired": "django_durq.exceptions.LeaseLost",
    "unknown_job": "django_durq.exceptions.UnknownJobType",
    "cancelled": _CANCELLED,
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


def _datetime(ms: int | None) -> datetime | None:
    value = ms_to_datetime(ms)
    if value is not None and not django_settings.USE_TZ:
        return timezone.make_naive(value)
    return value


def _keep_finished_ms(queue: str) -> int:
    settings = get_settings()
    own = settings.queue(queue).keep_finished_ms
    return own if own is not None else settings.keep_finished_ms


def _validate_options(task: DurqTask) -> None:
    attempts = task.max_attempts
    if attempts is not None and (isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1):
        raise InvalidTask(f"max_attempts must be a whole number of at least 1, not {attempts!r}")
    unique = task.unique
    if unique is not None and (not isinstance(unique, str) or not unique or len(unique) > 255):
        raise InvalidTask("unique must be a non-empty string of at most 255 characters")
    for key in ("lease", "timeout"):
        value = getattr(task, key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)) or seconds_to_ms(value) < 1:
            raise InvalidTask(f"{key} must be a positive number of seconds or a timedelta, not {value!r}")
    if task.lease is not None:
        heartbeat_ms = get_settings().heartbeat_interval_ms
        if seconds_to_ms(task.lease) < 2 * heartbeat_ms:
            raise InvalidTask(
                f"lease must be at least two heartbeat intervals ({2 * heartbeat_ms / 1000:g} s), "
                'or one late heartbeat loses it; raise it or lower DURQ["HEARTBEAT_INTERVAL"]'
            )
