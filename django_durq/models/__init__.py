"""The queue's tables: jobs, live worker processes, cron schedule state, duty leases, per-minute counts.

Times are integer epoch milliseconds (see ``clock.py``). The hot statements (claim, renew,
complete) are raw SQL in ``db/``; this module holds the schema and a readable QuerySet vocabulary
for everything else (admin, ops, tests).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.db import models
from django.db.models import Case, F, Q, When

from .clock import ms_to_datetime

# How ``Job.wait()`` reads a result: ``apps.ready()`` hands in ``enqueue.results.result`` (an
# operation, which the vocabulary must not import).
_result_reader: dict[str, Callable[..., Any]] = {}


def hand_in_result_reader(read: Callable[..., Any]) -> None:
    _result_reader["read"] = read


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


class QueueControl(models.Model):
    """A queue's flow-control state, shared by every worker: paused, and whether claims take its gate.

    A row exists once a queue was paused or got a job with a limit; no row means "not paused,
    no limited jobs". Claims of a limited queue lock this row first, so that workers counting
    places and recent starts take turns; the row ``:keys`` is the turn of every limited claim
    (see db/gates.py).
    """

    queue = models.CharField(max_length=100, primary_key=True)
    paused = models.BooleanField(default=False)
    paused_ms = models.BigIntegerField(null=True, blank=True, help_text="When it was paused.")
    limited = models.BooleanField(default=False, help_text="A job with a limit was queued here: claims take turns.")
    updated_ms = models.BigIntegerField()
    # The last pause or resume, as an operator gave it (ops.pause, ops.resume): when, who and why.
    # NULL on a row no operator switched; nullable, so that adding them rewrites no table.
    switched_ms = models.BigIntegerField(null=True, blank=True, help_text="When it was last paused or resumed.")
    switched_by = models.CharField(max_length=150, null=True, blank=True, help_text="Who paused or resumed it last.")
    switch_reason = models.CharField(max_length=500, null=True, blank=True, help_text="Why, in their words.")

    class Meta:
        db_table = "durq_queue_control"

    def __str__(self) -> str:
        return f"{self.queue} ({'paused' if self.paused else 'running'})"


class JobStart(models.Model):
    """One start of a rate-limited job: the sliding window of a rate limit counts these rows.

    ``scope`` is ``q:<queue>`` for a queue's rate or ``key:<key>`` for a key's, whatever the
    queue. ``period_ms`` is the longest window counted on the scope when the row was written; the
    newest row carries it on, and the scope's rows are kept that long (see ``db/starts.py``).
    """

    scope = models.CharField(max_length=400)
    started_ms = models.BigIntegerField()
    period_ms = models.BigIntegerField(null=True, blank=True, help_text="How long the scope's starts are kept.")

    class Meta:
        db_table = "durq_start"
        indexes = [models.Index(fields=["scope", "started_ms"], name="durq_start_window")]

    def __str__(self) -> str:
        return f"{self.scope}@{self.started_ms}"


class Workflow(models.Model):
    """Jobs queued together, some waiting for others (see workflows.py): one row per workflow."""

    name = models.CharField(max_length=200)
    created_ms = models.BigIntegerField()
    on_failure = models.CharField(max_length=6, default="cancel", help_text="The default for its jobs: cancel or run.")

    class Meta:
        db_table = "durq_workflow"

    def __str__(self) -> str:
        return f"{self.name}#{self.pk}"


class Dependency(models.Model):
    """Job ``job_id`` waits for job ``depends_on_id`` to end; ``settled`` once that end was counted.

    Each edge is counted once, by compare-and-set on ``settled``: a job that ended is never
    counted twice by its dependents, whichever worker or sweep sees it end.
    """

    job_id = models.BigIntegerField()
    depends_on_id = models.BigIntegerField()
    settled = models.BooleanField(default=False)

    class Meta:
        db_table = "durq_dependency"
        indexes = [
            models.Index(fields=["job_id"], name="durq_dependency_job"),
            models.Index(fields=["depends_on_id", "settled"], name="durq_dependency_upstream"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} after {self.depends_on_id}"


class LimitPlace(models.Model):
    """A place under a limit, held by one handler of a limited job from its claim until its thread ends.

    The limited claim counts these rows, never rows whose status is ``running``: a handler whose
    attempt was settled without it (a timeout, a lapsed lease) still runs, and still holds its
    key's and its queue's place. A place of a worker process that has ended is freed by the
    maintenance duty that removes the worker's row (see ``db/places.py``).
    """

    job_id = models.BigIntegerField()
    claim_token = models.BigIntegerField()
    queue = models.CharField(max_length=100)
    limit_key = models.CharField(max_length=255, null=True, blank=True)
    limit_running = models.PositiveIntegerField(null=True, blank=True, help_text="The job's own limit on its key.")
    worker_id = models.CharField(max_length=200)
    taken_ms = models.BigIntegerField()

    class Meta:
        db_table = "durq_limit_place"
        # No index but the attempt's: a claim reads the whole table (as small as what runs under
        # limits), and every index would cost each place taken and freed.
        constraints = [models.UniqueConstraint(fields=["job_id", "claim_token"], name="durq_limit_place_attempt")]

    def __str__(self) -> str:
        return f"{self.limit_key or self.queue} held by job {self.job_id}#{self.claim_token}"
