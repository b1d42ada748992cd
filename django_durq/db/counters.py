"""Monotonic counters and histograms for the metrics view, written with what they count.

Each count goes into ``durq_counter`` in the transaction that commits the outcome it counts (a
claim, a completion, a failure, an enqueue), so a process killed at any moment has counted
exactly what it committed: nothing lost, nothing twice. A row belongs to one writer (a thread of
one process, ``host:pid:thread``), one queue, one job type and one metric; no row is shared by
all workers, so writers never wait for each other's counts. A batch adds its counts in one
statement, aggregated per row.

The metrics view sums every writer's rows (one statement, so one snapshot). The maintenance
runner folds rows left idle for ``FOLD_IDLE_MS`` into the writer ``""`` in one transaction, so a
total never decreases and the table keeps one set of rows per live writer.

A histogram is stored as its buckets, each counting the observations above the bound before it
and up to its own (``wait_le:0.5``), and the sum of what was observed in milliseconds
(``wait_sum_ms``); the view makes them cumulative.
"""

from __future__ import annotations

import os
import socket
import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

from django.db import connections, transaction

from ..clock import now_ms as wall_now_ms
from ..conf import get_settings
from . import dialect_for
from .base import ClaimCount, ClaimedJob, Dialect, Lease

T = TypeVar("T")

# What the counters count, as the view names them ``durq_jobs_<name>_total``.
ENQUEUED = "enqueued"
STARTED = "started"  # claimed by a worker to run
FINISHED = "finished"
FAILED = "failed"  # an attempt failed, retried or not
RETRIED = "retried"  # a failed attempt was given another
DEAD = "dead"
CANCELLED = "cancelled"
HANDED_BACK = "handed_back"  # given back for another worker, attempt not counted
COUNTERS = (ENQUEUED, STARTED, FINISHED, FAILED, RETRIED, DEAD, CANCELLED, HANDED_BACK)

# Histograms: due to started (claimed), and handler start to outcome.
WAIT = "wait"
RUN = "run"
HISTOGRAMS = (WAIT, RUN)
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
INF = "+Inf"

# A writer's rows untouched this long are folded into the writer "" (a process that ended, a
# thread gone, or one idle that long: it makes its rows anew with its next count).
FOLD_IDLE_MS = 10 * 60 * 1000
FOLD_BATCH = 500

Row = tuple[str, str, str, int]  # (queue, job type, metric, amount)

_local = threading.local()


def writer() -> str:
    """This thread's writer name; a forked process gets its own."""
    pid = os.getpid()
    name: str | None = getattr(_local, "name", None)
    if name is None or getattr(_local, "pid", None) != pid:
        _local.pid = pid
        name = _local.name = f"{socket.gethostname()}:{pid}:{threading.get_native_id()}"
    return name


_BOUNDS = [f"{bound:g}" for bound in BUCKETS_S] + [INF]
_LE = {histogram: [f"{histogram}_le:{bound}" for bound in _BOUNDS] for histogram in HISTOGRAMS}
_SUM = {histogram: f"{histogram}_sum_ms" for histogram in HISTOGRAMS}
# The bounds in whole ms, as a claim that counts in SQL compares them (``claim_count``).
_WAIT_BOUNDS_MS = tuple(round(bound * 1000) for bound in BUCKETS_S)


def bucket(seconds: float) -> str:
    """The bound of the bucket an observation falls in: the first that is not below it."""
    return _BOUNDS[bisect_left(BUCKETS_S, seconds)]


def observed(histogram: str, queue: str, name: str, ms: float) -> list[Row]:
    ms = max(0.0, ms)
    return [(queue, name, _LE[histogram][bisect_left(BUCKETS_S, ms / 1000)], 1), (queue, name, _SUM[histogram], round(ms))]


def started(jobs: Sequence[ClaimedJob], now_ms: int) -> list[Row]:
    """A claim's counts: each job started, and how long after it was due."""
    rows: list[Row] = []
    for job in jobs:
        rows.append((job.queue, job.name, STARTED, 1))
        rows += observed(WAIT, job.queue, job.name, now_ms - job.run_at_ms)
    return rows


