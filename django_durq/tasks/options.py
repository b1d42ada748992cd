"""durq's own options on a Django task: ``DurqTask`` and ``durq_options()``.

A Django task gets one attempt, as Django's own backends give it; retries are asked for, per
task (``max_attempts`` here) or per backend (``TASKS[...]["OPTIONS"]["MAX_ATTEMPTS"]``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, cast

from ..clock import seconds_to_ms
from ..conf import get_settings
from . import bridge as tasks_bridge
from .framework import InvalidTask, Task

__all__ = ["DEFAULT_MAX_ATTEMPTS", "DurqTask", "durq_options", "max_attempts_problem", "validate_options"]

DEFAULT_MAX_ATTEMPTS = 1


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DurqTask(Task):  # type: ignore[misc]
    """The ``task_class`` of ``DurqBackend``: a Django ``Task`` with durq's own options.

    ``max_attempts`` (attempts before the task fails for good; ``None`` means the backend's
    ``OPTIONS["MAX_ATTEMPTS"]``, one attempt unless set), ``unique`` (a dedupe key: while a task
    with this key is waiting or running, enqueueing another returns that one), ``lease`` and
    ``timeout`` (seconds or a timedelta; ``None`` means durq's default). On Django 6.1 they are
    keyword arguments of ``@task``; on every version ``using()`` and :func:`durq_options` set them.
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
                "put it above @task, and point the task's backend at django_durq.tasks.backend.DurqBackend"
            )
        configured = task.using(max_attempts=max_attempts, unique=unique, lease=lease, timeout=timeout)
        tasks_bridge.register(configured, replace=True)
        return configured

    return apply


def max_attempts_problem(value: Any) -> str | None:
    """Why ``value`` is not a number of attempts, or None when it is one."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"must be a whole number of at least 1, not {value!r}"
    return None


def validate_options(task: DurqTask) -> None:
    """``InvalidTask`` for a durq option a job could not be queued with."""
    if task.max_attempts is not None and (problem := max_attempts_problem(task.max_attempts)):
        raise InvalidTask(f"max_attempts {problem}")
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
