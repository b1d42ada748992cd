"""Run due jobs in this process, in this thread, with any clock: for tests and embedding.

``drain()`` uses the same claim, executor and fenced writes as ``durq_worker``, so a test that
moves a :class:`~django_durq.clock.ManualClock` exercises the real retry, backoff and
dead-letter logic without sleeping.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from functools import partial

from .clock import Clock, get_clock
from .conf import get_settings
from .db import places
from .db.store import Store
from .execution.executor import Executor
from .handlers.context import JobContext
from .models import Job


def drain(queue: str | None = None, clock: Clock | None = None, max_jobs: int = 100_000) -> Counter[str]:
    """Run every job due now (by ``clock``) until none is left; returns outcome counts.

    Jobs that a retry makes due later are left waiting: advance the clock and drain again. Limits
    hold as in a worker: a job its rate holds back waits for the clock too.
    """
    settings = get_settings()
    clock = clock or get_clock()
    store = Store(settings.database)
    worker_id = f"drain:{os.getpid()}:{threading.get_ident()}"
    outcomes: Counter[str] = Counter()
    executor = Executor(store, settings, clock, worker_id, count=lambda q, o, n=1: None)
    shutdown = threading.Event()
    while sum(outcomes.values()) < max_jobs:
        if queue is not None:
            queues = [queue]
        else:
            queues = sorted(set(Job.objects.using(settings.database).active().values_list("queue", flat=True)))
        ran = False
        for name in queues:
            # The limited claim runs jobs with and without limits alike (a worker's pool switches
            # to it once it meets one).
            for job in store.claim(name, 1, clock.now_ms(), worker_id, settings.queue(name).limits, clock):
                ctx = JobContext(job, worker_id=worker_id, store=store, clock=clock, shutdown=shutdown)
                try:
                    outcomes[executor.run(job, ctx)] += 1
                finally:
                    if job.placed:  # the handler has returned: a place row written for it meanwhile is free
                        store.retrying("free place", partial(places.free, leases=[ctx.lease]))
                ran = True
        if not ran:
            break
    return outcomes