def ended(job: ClaimedJob, *metrics: str, run_ms: float | None = None) -> list[Row]:
    """An attempt's outcome: one count per metric, and its run time when its handler ran."""
    rows: list[Row] = [(job.queue, job.name, metric, 1) for metric in metrics]
    if run_ms is not None:
        rows += observed(RUN, job.queue, job.name, run_ms)
    return rows


def add(dialect: Dialect, rows: Iterable[Row]) -> None:
    """Add ``rows`` to this thread's own rows, in one statement, in the caller's transaction."""
    totals: Counter[tuple[str, str, str]] = Counter()
    for queue, name, metric, amount in rows:
        totals[(queue, name, metric)] += amount
    _upsert(dialect, writer(), totals, wall_now_ms())


def _upsert(dialect: Dialect, owner: str, totals: Counter[tuple[str, str, str]], now_ms: int) -> None:
    if not totals:
        return
    params: list[object] = []
    for (queue, name, metric), amount in sorted(totals.items()):  # one order: two writes never lock crosswise
        params += [owner, queue, name, metric, amount, now_ms]
    values = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(totals))
    sql = f"INSERT INTO durq_counter (writer, queue, job_name, metric, value, updated_ms) VALUES {values}"
    if dialect.connection.vendor == "mysql":
        sql += " ON DUPLICATE KEY UPDATE value = value + VALUES(value), updated_ms = VALUES(updated_ms)"
    else:
        sql += (
            " ON CONFLICT (writer, queue, job_name, metric)"
            " DO UPDATE SET value = durq_counter.value + excluded.value, updated_ms = excluded.updated_ms"
        )
    dialect.execute(sql, params)


def counted(dialect: Dialect, rows: Sequence[Row] | Callable[[T], Sequence[Row]], write: Callable[[], T]) -> T:
    """Run ``write`` and, when it changed the job (a truthy answer), add ``rows`` (or ``rows(answer)``): one transaction."""
    with transaction.atomic(using=dialect.connection.alias):
        done = write()
        if done:
            add(dialect, rows(done) if callable(rows) else rows)
    return done


def claimed(
    dialect: Dialect,
    now_ms: int,
    claim: Callable[[], list[ClaimedJob]],
    claim_counted: Callable[[ClaimCount], list[ClaimedJob]],
    *,
    limited: bool = False,
) -> list[ClaimedJob]:
    """Claim and count what was claimed, in one transaction.

    ``claim_counted`` is the dialect's claim that counts in its own statement
    (``Dialect.claims_counted``): the claim that is its own transaction and not limited takes it,
    so claim and count cost one round trip. On PostgreSQL a claim that is its own transaction does
    not wait for the WAL flush unless ``DURQ["DURABLE_CLAIMS"]``; a server crash before the flush
    undoes the claim and its count together.
    """
    own = not dialect.connection.in_atomic_block
    if own and not limited and dialect.claims_counted:
        return claim_counted(claim_count(now_ms))
    with transaction.atomic(using=dialect.connection.alias):
        if own and limited:
            # The claim's own transaction: its turns are bounded as when it commits alone (db/flow.py).
            dialect.bound_turns()
        if own and dialect.connection.vendor == "postgresql" and not get_settings().durable_claims:
            dialect.execute("SELECT set_config('synchronous_commit', 'off', true)")  # as in claim_counted
        jobs = claim()
        add(dialect, started(jobs, now_ms))
    return jobs


def claim_count(now_ms: int) -> ClaimCount:
    """What a claim at ``now_ms`` adds for this thread, as ``started`` counts it."""
    return ClaimCount(
        writer=writer(),
        updated_ms=wall_now_ms(),
        started=STARTED,
        wait_sum=_SUM[WAIT],
        wait_buckets=tuple(_LE[WAIT]),
        wait_bounds_ms=_WAIT_BOUNDS_MS,
    )


