"""What the tasks-backend tests share: Django's tasks framework from wherever this Django has it, and
the job row behind a task result.

Importing this module skips the importing test module when no tasks framework is installed (Django
5.2 without the django-tasks backport).
"""

from __future__ import annotations

from typing import Any

import pytest

try:  # Django >= 6.0
    FRAMEWORK = "django.tasks"
    from django.tasks import TaskResultStatus, default_task_backend, task
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:
    try:  # Django 5.2 with the django-tasks backport
        FRAMEWORK = "django_tasks"
        from django_tasks import TaskResultStatus, default_task_backend, task
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
        from django_tasks.signals import task_enqueued, task_finished, task_started
    except ImportError:
        pytest.skip("no tasks framework: needs Django >= 6.0, or django-tasks on Django 5.2", allow_module_level=True)

from django_durq.models import Job

__all__ = [
    "FRAMEWORK",
    "InvalidTask",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "default_task_backend",
    "job_id",
    "row",
    "task",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def job_id(result: Any) -> int:
    """The id of the job behind a task result (its id is ``<job id>-<result key>``)."""
    return int(result.id.split("-")[0])


def row(result: Any) -> Job:
    return Job.objects.get(pk=job_id(result))
