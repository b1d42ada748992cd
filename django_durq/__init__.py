"""django-durq: a durable job queue that lives in your Django database.

Public API: ``job`` (decorator), ``Limit``, ``Workflow``, ``enqueue``, ``result``, ``schedule``, ``JobContext``, ``Retry``,
``Abort``, ``InvalidPayload``, ``UnknownJobType``, the errors of ``result`` (``JobFailed``, ``JobCancelled``,
``JobExpired``, ``ResultTimeout``, ``ResultNotKept``), ``exclusivity``. Importing this package loads no model.
"""

from typing import TYPE_CHECKING, Any

from .db import exclusivity as database_exclusivity
from .enqueue import enqueue
from .enqueue.results import JobCancelled, JobExpired, JobFailed, ResultNotKept, ResultTimeout, result
from .enqueue.workflows import Workflow, WorkflowError
from .exceptions import Abort, DurqError, InvalidPayload, LeaseLost, Retry, UnknownJobType
from .handlers.context import JobContext
from .handlers.limits import Limit
from .handlers.registry import JobDefinition, job

if TYPE_CHECKING:
    from datetime import timedelta

    from .schedules import ScheduleSpec

__version__ = "0.1.0"

__all__ = [
    "Abort",
    "DurqError",
    "InvalidPayload",
    "JobCancelled",
    "JobContext",
    "JobDefinition",
    "JobExpired",
    "JobFailed",
    "LeaseLost",
    "Limit",
    "ResultNotKept",
    "ResultTimeout",
    "Retry",
    "UnknownJobType",
    "Workflow",
    "WorkflowError",
    "enqueue",
    "exclusivity",
    "job",
    "result",
    "schedule",
]


def exclusivity(alias: str | None = None) -> str:
    """Which claimers the queue's database keeps apart, in plain words."""
    return database_exclusivity(alias)


def schedule(
    name: str,
    cron: str | None = None,
    job: str | JobDefinition | None = None,
    *,
    every: "timedelta | float | None" = None,
    args: list[Any] | tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    missed: str = "collapse",
    timezone: str = "UTC",
) -> "ScheduleSpec":
    """Run ``job`` at each due time of ``cron`` in ``timezone``, or ``every`` so long, on exactly one worker.

    ``every`` is a timedelta or a number of seconds, whole seconds of at least one; give it
    instead of ``cron``. ``args`` and ``kwargs`` are each run's arguments. See docs/cron.md.
    """
    from .schedules import schedule as declare  # app loading: schedules import models

    return declare(
        name,
        cron,
        job,
        every=every,
        args=args,
        kwargs=kwargs,
        queue=queue,
        priority=priority,
        missed=missed,
        timezone=timezone,
    )
