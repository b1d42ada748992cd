"""Reading the queue: which queues exist, which workers are live and what they serve, the dead letters."""

from __future__ import annotations

import json
from typing import cast

from ..clock import now_ms as clock_now_ms
from ..conf import get_settings
from ..db import presence
from ..db.presence import Liveness
from ..db.store import Store
from ..handlers.registry import registry
from ..models import Job, JobQuerySet, QueueControl, Status, WorkerProcess

# A worker counts as live while its row was refreshed within this many heartbeat intervals.
LIVE_HEARTBEATS = 3


def alias_of(using: str | None) -> str:
    return using or get_settings().database


def now_or(now_ms: int | None) -> int:
    return clock_now_ms() if now_ms is None else now_ms


def jobs_on(alias: str) -> JobQuerySet:
    return cast(JobQuerySet, Job.objects.using(alias).all())


def failed(*, queue: str | None = None, limit: int = 50, using: str | None = None) -> list[Job]:
    """Dead letters, most recent first."""
    jobs = jobs_on(alias_of(using)).dead()
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    return list(jobs.order_by("-finished_ms", "-id")[:limit])


ENDED = (Status.FINISHED, Status.DEAD, Status.CANCELLED)


def recent(*, queue: str | None = None, limit: int = 50, using: str | None = None) -> list[Job]:
    """Jobs that ended (finished, dead or cancelled), most recent first.

    Finished jobs are here while retention keeps them (``KEEP_FINISHED``, an hour by default).
    """
    jobs = jobs_on(alias_of(using)).filter(status__in=ENDED, finished_ms__isnull=False)
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    return list(jobs.order_by("-finished_ms", "-id")[:limit])


def jobs_by_id(ids: list[int], *, using: str | None = None) -> dict[int, Job]:
    """The jobs with these ids that still exist, by id."""
    return {job.pk: job for job in jobs_on(alias_of(using)).filter(pk__in=ids)}


def queue_names(using: str | None = None) -> list[str]:
    """Queues in settings, in the registry, holding rows or paused; found by index seeks, not DISTINCT.

    A paused queue is listed even with no job, so that it can be seen and resumed.

    Where the queue's indexes are partial (SQLite, PostgreSQL: migration 0002), no one index
    leads with ``queue`` over every row: the seeks go through the waiting, the blocked (migration
    0008), the running and the finished, dead or cancelled rows, each with an index of its own.
    """
    alias = alias_of(using)
    names = set(get_settings().queues) | registry.queues()
    names.update(QueueControl.objects.using(alias).filter(paused=True).values_list("queue", flat=True))
    jobs = jobs_on(alias)
    if Store(alias).dialect.partial_indexes:
        scopes = [
            jobs.filter(status=Status.WAITING),
            jobs.filter(status=Status.BLOCKED),
            jobs.filter(status=Status.RUNNING),
            jobs.filter(finished_ms__isnull=False),
        ]
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
    """Workers alive now: holding their presence lock, or else heartbeating recently.

    A worker whose lock is held is alive however long ago it last wrote (an idle worker writes
    nothing), so it is reported as seen now; one whose lock is released has ended. One whose row
    beats (``beat_ms``, behind a transaction pooler) has ended once silent for
    ``presence.ROW_GONE_MS``, when the leader takes its jobs over.
    """
    alias = alias_of(using)
    now = now_or(now_ms)
    horizon = now - LIVE_HEARTBEATS * get_settings().heartbeat_interval_ms
    rows = list(WorkerProcess.objects.using(alias).order_by("host", "started_ms", "pid"))
    held = presence.states(alias, {worker.worker_id: worker.holds_lock for worker in rows})
    alive = []
    for worker in rows:
        state = held[worker.worker_id]
        if state is Liveness.HELD:
            worker.last_seen_ms = now
        seen_since = horizon if worker.beat_ms is None else now - presence.ROW_GONE_MS
        if state is Liveness.HELD or (state is Liveness.UNKNOWN and worker.last_seen_ms >= seen_since):
            alive.append(worker)
    return alive


def worker_queues(worker: WorkerProcess) -> dict[str, int]:
    try:
        queues = json.loads(worker.queues)
    except ValueError:
        return {}
    return {str(name): int(size) for name, size in queues.items()} if isinstance(queues, dict) else {}
