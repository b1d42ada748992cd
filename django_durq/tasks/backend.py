"""A backend for Django's tasks framework: ``TASKS = {"default": {"BACKEND": "django_durq.tasks.backend.DurqBackend"}}``.

A ``Task.enqueue()`` inserts a durq job named after the task's ``module_path``, in the caller's
transaction, and ``durq_worker`` runs it with leases, dead letters and the admin. The result is
read back from the job row (``task_results``), so it lives as long as the row does: with this
backend configured, finished jobs are kept for a day unless ``DURQ["KEEP_FINISHED"]`` says
otherwise (see ``check()``).

This module imports no model at import time: Django builds the backend while it defines tasks,
which can happen before the app registry is ready.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core import checks
from django.utils import timezone

from ..conf import get_settings
from ..enqueue import enqueue_one
from . import bridge as tasks_bridge
from .arguments import normalized_arguments

# Each ``name as name`` below is read from here by tasks_bridge, which runs tasks on the worker.
from .context import DurqTaskContext
from .context import task_context as task_context
from .framework import BaseTaskBackend, InvalidTask, TaskResultDoesNotExist, task_enqueued
from .framework import normalize_json as normalize_json
from .framework import task_finished as task_finished
from .framework import task_started as task_started
from .options import DEFAULT_MAX_ATTEMPTS, DurqTask, durq_options, max_attempts_problem, validate_options
from .results import TaskCancelled, new_result_key, parse_result_id, result_for_job, result_key_of, run_after_us
from .results import finished_result as finished_result

__all__ = [
    "DurqBackend",
    "DurqTask",
    "DurqTaskContext",
    "TaskCancelled",
    "durq_options",
]

_MAX_NAME = 200  # Job.name
_KNOWN_OPTIONS = {"MAX_ATTEMPTS", "MODULES"}


class DurqBackend(BaseTaskBackend):  # type: ignore[misc]
    """Runs Django tasks as durq jobs.

    ``OPTIONS["MODULES"]`` lists modules, besides every installed app's ``tasks.py``, that
    define tasks and that workers must import; ``OPTIONS["MAX_ATTEMPTS"]`` gives every task of
    this backend that many attempts (one by default, as Django's own backends run a task once).
    """

    task_class = DurqTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        attempts: Any = self.options.get("MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS) if isinstance(self.options, dict) else None
        # A bad value is reported by check() (durq.E103); until it is fixed a task runs once.
        valid = isinstance(attempts, int) and max_attempts_problem(attempts) is None
        self.max_attempts: int = attempts if valid else DEFAULT_MAX_ATTEMPTS

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
            validate_options(task)
        try:
            tasks_bridge.register(task)
        except ValueError as error:
            raise InvalidTask(str(error)) from None

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)

        args = normalized_arguments(list(args), "args")
        kwargs = normalized_arguments(dict(kwargs), "kwargs")
        options: dict[str, Any] = {"queue": task.queue_name, "priority": task.priority, "max_attempts": self.max_attempts}
        columns: dict[str, Any] = {"result_key": new_result_key()}
        if task.run_after is not None:
            run_after = task.run_after
            options["run_at"] = run_after if timezone.is_aware(run_after) else timezone.make_aware(run_after)
            columns["run_after_us"] = run_after_us(run_after)
        if isinstance(task, DurqTask):
            for key in ("max_attempts", "unique", "lease", "timeout"):
                options[key] = getattr(task, key) or options.get(key)
        job = enqueue_one(tasks_bridge.definition_for(task).using(**options), args, kwargs, columns)
        if job.deduplicated:
            # Nothing was queued: the result is that of the task already holding the key.
            return result_for_job(job, tasks_bridge.task_named(job.name) or task, self.alias)
        result = result_for_job(job, task, self.alias, copy_task=False)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: Any) -> Any:
        """The result named by ``result_id``; ``TaskResultDoesNotExist`` for an id that is
        malformed, unknown, no longer kept, or not a task this process has imported."""
        from ..models import Job  # app loading: Django builds the backend before models load

        parsed = parse_result_id(result_id)
        job = Job.objects.using(get_settings().database).filter(pk=parsed[0]).first() if parsed is not None else None
        task = tasks_bridge.task_named(job.name) if job is not None else None
        if parsed is None or job is None or task is None or result_key_of(job) != parsed[1]:
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
                    hint='Remove DURQ["KEEP_FINISHED"] to keep them for a day, or keep them for as long as results '
                    'are read, for example timedelta(hours=6), or "keep_finished" per queue in DURQ["QUEUES"].',
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
                    hint='Write for example "OPTIONS": {"MODULES": ["myproject.emails"], "MAX_ATTEMPTS": 3}.',
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
        if "MAX_ATTEMPTS" in options and (problem := max_attempts_problem(options["MAX_ATTEMPTS"])):
            problems.append(
                checks.Error(
                    f'{label}["OPTIONS"]["MAX_ATTEMPTS"] {problem}',
                    hint="Write 1 to run each task once (the default), or more for retries with backoff.",
                    id="durq.E103",
                )
            )
        return problems


def _keep_finished_ms(queue: str) -> int:
    settings = get_settings()
    own = settings.queue(queue).keep_finished_ms
    return own if own is not None else settings.keep_finished_ms
