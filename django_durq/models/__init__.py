"""The queue's tables: jobs, live worker processes, cron schedule state, duty leases, per-minute counts.

Times are integer epoch milliseconds (see ``clock.py``). The hot statements (claim, renew,
complete) are raw SQL in ``db/``; this package holds the schema and a readable QuerySet vocabulary
for everything else (admin, ops, tests). The statuses and the QuerySet are in ``statuses.py``, the
flow-control tables in ``flow.py``, the workflows' in ``workflows.py``, the metrics' counts in
``counters.py``; every name is importable from here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.db import models
from django.db.models import Case, F, Q, When

from ..clock import ms_to_datetime

# The tables and names of the other modules here, importable from django_durq.models as Django's apps expect.
from .counters import Counter as Counter
from .flow import JobStart as JobStart
from .flow import LimitPlace as LimitPlace
from .flow import QueueControl as QueueControl
from .statuses import ACTIVE_STATUSES as ACTIVE_STATUSES
from .statuses import JobQuerySet as JobQuerySet
from .statuses import Status as Status
from .workflows import Dependency as Dependency
from .workflows import Workflow as Workflow

# How ``Job.wait()`` reads a result: ``apps.ready()`` hands in ``enqueue.results.result`` (an
# operation, which the vocabulary must not import).
_result_reader: dict[str, Callable[..., Any]] = {}


def hand_in_result_reader(read: Callable[..., Any]) -> None:
    _result_reader["read"] = read


class Job(models.Model):
    name = models.CharField(max_length=200, help_text="Registered job name; resolved through the registry only.")
    queue = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0, help_text="Higher runs first.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.WAITING)
    arguments = models.TextField(help_text='JSON: {"args": [...], "kwargs": {...}}.')
    result = models.TextField(null=True, blank=True, help_text="JSON return value, kept while finished jobs are retained.")
    attempts = models.PositiveIntegerField(default=0, help_text="Claims so far; counted at claim.")
    max_attempts = models.PositiveIntegerField(default=5)
    run_at_ms = models.BigIntegerField(help_text="Due time: not claimed before it.")
    created_ms = models.BigIntegerField()
    started_ms = models.BigIntegerField(null=True, blank=True, help_text="Start of the latest attempt.")
    finished_ms = models.BigIntegerField(null=True, blank=True, help_text="When it became finished, dead or cancelled.")
    lease_ms = models.PositiveIntegerField(help_text="Lease length granted at each claim.")
    lease_expires_ms = models.BigIntegerField(null=True, blank=True)
    timeout_ms = models.PositiveIntegerField(null=True, blank=True)
    claim_token = models.BigIntegerField(default=0, help_text="Fencing token: incremented at each claim.")
    claimed_by = models.CharField(max_length=200, blank=True, default="", help_text="Worker holding (or last holding) the lease.")
    reclaimed_from = models.CharField(
        max_length=200, null=True, blank=True, help_text="Set by a claim that took over an expired lease."
    )
    stop_requested = models.BooleanField(default=False, help_text="Cooperative stop asked by an operator.")
    handbacks = models.PositiveIntegerField(
        default=0, db_default=0, help_text="Started attempts handed back at a worker's stop; bounded by MAX_HANDBACKS."
    )
    progress_done = models.BigIntegerField(null=True, blank=True)
    progress_total = models.BigIntegerField(null=True, blank=True)
    errors = models.TextField(default="[]", help_text="JSON list: one entry per failed attempt.")
    unique_key = models.CharField(max_length=255, null=True, blank=True, help_text="Dedupe key.")
    # Only rows queued by Django's tasks framework set these two (see task_results.py).
    result_key = models.BigIntegerField(null=True, blank=True, help_text="Random part of the task's result id.")
    run_after_us = models.BigIntegerField(
        null=True, blank=True, help_text="The task's run_after in epoch microseconds; NULL when it had none."
    )
    # Flow control (see limits.py): the key whose limits this job counts against, the most jobs of
    # that key that may run at once, and the most that may start per period. NULL: no limit.
    limit_key = models.CharField(max_length=255, null=True, blank=True, help_text="Flow-control key (limits.Limit).")
    limit_running = models.PositiveIntegerField(null=True, blank=True, help_text="At most this many of the key run at once.")
    limit_rate = models.PositiveIntegerField(null=True, blank=True, help_text="At most this many of the key start per period.")
    limit_period_ms = models.PositiveIntegerField(null=True, blank=True)
    # Workflows (see workflows.py): the workflow the job belongs to, how many of the jobs it waits
    # for have not ended yet (it is 'blocked' while this is above 0), how many jobs wait for it,
    # and what it does when one it waits for ends dead or cancelled. NULL for a
    # job outside any workflow (and nullable so that SQLite adds the columns without rebuilding
    # the table, which would lose the partial indexes of migrations 0002 and 0005).
    workflow_id = models.BigIntegerField(null=True, blank=True, help_text="The workflow this job belongs to.")
    deps_left = models.PositiveIntegerField(null=True, blank=True, help_text="Jobs it waits for that have not ended.")
    dependents = models.PositiveIntegerField(null=True, blank=True, help_text="Jobs that wait for it.")
    on_failure = models.CharField(
        max_length=6, null=True, blank=True, help_text="When a job it waits for fails: cancel (default) or run."
    )
    cancelled_by = models.BigIntegerField(
        null=True, blank=True, help_text="The job whose failure cancelled this one; retrying that job brings it back."
    )
    # The dedupe key while the job is active (waiting, blocked or running), NULL otherwise. A
    # plain unique index on this column gives "one active job per key" on every database, MariaDB
    # included (it has no partial indexes, and Django drops a conditional UniqueConstraint there
    # with models.W036). Dead and finished jobs map to NULL, so a failure never owns a key forever.
    unique_active = models.GeneratedField(
        expression=Case(When(status__in=["waiting", "blocked", "running"], then=F("unique_key")), default=None),
        output_field=models.CharField(max_length=255, null=True),
        db_persist=True,
    )
    # A job no worker has started by then is ended cancelled, never run (see expiry in db/expiry.py).
    expires_ms = models.BigIntegerField(null=True, blank=True, help_text="Not started by then: cancelled, never run.")
    # The enqueuing span's context (W3C trace context as JSON), restored around the handler when
    # OpenTelemetry is installed (execution/tracing.py); NULL otherwise.
    trace_context = models.TextField(null=True, blank=True, help_text="The enqueuing trace's context.")

    objects: ClassVar[models.Manager[Job]] = JobQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        db_table = "durq_job"
        indexes = [
            # Serves the claim: per queue and status, highest priority first, then earliest due.
            models.Index(fields=["queue", "status", "-priority", "run_at_ms", "id"], name="durq_job_claim"),
            # Serves "when is the next job due" (the idle probe) without scanning priorities.
            models.Index(fields=["queue", "status", "run_at_ms"], name="durq_job_due"),
            # Serves the dead-letter page, retention and purge by age. On SQLite and PostgreSQL
            # it holds only finished, dead and cancelled rows (migration 0002).
            models.Index(fields=["status", "finished_ms"], name="durq_job_status_finished"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["unique_active"], name="durq_job_unique_active"),
            models.CheckConstraint(condition=Q(status__in=Status.values), name="durq_job_status_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.name}#{self.pk} ({self.status})"

    # Set on the Job an enqueue returns: its dedupe key was held, so this is the holder
    # (deduplicated), which that enqueue changed (replaced: on_duplicate "replace"/"reschedule").
    deduplicated: bool = False
    replaced: bool = False

    @property
    def state(self) -> str:
        """The status in words: ``blocked (waiting for 2 upstream)`` for a job held back by its workflow."""
        if self.status == Status.BLOCKED:
            return f"blocked (waiting for {self.deps_left or 0} upstream)"
        return str(self.status)

    @property
    def args(self) -> list[Any]:
        return list(json.loads(self.arguments)["args"])

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(json.loads(self.arguments)["kwargs"])

    @property
    def error_list(self) -> list[dict[str, Any]]:
        return list(json.loads(self.errors or "[]"))

    @property
    def last_error(self) -> dict[str, Any] | None:
        errors = self.error_list
        return errors[-1] if errors else None

    @property
    def run_at(self) -> datetime | None:
        return ms_to_datetime(self.run_at_ms)

    @property
    def created_at(self) -> datetime | None:
        return ms_to_datetime(self.created_ms)

    @property
    def started_at(self) -> datetime | None:
        return ms_to_datetime(self.started_ms)

    @property
    def finished_at(self) -> datetime | None:
        return ms_to_datetime(self.finished_ms)

    @property
    def lease_expires_at(self) -> datetime | None:
        return ms_to_datetime(self.lease_expires_ms)

    @property
    def expires_at(self) -> datetime | None:
        return ms_to_datetime(self.expires_ms)

    def wait(self, timeout: float | timedelta) -> Any:
        """Wait up to ``timeout`` for this job to end; its return value (see ``django_durq.result``)."""
        return _result_reader["read"](self, timeout=timeout)


class DeadLetter(Job):
    """Dead jobs (attempts used up, or aborted) as their own admin page with retry and purge."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"
        verbose_name_plural = "dead letters"


