"""Operating the queue: list dead letters, retry, purge, cancel, and per-queue stats.

The admin actions, the ``durq`` management command and the monitoring views are thin callers of
these functions. Everything takes ``now_ms`` where time matters, uses the ORM only, and works in
batches of ids so that no statement holds locks on a large part of the table.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Min, QuerySet, Sum
from django.utils import timezone
from django.utils.dateformat import format as date_format

from . import presence
from .clock import ms_to_datetime
from .clock import now_ms as clock_now_ms
from .conf import get_settings
from .enqueue import _wake_on_commit
from .models import Job, JobQuerySet, QueueStat, Status, WorkerProcess
from .presence import Liveness
from .registry import registry
from .store import Store

BATCH = 500
MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
# A worker counts as live while its row was refreshed within this many heartbeat intervals.
LIVE_HEARTBEATS = 3
RETRYABLE = (Status.DEAD, Status.CANCELLED)

Selection = Iterable[int] | QuerySet[Job]


@dataclass
class RetryResult:
    retried: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)  # job id -> why it was left alone


@dataclass
class CancelResult:
    cancelled: list[int] = field(default_factory=list)  # were waiting: cancelled now
    stopping: list[int] = field(default_factory=list)  # were running: asked to stop (ctx.should_stop())
    skipped: dict[int, str] = field(default_factory=dict)


@dataclass
class QueueStats:
    queue: str
    waiting: int  # due now
    delayed: int  # waiting, due later (scheduled or backing off)
    running: int
    dead: int
    oldest_wait_ms: int | None  # how long the longest-waiting due job has been due
    finished_last_minute: int
    failed_last_minute: int
    finished_last_hour: int
    failed_last_hour: int
    workers: int  # live worker processes serving this queue
    slots: int  # their pool sizes for this queue, added up

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Bucket:
    minute_ms: int
    finished: int
    failed: int


def _alias(using: str | None) -> str:
    return using or get_settings().database


def _now(now_ms: int | None) -> int:
    return clock_now_ms() if now_ms is None else now_ms


def _batches(selection: Selection, alias: str) -> Iterator[list[int]]:
    """Job ids of ``selection`` in batches; a queryset is walked by id, so rows it changes are not revisited."""
    if isinstance(selection, QuerySet):
        ids = selection.using(alias).order_by("pk").values_list("pk", flat=True)
        last = None
        while True:
            page = ids if last is None else ids.filter(pk__gt=last)
            batch = list(page[:BATCH])
            if not batch:
                return
            yield batch
            last = batch[-1]
    else:
        pending = list(dict.fromkeys(int(job_id) for job_id in selection))
        for start in range(0, len(pending), BATCH):
            yield pending[start : start + BATCH]


def _jobs(alias: str) -> JobQuerySet:
    return cast(JobQuerySet, Job.objects.using(alias).all())


def _status_reasons(batch: list[int], done: set[int], alias: str, verb: str) -> dict[int, str]:
    """Why the ids of ``batch`` not in ``done`` were left alone."""
    left = [job_id for job_id in batch if job_id not in done]
    if not left:
        return {}
    statuses = dict(_jobs(alias).filter(pk__in=left).values_list("pk", "status"))
    return {job_id: (f"is {statuses[job_id]}, so it is not {verb}" if job_id in statuses else "no such job") for job_id in left}


# --- reading ---------------------------------------------------------------------------------------


def failed(*, queue: str | None = None, limit: int = 50, using: str | None = None) -> list[Job]:
    """Dead letters, most recent first."""
    jobs = _jobs(_alias(using)).dead()
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    return list(jobs.order_by("-finished_ms", "-id")[:limit])


def queue_names(using: str | None = None) -> list[str]:
    """Queues in settings, in the registry, or holding rows; found by index seeks, not DISTINCT.

    Where the queue's indexes are partial (SQLite, PostgreSQL: migration 0002), no one index
    leads with ``queue`` over every row: the seeks go through the waiting, the running and the
    finished, dead or cancelled rows, each with an index of its own.
    """
    alias = _alias(using)
    names = set(get_settings().queues) | registry.queues()
    jobs = _jobs(alias)
    if Store(alias).dialect.partial_indexes:
        scopes = [jobs.filter(status=Status.WAITING), jobs.filter(status=Status.RUNNING), jobs.filter(finished_ms__isnull=False)]
    else:
        scopes = [jobs]
    for scope in scopes:
        queues = scope.order_by("queue").values_list("queue", flat=True)
        last = queues.first()
        while last is not None:
            names.add(last)
            last = queues.filter(queue__gt=last).first()
    return sorted(names)


def live_workers(*, now_ms: int | None = None, using: str | None = None) -> list[WorkerProcess]:
    """Workers alive now: holding their presence lock (SQLite), or else heartbeating recently.

    A worker whose lock is held is alive however long ago it last wrote (an idle worker on SQLite
    writes nothing), so it is reported as seen now; one whose lock is released has ended.
    """
    alias = _alias(using)
    now = _now(now_ms)
    horizon = now - LIVE_HEARTBEATS * get_settings().heartbeat_interval_ms
    workers = WorkerProcess.objects.using(alias).order_by("host", "started_ms", "pid")
    if presence.directory(alias) is None:
        return list(workers.filter(last_seen_ms__gte=horizon))
    rows = list(workers)
    held = presence.states(alias, [worker.worker_id for worker in rows])
    alive = []
    for worker in rows:
        state = held[worker.worker_id]
        if state is Liveness.HELD:
            worker.last_seen_ms = now
        if state is Liveness.HELD or (state is Liveness.UNKNOWN and worker.last_seen_ms >= horizon):
            alive.append(worker)
    return alive


def worker_queues(worker: WorkerProcess) -> dict[str, int]:
    try:
        queues = json.loads(worker.queues)
    except ValueError:
        return {}
    return {str(name): int(size) for name, size in queues.items()} if isinstance(queues, dict) else {}


def stats(*, now_ms: int | None = None, count_cap: int | None = None, using: str | None = None) -> list[QueueStats]:
    """One row per queue; every count is an index range scan on ``durq_job``.

    With ``count_cap``, a count stops at ``count_cap + 1`` (read: "more than count_cap"), so
    a page that only needs "a lot" never reads a million index entries.
    """
    now = _now(now_ms)
    alias = _alias(using)
    sums: dict[tuple[str, str], tuple[int, int]] = {}
    rows = (
        QueueStat.objects.using(alias)
        .filter(minute_ms__gt=now - HOUR_MS - MINUTE_MS)
        .values_list("queue", "minute_ms", "finished", "failed")
    )
    for window, window_ms in (("minute", MINUTE_MS), ("hour", HOUR_MS)):
        totals: dict[str, list[float]] = {}
        for queue, start, finished_count, failed_count in rows:
            weight = _overlap(start, now, window_ms)
            total = totals.setdefault(queue, [0.0, 0.0])
            total[0] += finished_count * weight
            total[1] += failed_count * weight
        for queue, (done, bad) in totals.items():
            sums[(queue, window)] = (round(done), round(bad))
    workers = [worker_queues(worker) for worker in live_workers(now_ms=now, using=alias)]
    result = []
    for queue in queue_names(alias):
        jobs = _jobs(alias).in_queue(queue)
        serving = [pools[queue] for pools in workers if queue in pools]
        last_minute = sums.get((queue, "minute"), (0, 0))
        last_hour = sums.get((queue, "hour"), (0, 0))
        result.append(
            QueueStats(
                queue=queue,
                waiting=_count(jobs.due(now), count_cap),
                delayed=_count(jobs.delayed(now), count_cap),
                running=_count(jobs.running(), count_cap),
                dead=_count(jobs.dead(), count_cap),
                oldest_wait_ms=_oldest_wait_ms(jobs, now),
                finished_last_minute=last_minute[0],
                failed_last_minute=last_minute[1],
                finished_last_hour=last_hour[0],
                failed_last_hour=last_hour[1],
                workers=len(serving),
                slots=sum(serving),
            )
        )
    return result


def _oldest_wait_ms(jobs: JobQuerySet, now: int) -> int | None:
    oldest = jobs.due(now).aggregate(oldest=Min("run_at_ms"))["oldest"]
    return None if oldest is None else max(0, now - oldest)


def _count(jobs: JobQuerySet, cap: int | None) -> int:
    return jobs.count() if cap is None else jobs.order_by()[: cap + 1].count()


def _overlap(start: int, now: int, window_ms: int) -> float:
    """Share of a minute's counts that fell in the last ``window_ms``, the minute's jobs spread evenly."""
    end = min(start + MINUTE_MS, now)
    if end <= start:
        return 1.0  # the minute that has just begun
    return max(0.0, min(1.0, (end - max(start, now - window_ms)) / (end - start)))


def throughput(
    *, now_ms: int | None = None, minutes: int = 60, queue: str | None = None, using: str | None = None
) -> list[Bucket]:
    """Jobs finished and failed (attempts that raised, retried or not) per minute, oldest first, gaps as zero.

    The current minute is the last bucket; it is still filling.
    """
    minute = _now(now_ms) // MINUTE_MS * MINUTE_MS
    first = minute - (minutes - 1) * MINUTE_MS
    rows = QueueStat.objects.using(_alias(using)).filter(minute_ms__gte=first, minute_ms__lte=minute)
    if queue is not None:
        rows = rows.filter(queue=queue)
    totals = {
        row["minute_ms"]: (row["done"] or 0, row["bad"] or 0)
        for row in rows.values("minute_ms").annotate(done=Sum("finished"), bad=Sum("failed"))
    }
    return [Bucket(start, *totals.get(start, (0, 0))) for start in range(first, minute + 1, MINUTE_MS)]


def health(
    *, now_ms: int | None = None, max_wait_ms: int = 300_000, min_workers: int = 1, using: str | None = None
) -> dict[str, Any]:
    """Is the queue healthy: database reachable, enough live workers, no job waiting too long."""
    now = _now(now_ms)
    alias = _alias(using)
    try:
        workers = len(live_workers(now_ms=now, using=alias))
        waits = [_oldest_wait_ms(_jobs(alias).in_queue(queue), now) for queue in queue_names(alias)]
    except DatabaseError as error:
        return {"healthy": False, "database": f"unreachable: {type(error).__name__}", "problems": ["database unreachable"]}
    oldest = max((wait for wait in waits if wait is not None), default=None)
    problems = []
    if workers < min_workers:
        problems.append(f"{workers} live worker(s), fewer than {min_workers}")
    if oldest is not None and oldest > max_wait_ms:
        problems.append(f"a job has waited {oldest / 1000:.0f} s, over {max_wait_ms / 1000:.0f} s")
    return {
        "healthy": not problems,
        "database": "ok",
        "workers": workers,
        "oldest_wait_seconds": None if oldest is None else oldest / 1000,
        "problems": problems,
    }


# --- acting ----------------------------------------------------------------------------------------


def retry(selection: Selection, *, now_ms: int | None = None, using: str | None = None) -> RetryResult:
    """Dead or cancelled jobs back to waiting, due now, attempts reset; their error history is kept.

    A running (or waiting, or finished) job is never touched. A job whose dedupe key another
    active job now holds is skipped: the unique index would refuse it.
    """
    now = _now(now_ms)
    alias = _alias(using)
    store = Store(alias)
    result = RetryResult()
    for batch in _batches(selection, alias):
        done = store.retrying("retry", partial(_retry_batch, batch, now, alias, result))
        result.skipped.update(_status_reasons(batch, done, alias, "retried"))
    return result


def retry_failed(*, queue: str | None = None, now_ms: int | None = None, using: str | None = None) -> RetryResult:
    """Retry every dead letter (of one queue)."""
    dead = _jobs(_alias(using)).dead()
    if queue is not None:
        dead = dead.filter(queue=queue)
    return retry(dead, now_ms=now_ms, using=using)


_RESET = {
    "status": Status.WAITING,
    "attempts": 0,
    "finished_ms": None,
    "lease_expires_ms": None,
    "stop_requested": False,
    "progress_done": None,
    "progress_total": None,
    "result": None,
}


def _retry_batch(batch: list[int], now: int, alias: str, result: RetryResult, _dialect: object) -> set[int]:
    """Retry what is retryable in ``batch``; returns the ids handled (retried or skipped for a key)."""
    handled: set[int] = set()
    with transaction.atomic(using=alias):
        # Locks only dead and cancelled rows, which no worker reads, so claims never wait on it.
        rows = list(
            _jobs(alias).select_for_update().filter(pk__in=batch, status__in=RETRYABLE).values_list("pk", "unique_key", "queue")
        )
        plain = [job_id for job_id, key, _ in rows if key is None]
        _jobs(alias).filter(pk__in=plain).update(run_at_ms=now, **_RESET)
        retried = list(plain)
        for job_id, key, _ in rows:
            if key is None:
                continue
            try:
                # A savepoint keeps the batch alive when the unique index refuses this one.
                with transaction.atomic(using=alias):
                    _jobs(alias).filter(pk=job_id).update(run_at_ms=now, **_RESET)
                retried.append(job_id)
            except IntegrityError:
                holder = _jobs(alias).active().filter(unique_key=key).values_list("pk", flat=True).first()
                result.skipped[job_id] = f"its dedupe key {key!r} is held by active job {holder}"
            handled.add(job_id)
        queues = sorted({queue for job_id, _, queue in rows if job_id in set(retried)})
        if queues:
            _wake_on_commit(alias, queues)
    result.retried.extend(sorted(retried))
    return handled | set(retried)


def purge(
    selection: Selection | None = None,
    *,
    older_than_ms: int | None = None,
    queue: str | None = None,
    now_ms: int | None = None,
    dry_run: bool = False,
    using: str | None = None,
) -> int:
    """Delete dead letters, in batches of ids; returns how many were (or, on a dry run, would be) deleted.

    ``older_than_ms`` keeps dead letters that died less than that long before ``now_ms``; the
    bound is inclusive (a job that died exactly that long ago goes). Only dead jobs are ever
    deleted, whatever the selection holds.
    """
    alias = _alias(using)
    dead = _jobs(alias).dead()
    if older_than_ms is not None:
        dead = dead.filter(finished_ms__lte=_now(now_ms) - older_than_ms)
    if queue is not None:
        dead = dead.filter(queue=queue)
    batches: Iterable[list[int]]
    if selection is None:
        if dry_run:
            return dead.count()
        batches = _dead_batches(dead.order_by("finished_ms", "pk").values_list("pk", flat=True))
    else:
        batches = _batches(selection, alias)
        if dry_run:
            return sum(dead.filter(pk__in=batch).count() for batch in batches)
    store = Store(alias)
    deleted = 0
    for batch in batches:
        deleted += store.retrying("purge", partial(_delete, dead, batch))
    return deleted


def _delete(dead: JobQuerySet, batch: list[int], _dialect: object) -> int:
    return dead.filter(pk__in=batch).delete()[0]


def _dead_batches(ids: QuerySet[Job, int]) -> Iterator[list[int]]:
    # Each batch is deleted before the next is read, so the first BATCH ids are always new ones.
    while batch := list(ids[:BATCH]):
        yield batch


def cancel(selection: Selection, *, now_ms: int | None = None, using: str | None = None) -> CancelResult:
    """Waiting jobs become cancelled; running jobs are asked to stop.

    A running handler sees ``ctx.should_stop()`` turn true at its worker's next heartbeat; when
    it returns, the job is recorded as cancelled.
    """
    now = _now(now_ms)
    alias = _alias(using)
    store = Store(alias)
    result = CancelResult()
    for batch in _batches(selection, alias):
        done = store.retrying("cancel", partial(_cancel_batch, batch, now, alias, result))
        result.skipped.update(_status_reasons(batch, done, alias, "cancelled"))
    return result


def _cancel_batch(batch: list[int], now: int, alias: str, result: CancelResult, _dialect: object) -> set[int]:
    with transaction.atomic(using=alias):
        waiting = list(_jobs(alias).select_for_update().filter(pk__in=batch, status=Status.WAITING).values_list("pk", flat=True))
        _jobs(alias).filter(pk__in=waiting).update(status=Status.CANCELLED, finished_ms=now)
        running = list(_jobs(alias).select_for_update().filter(pk__in=batch, status=Status.RUNNING).values_list("pk", flat=True))
        _jobs(alias).filter(pk__in=running).update(stop_requested=True)
    result.cancelled.extend(sorted(waiting))
    result.stopping.extend(sorted(running))
    return set(waiting) | set(running)


# --- presenting -------------------------------------------------------------------------------------


def local_time(ms: int | None) -> str:
    """An epoch-ms time as a date and time in Django's current time zone, to the second."""
    moment = ms_to_datetime(ms)
    if moment is None:
        return "-"
    return date_format(timezone.localtime(moment), "Y-m-d H:i:s T")


def format_age(ms: int | None) -> str:
    """A duration in its two largest units: ``3 min 12 s``, ``2 h 5 min``."""
    if ms is None:
        return "-"
    seconds = int(ms // 1000)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if seconds >= size:
            rest = (seconds % size) // sub_size
            return f"{seconds // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{seconds} s" if seconds else f"{int(ms)} ms"
