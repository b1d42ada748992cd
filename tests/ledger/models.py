"""The ledger the test handlers write: one row per execution, to count lost and doubled jobs."""

from django.db import models


class Effect(models.Model):
    job_id = models.BigIntegerField(db_index=True)
    token = models.BigIntegerField()
    pid = models.IntegerField()
    started_ms = models.BigIntegerField()
    tag = models.CharField(max_length=100, blank=True, default="")


class Order(models.Model):
    """Stands for the application's own data in transactional-enqueue tests."""

    label = models.CharField(max_length=100)


class Span(models.Model):
    """One execution of a handler of the model-based chaos test (tests/faults/test_model_chaos.py).

    Written when the handler starts, completed when it returns: a row without ``end_us`` is a
    handler still running, or one whose process was killed. Start and end are the host's wall
    clock in epoch microseconds, which the workers, the test and the database server on this
    host share; ``claim_ms`` is the claim's time as the claim wrote it on the job's row (the
    queue's clock). The limit columns are the row's as the claim saw them.
    """

    job_id = models.BigIntegerField(db_index=True)
    token = models.BigIntegerField()
    attempt = models.IntegerField()
    pid = models.IntegerField()
    queue = models.CharField(max_length=100)
    key = models.CharField(max_length=255, blank=True, default="")
    limit_running = models.IntegerField(null=True)
    limit_rate = models.IntegerField(null=True)
    limit_period_ms = models.BigIntegerField(null=True)
    claim_ms = models.BigIntegerField(null=True)
    start_us = models.BigIntegerField()
    end_us = models.BigIntegerField(null=True)
    outcome = models.CharField(max_length=20, blank=True, default="")
    tag = models.CharField(max_length=100, blank=True, default="")
    # What the handler saw of its lease as it ran: "seen:until" pairs, comma-separated, each the
    # host's wall clock in epoch ms: when the handler read the context's ``confirmed_until``, and
    # the lease's end it gave (the claim's or a renewal's time + the lease, never after the end
    # the database then held). The checker's evidence of when the lease was last renewed.
    confirmed = models.TextField(blank=True, default="")