class WorkerProcess(models.Model):
    """One row per live ``durq_worker`` process; removed at clean exit, stale rows age out."""

    worker_id = models.CharField(max_length=200, primary_key=True)
    host = models.CharField(max_length=200)
    pid = models.IntegerField()
    queues = models.TextField(help_text="JSON object: queue name -> pool size.")
    started_ms = models.BigIntegerField()
    last_seen_ms = models.BigIntegerField()
    jobs_done = models.BigIntegerField(default=0)
    holds_lock = models.BooleanField(
        default=False, help_text="Its process holds a presence lock (a file's, a database session's); else it writes heartbeats."
    )
    beat_ms = models.IntegerField(
        null=True,
        blank=True,
        help_text="Holding no lock, it writes last_seen_ms this often (ms); silent far longer, it is gone.",
    )

    class Meta:
        db_table = "durq_worker"

    def __str__(self) -> str:
        return self.worker_id


class Schedule(models.Model):
    """Claim state of one cron schedule: the next due time is taken by compare-and-set."""

    name = models.CharField(max_length=200, primary_key=True)
    cron = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64, default="UTC")
    next_due_ms = models.BigIntegerField()
    last_due_ms = models.BigIntegerField(null=True, blank=True)
    last_job_id = models.BigIntegerField(null=True, blank=True)
    updated_ms = models.BigIntegerField()

    class Meta:
        db_table = "durq_schedule"

    def __str__(self) -> str:
        return self.name


class DutyLease(models.Model):
    """Which worker runs a maintenance duty (cron, pruning) right now: one per database."""

    name = models.CharField(max_length=100, primary_key=True)
    holder = models.CharField(max_length=200)
    expires_ms = models.BigIntegerField()

    class Meta:
        db_table = "durq_duty_lease"

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder}"


class QueueStat(models.Model):
    """Jobs finished, failed, buried and handed back for an unknown type per queue per minute, for the dashboard and stats."""

    queue = models.CharField(max_length=100)
    minute_ms = models.BigIntegerField()
    finished = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    dead = models.BigIntegerField(default=0)
    unknown_type = models.BigIntegerField(
        default=0, db_default=0, help_text="Jobs handed back by a worker that had no handler for their type."
    )

    class Meta:
        db_table = "durq_queue_stat"
        constraints = [models.UniqueConstraint(fields=["queue", "minute_ms"], name="durq_queue_stat_minute")]

    def __str__(self) -> str:
        return f"{self.queue}@{self.minute_ms}"


class Queue(QueueStat):
    """The admin's Queues page: per-queue counts, workers and the last hour's throughput."""

    class Meta:
        proxy = True
        verbose_name = "queue"
        verbose_name_plural = "queues"
