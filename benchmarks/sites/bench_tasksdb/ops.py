"""django-tasks-db: ``task.enqueue()``; Django's task API has no bulk call, so "bulk" is a loop in one transaction."""

from django.db import transaction

from .tasks import noop

BULK_METHOD = "enqueue() loop in one transaction.atomic()"


def enqueue_one(i):
    noop.enqueue(i=i)


def enqueue_bulk(numbers):
    with transaction.atomic():
        for i in numbers:
            noop.enqueue(i=i)
