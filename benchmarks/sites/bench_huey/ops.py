"""huey: calling the task enqueues it; huey has no bulk enqueue, so "bulk" is the same loop."""

from .tasks import noop

BULK_METHOD = "loop (no bulk API)"


def enqueue_one(i):
    noop(i=i)


def enqueue_bulk(numbers):
    for i in numbers:
        noop(i=i)