def completed(
    dialect: Dialect,
    attempts: Sequence[tuple[Lease, ClaimedJob, float]],
    done: set[Lease],
    jobs: Sequence[ClaimedJob],
    now_ms: int,
    now_mono: float,
) -> None:
    """A batch's counts: the attempts (lease, job, handler start on the monotonic clock) whose
    completion this transaction recorded, and the jobs it claimed. Summed as they are read: this
    runs for every batch a worker completes, per job."""
    # Per (queue, job type): [count, sum of ms, observations per bucket], then one row each.
    waits: dict[tuple[str, str], list[Any]] = {}
    for job in jobs:
        wait_ms = now_ms - job.run_at_ms
        if wait_ms < 0:
            wait_ms = 0
        entry = waits.get((job.queue, job.name)) or waits.setdefault((job.queue, job.name), [0, 0, [0] * len(_BOUNDS)])
        entry[0] += 1
        entry[1] += wait_ms
        entry[2][bisect_left(BUCKETS_S, wait_ms / 1000)] += 1
    runs: dict[tuple[str, str], list[Any]] = {}
    for lease, job, started_mono in attempts:
        if lease in done:
            run_ms = (now_mono - started_mono) * 1000
            entry = runs.get((job.queue, job.name)) or runs.setdefault((job.queue, job.name), [0, 0.0, [0] * len(_BOUNDS)])
            entry[0] += 1
            entry[1] += run_ms
            entry[2][bisect_left(BUCKETS_S, run_ms / 1000)] += 1
    totals: Counter[tuple[str, str, str]] = Counter()
    for groups, counter, histogram in ((waits, STARTED, WAIT), (runs, FINISHED, RUN)):
        for (queue, name), (count, sum_ms, buckets) in groups.items():
            totals[(queue, name, counter)] += count
            totals[(queue, name, _SUM[histogram])] += round(sum_ms)
            for index, observations in enumerate(buckets):
                if observations:
                    totals[(queue, name, _LE[histogram][index])] += observations
    _upsert(dialect, writer(), totals, wall_now_ms())


def enqueued(alias: str, counts: Iterable[tuple[str, str]]) -> None:
    """Count jobs inserted on ``alias`` ((queue, job type) each), in the transaction that inserts them."""
    add(dialect_for(connections[alias]), [(queue, name, ENQUEUED, 1) for queue, name in counts])


def one_transaction(alias: str) -> AbstractContextManager[object]:
    """The caller's transaction if one is open (no savepoint: its enqueue stays one statement more), else a new one."""
    return nullcontext() if connections[alias].in_atomic_block else transaction.atomic(using=alias)


def totals(alias: str) -> list[tuple[str, str, str, int]]:
    """(queue, job type, metric, value) summed over every writer, in one statement."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT queue, job_name, metric, SUM(value) FROM durq_counter GROUP BY queue, job_name, metric"
            " ORDER BY queue, job_name, metric"
        )
        return [(queue, name, metric, int(value)) for queue, name, metric, value in cursor.fetchall()]


def fold(dialect: Dialect, now_ms: int, idle_ms: int = FOLD_IDLE_MS) -> int:
    """Fold writers' rows idle for ``idle_ms`` into the writer ``""``, in one transaction; returns how many.

    The rows are locked as they are read: a writer adding to one meanwhile either commits first
    (its count is read and folded) or waits and then makes the row anew, so no count is lost.
    """
    lock = f" {dialect.row_lock}" if dialect.row_lock else ""
    with transaction.atomic(using=dialect.connection.alias):
        rows = dialect.fetchall(
            "SELECT id, queue, job_name, metric, value FROM durq_counter WHERE writer <> '' AND updated_ms < %s"
            f" ORDER BY id LIMIT %s{lock}",
            [now_ms - idle_ms, FOLD_BATCH],
        )
        if not rows:
            return 0
        ids = [row[0] for row in rows]
        dialect.execute(f"DELETE FROM durq_counter WHERE id IN ({', '.join(['%s'] * len(ids))})", ids)
        totals: Counter[tuple[str, str, str]] = Counter()
        for _, queue, name, metric, value in rows:
            totals[(queue, name, metric)] += value
        _upsert(dialect, "", totals, now_ms)
    return len(rows)
