"""Procrastinate: ``task.defer()`` and ``task.batch_defer()``."""

from .tasks import noop

BULK_METHOD = "batch_defer()"


def enqueue_one(i):
    noop.defer(i=i)


def enqueue_bulk(numbers):
    noop.batch_defer(*[{"i": i} for i in numbers])
