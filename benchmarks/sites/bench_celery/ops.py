"""Celery: ``task.delay()``; Celery has no bulk publish, so "bulk" is the same loop."""

import benchsite.celery_app  # noqa: F401 - binds shared tasks to the configured app

from .tasks import noop

BULK_METHOD = "loop (no bulk API)"


def enqueue_one(i):
    noop.delay(i=i)


def enqueue_bulk(numbers):
    for i in numbers:
        noop.delay(i=i)
