"""The queue in numbers: per-queue counts and throughput, the health verdict, and queues no live worker serves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError
from django.db.models import Min, Sum
from django.utils.translation import ngettext

from ..models import JobQuerySet, QueueStat
from .orphans import orphaned
from .pausing import paused_queues
from .reading import alias_of, jobs_on, live_workers, now_or, queue_names, worker_queues

COUNT_CAP = 10_000  # a count shown to people (the admin's pages, the health check) stops here
MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS


@dataclass
class QueueStats:
    queue: str
    waiting: int  # due now
    delayed: int  # waiting, due later (scheduled or backing off)
    blocked: int  # workflow jobs waiting for upstream jobs to end (due once they have)
    running: int
    dead: int
    oldest_wait_ms: int | None  # how long the longest-waiting due job has been due
    finished_last_minute: int
    failed_last_minute: int
    finished_last_hour: int
    failed_last_hour: int
    # Jobs handed back, attempt not counted, by a worker that had no handler for their type (a
    # worker of another release, during a deploy; or a type that is gone).
    unknown_type_last_hour: int
    workers: int  # live worker processes serving this queue
    slots: int  # their pool sizes for this queue, added up
    paused: bool  # an operator paused it: no worker starts its jobs (ops.pause)
    paused_ms: int | None  # since when

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Bucket:
    minute_ms: int
    finished: int
    failed: int


def stats(*, now_ms: int | None = None, count_cap: int | None = None, using: str | None = None) -> list[QueueStats]:
    """One row per queue; every count is an index range scan on ``durq_job``.

    With ``count_cap``, a count stops at ``count_cap + 1`` (read: "more than count_cap"), so
    a page that only needs "a lot" never reads a million index entries.
    """
    now = now_or(now_ms)
    alias = alias_of(using)
    sums: dict[tuple[str, str], tuple[int, int, int]] = {}
    rows = (
        QueueStat.objects.using(alias)
        .filter(minute_ms__gt=now - HOUR_MS - MINUTE_MS)
        .values_list("queue", "minute_ms", "finished", "failed", "unknown_type")
    )
    for window, window_ms in (("minute", MINUTE_MS), ("hour", HOUR_MS)):
        totals: dict[str, list[float]] = {}
        for queue, start, finished_count, failed_count, unknown_count in rows:
            weight = _overlap(start, now, window_ms)
            total = totals.setdefault(queue, [0.0, 0.0, 0.0])
            total[0] += finished_count * weight
            total[1] += failed_count * weight
            total[2] += unknown_count * weight
        for queue, (done, bad, unknown) in totals.items():
            sums[(queue, window)] = (round(done), round(bad), round(unknown))
    workers = [worker_queues(worker) for worker in live_workers(now_ms=now, using=alias)]
    paused = paused_queues(using=alias)
    result = []
    for queue in queue_names(alias):
        jobs = jobs_on(alias).in_queue(queue)
        serving = [pools[queue] for pools in workers if queue in pools]
        last_minute = sums.get((queue, "minute"), (0, 0, 0))
        last_hour = sums.get((queue, "hour"), (0, 0, 0))
        result.append(
            QueueStats(
                queue=queue,
                waiting=_count(jobs.due(now), count_cap),
                delayed=_count(jobs.delayed(now), count_cap),
                blocked=_count(jobs.blocked(), count_cap),
                running=_count(jobs.running(), count_cap),
                dead=_count(jobs.dead(), count_cap),
                oldest_wait_ms=_oldest_wait_ms(jobs, now),
                finished_last_minute=last_minute[0],
                failed_last_minute=last_minute[1],
                finished_last_hour=last_hour[0],
                failed_last_hour=last_hour[1],
                unknown_type_last_hour=last_hour[2],
                workers=len(serving),
                slots=sum(serving),
                paused=queue in paused,
                paused_ms=paused.get(queue),
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
    minute = now_or(now_ms) // MINUTE_MS * MINUTE_MS
    first = minute - (minutes - 1) * MINUTE_MS
    rows = QueueStat.objects.using(alias_of(using)).filter(minute_ms__gte=first, minute_ms__lte=minute)
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
    """Is the queue healthy: database reachable, enough live workers, no job waiting too long.

    A paused queue's jobs wait because an operator asked for it: they count neither as waiting
    too long nor as unserved. ``paused_queues`` names the paused queues, for the record.

    Two more facts are reported without making the queue unhealthy, as each is normal for a
    moment: ``orphaned_jobs``, running jobs whose worker has ended (with that worker and the
    lease's end), until a worker takes them over; and ``unknown_type_last_hour``, per queue, the
    jobs handed back by a worker that had no handler for their type (during a deploy, a worker
    of the former release; after it, a type that is gone).
    """
    now = now_or(now_ms)
    alias = alias_of(using)
    try:
        workers = len(live_workers(now_ms=now, using=alias))
        paused = paused_queues(using=alias)
        waits = [_oldest_wait_ms(jobs_on(alias).in_queue(queue), now) for queue in queue_names(alias) if queue not in paused]
        stranded = unserved(now_ms=now, count_cap=COUNT_CAP, using=alias)
        orphans = [orphan.as_dict() for orphan in orphaned(using=alias)]
        unknown = _unknown_types(now, alias)
    except DatabaseError as error:
        return {"healthy": False, "database": f"unreachable: {type(error).__name__}", "problems": ["database unreachable"]}
    oldest = max((wait for wait in waits if wait is not None), default=None)
    problems = []
    if workers < min_workers:
        problems.append(
            ngettext("%(count)d live worker, fewer than %(min)d", "%(count)d live workers, fewer than %(min)d", workers)
            % {"count": workers, "min": min_workers}
        )
    if oldest is not None and oldest > max_wait_ms:
        problems.append(f"a job has waited {oldest / 1000:.0f} s, over {max_wait_ms / 1000:.0f} s")
    problems.extend(f"{due_jobs(count)} in queue {queue!r}, which no live worker serves" for queue, count in stranded.items())
    return {
        "healthy": not problems,
        "database": "ok",
        "workers": workers,
        "oldest_wait_seconds": None if oldest is None else oldest / 1000,
        "unserved_queues": stranded,
        "paused_queues": sorted(paused),
        "orphaned_jobs": orphans,
        "unknown_type_last_hour": unknown,
        "problems": problems,
    }


def _unknown_types(now: int, alias: str) -> dict[str, int]:
    """Per queue, jobs handed back in the last hour by a worker without a handler for their type."""
    rows = (
        QueueStat.objects.using(alias)
        .filter(minute_ms__gt=now - HOUR_MS, unknown_type__gt=0)
        .values("queue")
        .annotate(count=Sum("unknown_type"))
    )
    return {row["queue"]: row["count"] for row in rows.order_by("queue")}


def unserved(*, now_ms: int | None = None, count_cap: int | None = None, using: str | None = None) -> dict[str, int]:
    """Queues holding due jobs that no live worker serves, by name, with how many are due.

    Those jobs wait until a worker runs their queue: a queue missing from a worker's
    configuration, or a misspelt name, shows up here. A paused queue does not: its jobs wait
    until it is resumed, served or not. A count stops at ``count_cap + 1``.
    """
    now = now_or(now_ms)
    alias = alias_of(using)
    served = {queue for worker in live_workers(now_ms=now, using=alias) for queue in worker_queues(worker)}
    left_alone = served | set(paused_queues(using=alias))
    counts = {
        queue: _count(jobs_on(alias).in_queue(queue).due(now), count_cap)
        for queue in queue_names(alias)
        if queue not in left_alone
    }
    return {queue: count for queue, count in counts.items() if count}


def due_jobs(count: int) -> str:
    """``1 due job``, ``2 due jobs``."""
    return ngettext("%(count)d due job", "%(count)d due jobs", count) % {"count": count}
