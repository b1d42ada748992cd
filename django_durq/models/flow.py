"""The tables of flow control: a queue's pause and limits, the starts a rate counts, the places a limit holds."""

from __future__ import annotations

from django.db import models


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
    """Starts of rate-limited jobs, those of one claim on one scope: a rate's sliding window counts them.

    ``scope`` is ``q:<queue>`` for a queue's rate or ``key:<key>`` for a key's, whatever the
    queue. ``period_ms`` is the longest window counted on the scope when the row was written; the
    newest row carries it on, and the scope's rows are kept that long (see ``db/starts.py``).
    """

    scope = models.CharField(max_length=400)
    started_ms = models.BigIntegerField()
    period_ms = models.BigIntegerField(null=True, blank=True, help_text="How long the scope's starts are kept.")
    starts = models.PositiveIntegerField(default=1, db_default=1, help_text="How many jobs started at started_ms.")

    class Meta:
        db_table = "durq_start"
        indexes = [models.Index(fields=["scope", "started_ms"], name="durq_start_window")]

    def __str__(self) -> str:
        return f"{self.scope}@{self.started_ms}"


class LimitPlace(models.Model):
    """A place under a limit held by a handler of a limited job that outlived its attempt's row.

    A running attempt's row is its place. A handler whose attempt was settled without it (a
    timeout, a lapsed lease taken over or buried) still runs, and still holds its key's and its
    queue's place: this row, until its thread ends. A place of a worker process that has ended is
    freed by the maintenance duty that removes the worker's row (see ``db/places.py``).
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
        # No index but the attempt's: a claim reads the whole table (as small as the handlers that
        # outlived their attempts), and every index would cost each place taken and freed.
        constraints = [models.UniqueConstraint(fields=["job_id", "claim_token"], name="durq_limit_place_attempt")]

    def __str__(self) -> str:
        return f"{self.limit_key or self.queue} held by job {self.job_id}#{self.claim_token}"
