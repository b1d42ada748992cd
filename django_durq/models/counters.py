"""The metrics view's monotonic counts (db/counters.py writes and sums them)."""

from __future__ import annotations

from django.db import models


class Counter(models.Model):
    """A monotonic count (a ``_total`` counter, a histogram's bucket or sum) of one writer, queue and job type.

    A writer (a thread of a worker or of the application) adds to its own rows in the
    transaction that commits what they count (db/counters.py), so no row is shared by every
    worker and a count is never lost or doubled. The metrics view sums every writer's rows;
    rows left idle are folded into the writer ``""``, so that totals never decrease.
    """

    writer = models.CharField(max_length=200, help_text='host:pid:thread; "" holds the folded counts of writers gone.')
    queue = models.CharField(max_length=100)
    job_name = models.CharField(max_length=200)
    metric = models.CharField(max_length=40)
    value = models.BigIntegerField()
    updated_ms = models.BigIntegerField()

    class Meta:
        db_table = "durq_counter"
        constraints = [models.UniqueConstraint(fields=["writer", "queue", "job_name", "metric"], name="durq_counter_key")]

    def __str__(self) -> str:
        return f"{self.metric}{{{self.queue}, {self.job_name}}} of {self.writer or 'writers gone'}"
