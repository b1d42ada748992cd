"""How durq workers run Django ``@task`` functions without importing paths stored in rows.

A queued Django task is a durq job named after the task's ``module_path``. The row only *names*
the task: no process imports a name it reads from the database, so a forged or stale row cannot
make a worker import or run arbitrary code. Each Task registers itself under that name when its
module is imported (``DurqBackend.validate_task``, which Django calls as ``@task`` builds the
Task), and every process imports the modules that define tasks once its apps are ready: each
installed app's ``tasks.py`` (as durq imports ``jobs.py``) and the modules listed in the
backend's ``OPTIONS["MODULES"]``. A job whose name was never registered fails like any unknown
job type, and ``get_result()`` does not report it.

Every Django task has the same durq handler, :func:`run_task`, which calls the task as Django's
own backends do and sends ``task_started``. ``task_finished`` is sent once the outcome is
recorded (durq's ``job_finished`` and ``job_dead`` signals), so its receivers read what is stored.
This module imports Django's tasks framework only when a task runs, so that it can be imported
(by ``apps.py``) on a Django without one.
"""

from __future__ import annotations

import logging
import threading
from importlib import import_module
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import autodiscover_modules

from ..conf import get_settings
from ..conf.tasks import _configured_modules
from ..handlers.context import JobContext
from ..handlers.registry import JobDefinition, registry
from ..signals import job_dead, job_finished

if TYPE_CHECKING:
    from ..models import Job

logger = logging.getLogger("django_durq")


_tasks: dict[str, Any] = {}  # job name -> the Task registered under it
_lock = threading.Lock()
# The running TaskResult of each task started in this process, by job id, until its outcome is
# announced: ``job_finished`` and ``job_dead`` are sent on the worker's events thread, not on the
# thread that ran the task. Bounded, so attempts that end without an announcement (a retry, a
# lost lease) cannot make it grow.
_running: dict[int, Any] = {}
_RUNNING_MAX = 10_000


def register(task: Any, *, replace: bool = False) -> None:
    """Let workers run ``task`` under its module path; ValueError when a ``@job`` owns that name.

    The job definition takes the task's queue, priority and durq options (its backend's
    ``MAX_ATTEMPTS`` when the task sets none) as its defaults, for jobs queued by name (a cron
    schedule). A ``using()`` copy of a registered task changes nothing; ``replace`` makes
    ``task`` the registered one (``durq_options`` does).
    """
    name = task.module_path
    with _lock:
        current = _tasks.get(name)
        if current is not None and current.func is task.func and registry.get(name) is not None and not replace:
            return
        definition = JobDefinition(
            run_task,
            name=name,
            queue=task.queue_name,
            priority=task.priority,
            max_attempts=getattr(task, "max_attempts", None) or getattr(task.get_backend(), "max_attempts", None),
            lease=getattr(task, "lease", None),
            timeout=getattr(task, "timeout", None),
            backoff=None,
            cron=None,
        )
        registry.add(definition)
        _tasks[name] = task
    # Connected with the first task only: without tasks, finishing a job sends no signal at all.
    job_finished.connect(_on_job_finished, dispatch_uid="django_durq.tasks.bridge.job_finished")
    job_dead.connect(_on_job_dead, dispatch_uid="django_durq.tasks.bridge.job_dead")


def task_named(name: str) -> Any | None:
    """The Task registered under a job name, or None."""
    return _tasks.get(name)


def definition_for(task: Any) -> JobDefinition:
    register(task)
    return registry.require(task.module_path)


def run_task(ctx: JobContext, *args: Any, **kwargs: Any) -> Any:
    """The durq handler of every Django task: call it as Django's backends do."""
    from .backend import (  # optional: the backend needs Django's tasks framework
        normalize_json,
        result_for_job,
        task_context,
        task_started,
    )

    task = _tasks[ctx.name]
    row = _row(ctx.job_id)
    if row is None:  # pragma: no cover - the row of a claimed job exists unless purged meanwhile
        raise LookupError(f"job {ctx.job_id} disappeared while it started")
    result = result_for_job(row, task, task.backend)
    with _lock:
        if len(_running) >= _RUNNING_MAX:
            _running.pop(next(iter(_running)))
        _running[ctx.job_id] = result
    task_started.send(sender=_sender(task), task_result=result)
    leading = (task_context(result, ctx),) if task.takes_context else ()
    return normalize_json(task.call(*leading, *args, **kwargs))


def _on_job_finished(sender: Any, *, job_id: int, name: str, result: Any = None, **kwargs: Any) -> None:
    task = _tasks.get(name)
    if task is None:
        return
    with _lock:
        running = _running.pop(job_id, None)
    _send_finished(task, job_id, running, result)


def _on_job_dead(sender: Any, *, job_id: int, name: str, **kwargs: Any) -> None:
    task = _tasks.get(name)
    with _lock:
        _running.pop(job_id, None)
    if task is not None:
        _send_finished(task, job_id, None, None)


def _send_finished(task: Any, job_id: int, running: Any, return_value: Any) -> None:
    """Send ``task_finished`` with the stored result, or, for a successful task whose job is not
    kept, with the running result turned successful.

    The outcome is already recorded when this runs, so nothing here may fail the worker: an
    error, in a receiver or in reading the row, is logged.
    """
    from .backend import finished_result, result_for_job, task_finished  # optional: the backend needs Django's tasks framework

    try:
        row = _row(job_id)
        if row is not None and row.status != "running":
            task_result = result_for_job(row, task, task.backend)
        elif running is not None:
            task_result = finished_result(running, return_value)
        else:
            return
        responses = task_finished.send_robust(sender=_sender(task), task_result=task_result)
    except Exception:
        logger.exception("durq: could not send task_finished for job %s", job_id)
        return
    for handler, response in responses:
        if isinstance(response, Exception):
            logger.error("durq: task_finished receiver %r raised", handler, exc_info=response)


def _sender(task: Any) -> type:
    return type(task.get_backend())


def _row(job_id: int) -> Job | None:
    from ..models import Job  # app loading: apps.py imports this module

    return Job.objects.using(get_settings().database).filter(pk=job_id).first()


# --- discovery -------------------------------------------------------------------------------


def autodiscover_tasks() -> None:
    """Import the modules that define tasks, when a ``TASKS`` backend is a DurqBackend."""
    modules = _configured_modules()
    if modules is None:
        return
    autodiscover_modules("tasks")
    for module in modules:
        import_module(module)
