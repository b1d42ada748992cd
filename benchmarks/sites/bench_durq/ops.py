"""django-durq: ``enqueue()`` in autocommit (one transaction each) and ``enqueue_many()``."""

from .jobs import noop

BULK_METHOD = "enqueue_many()"


def enqueue_one(i):
    noop.enqueue(i=i)


def enqueue_bulk(numbers):
    noop.enqueue_many([{"i": i} for i in numbers])
