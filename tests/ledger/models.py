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
