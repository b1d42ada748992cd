"""The tables of workflows: one row per workflow, one per edge between two of its jobs."""

from __future__ import annotations

from django.db import models


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
