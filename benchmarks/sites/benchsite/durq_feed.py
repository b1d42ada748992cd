"""Jobs for django-durq's scaling and bloat workloads, queued with ``enqueue_many``.

``hold``: a batch due a day from now, so that the harness can make every job due at one instant
once all the worker processes it started are up (one UPDATE of ``run_at_ms``).
``feed``: a stream in batches at ``rate`` jobs a second at most, keeping at most ``backlog`` jobs
waiting (it counts the jobs that started from $BENCH_TICKS): the table then holds a small queue
while many jobs pass through it, as in production, and what it grows beyond that is bloat.
"""

import os
import time

HOLD_S = 86_400
TICK_BYTES = 16  # one record of benchsite/tick.py


def hold(n, chunk):
    from bench_durq.jobs import noop

    held = noop.using(run_in=HOLD_S)
    started = time.perf_counter()
    for offset in range(0, n, chunk):
        held.enqueue_many([{"i": i} for i in range(offset, min(n, offset + chunk))])
    return {"n": n, "seconds": time.perf_counter() - started}


def _started_jobs(path):
    try:
        return os.stat(path).st_size // TICK_BYTES
    except FileNotFoundError:
        return 0


def feed(n, batch, backlog, rate):
    from bench_durq.jobs import noop

    ticks = os.environ["BENCH_TICKS"]
    enqueued = 0
    enqueue_s = 0.0
    started = time.perf_counter()
    while enqueued < n:
        size = min(batch, n - enqueued)
        ahead = rate and enqueued + size > rate * (time.perf_counter() - started) + batch
        if ahead or enqueued - _started_jobs(ticks) + size > backlog:
            time.sleep(0.005)
            continue
        t0 = time.perf_counter()
        noop.enqueue_many([{"i": i} for i in range(enqueued, enqueued + size)])
        enqueue_s += time.perf_counter() - t0
        enqueued += size
    seconds = time.perf_counter() - started
    return {"n": n, "seconds": seconds, "jobs_per_s": n / seconds, "enqueue_seconds": enqueue_s}
