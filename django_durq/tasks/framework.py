"""Django's tasks framework, from wherever this Django has it: the one place that knows.

Django 6.0+ ships it as ``django.tasks``; on Django 5.2 the ``django-tasks`` backport provides
the same API as ``django_tasks``, and is used when ``django.tasks`` is absent.
"""

from __future__ import annotations

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
        from django_tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[no-redef,assignment]
        from django_tasks.utils import normalize_json  # type: ignore[no-redef,assignment]
    except ImportError as error:
        raise ImportError(
            "django_durq.tasks.backend.DurqBackend needs Django's tasks framework: Django >= 6.0, "
            "or on Django 5.2 the backport (pip install django-tasks)"
        ) from error

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_enqueued",
    "task_finished",
    "task_started",
]
