"""A job's statuses and the QuerySet that reads jobs by them (``Job.objects``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models

if TYPE_CHECKING:
    from . import Job  # noqa: F401 - the QuerySet's "Job" below


class Status(models.TextChoices):
    WAITING = "waiting", "Waiting"
    # A job of a workflow that waits for upstream jobs to end (see workflows.py). Every claim takes
    # only 'waiting' rows, so no due time, whoever writes it, can start a blocked job: the
    # transaction that counts its last upstream end turns it 'waiting' (db/dependencies.py).
    BLOCKED = "blocked", "Blocked"
    RUNNING = "running", "Running"
    FINISHED = "finished", "Finished"
    DEAD = "dead", "Dead"
    CANCELLED = "cancelled", "Cancelled"


# Not ended yet: such a job holds its dedupe key and can be cancelled.
ACTIVE_STATUSES = (Status.WAITING, Status.BLOCKED, Status.RUNNING)


class JobQuerySet(models.QuerySet["Job"]):
    def in_queue(self, queue: str) -> JobQuerySet:
        return self.filter(queue=queue)

    def active(self) -> JobQuerySet:
        return self.filter(status__in=ACTIVE_STATUSES)

    def waiting(self) -> JobQuerySet:
        return self.filter(status=Status.WAITING)

    def blocked(self) -> JobQuerySet:
        return self.filter(status=Status.BLOCKED)

    def due(self, now_ms: int) -> JobQuerySet:
        return self.filter(status=Status.WAITING, run_at_ms__lte=now_ms)

    def delayed(self, now_ms: int) -> JobQuerySet:
        return self.filter(status=Status.WAITING, run_at_ms__gt=now_ms)

    def running(self) -> JobQuerySet:
        return self.filter(status=Status.RUNNING)

    def dead(self) -> JobQuerySet:
        # A dead job always has finished_ms; saying so lets SQLite and PostgreSQL use the index
        # on (status, finished_ms), which holds only rows that have one.
        return self.filter(status=Status.DEAD, finished_ms__isnull=False)

    def finished(self) -> JobQuerySet:
        return self.filter(status=Status.FINISHED)
