"""django-durq: ``enqueue()`` in autocommit (one transaction each) and ``enqueue_many()``.

``BENCH_DURQ_JOB=keyed`` queues jobs with a per-key limit instead of plain ones (the limits workload).
"""

import os

from .jobs import keyed, noop

BULK_METHOD = "enqueue_many()"
JOB = keyed if os.environ.get("BENCH_DURQ_JOB") == "keyed" else noop


def enqueue_one(i):
    JOB.enqueue(i=i)


def enqueue_bulk(numbers):
    JOB.enqueue_many([{"i": i} for i in numbers])
