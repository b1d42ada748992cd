"""django-durq: a durable job queue that lives in your Django database.

Public API: ``job`` (decorator), ``Limit``, ``Workflow``, ``enqueue``, ``schedule``, ``JobContext``, ``Retry``, ``Abort``,
``InvalidPayload``, ``UnknownJobType``, ``exclusivity``. Importing this package loads no model.
"""

from typing import TYPE_CHECKING, Any

from .db import exclusivity as database_exclusivity
from .enqueue import enqueue
from .enqueue.workflows import Workflow, WorkflowError
from .exceptions import Abort, DurqError, InvalidPayload, LeaseLost, Retry, UnknownJobType
from .handlers.context import JobContext
from .handlers.limits import Limit
from .handlers.registry import JobDefinition, job

if TYPE_CHECKING:
    from .schedules import ScheduleSpec

__version__ = "0.1.0"

__all__ = [
    "Abort",
    "DurqError",
    "InvalidPayload",
    "JobContext",
    "JobDefinition",
    "LeaseLost",
    "Limit",
    "Retry",
    "UnknownJobType",
    "Workflow",
    "WorkflowError",
    "enqueue",
    "exclusivity",
    "job",
    "schedule",
]


def exclusivity(alias: str | None = None) -> str:
    """Which claimers the queue's database keeps apart, in plain words."""
    return database_exclusivity(alias)


def schedule(
    name: str,
    cron: str,
    job: str | JobDefinition,
    *,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    missed: str = "collapse",
    timezone: str = "UTC",
) -> "ScheduleSpec":
    """Run ``job`` at each due time of ``cron`` in ``timezone``, on exactly one worker (docs/cron.md)."""
    from .schedules import schedule as declare  # app loading: schedules import models

    return declare(name, cron, job, kwargs=kwargs, queue=queue, priority=priority, missed=missed, timezone=timezone)
