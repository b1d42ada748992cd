"""The cron, expiry and retention duties of the maintenance runner (see ``maintenance.py``).

One worker per database holds the maintenance lease and runs them: cron once a second, the
expiry sweep at the next expiry (every five seconds at most), pruning at a pace set by how long
rows are kept (``prune_every_ms``). A lease can expire while its old holder still runs, so no
duty relies on it: a schedule's due time is taken by compare-and-set on its row, the sweep ends
only jobs still waiting, and pruning deletes only rows that are still expired.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.db import connections, transaction
from django.db.models import Exists, Max, OuterRef, Q

from .. import schedules
from ..conf import DurqSettings
from ..db import counters, dialect_for
from ..db.dependencies import settle, uncounted_ends
from ..db.expiry import end_waiting, expiry_message, next_expiry
from ..models import ACTIVE_STATUSES, Dependency, Job, QueueStat, Status, Workflow
from .maintenance import INTERVAL_MS, register_duty

jobs_log = logging.getLogger("django_durq.jobs")

# Pruning looks again after a tenth of the shortest time rows are kept, within these bounds: a
# row outlives its window by that at most, and an idle worker does not scan every second for
# rows kept an hour.
PRUNE_EVERY_MAX_MS = 60_000


def prune_every_ms(*keep_ms: int | None) -> int:
    """How often to look for rows to prune when each is kept this long (None: forever)."""
    windows = [keep for keep in keep_ms if keep is not None]
    if not windows:
        return PRUNE_EVERY_MAX_MS
    return min(max(min(windows) // 10, INTERVAL_MS), PRUNE_EVERY_MAX_MS)


if TYPE_CHECKING:
    from .runtime import Runtime


class CronDuty:
    """Enqueues each schedule's run once its due time has come (``schedules.tick``).

    Due times that came while the duty passed from a dead holder to another worker are not
    missed: ``schedules.ON_TIME_MS`` is many times ``TAKEOVER_MS``, so each is still enqueued.
    """

    name = "cron"
    # Due times fall on whole seconds. With no schedule declared, the duty only looks again for
    # one that became valid (a schedule with a problem is left out until the problem is gone).
    NONE_DECLARED_EVERY_MS = 60 * INTERVAL_MS

    def __init__(self) -> None:
        self.every_ms = INTERVAL_MS

    def run_once(self, now_ms: int) -> dict[str, int]:
        specs = schedules.schedules(now_ms)
        self.every_ms = INTERVAL_MS if specs else self.NONE_DECLARED_EVERY_MS
        return schedules.tick(now_ms, specs=specs)


class ExpiryDuty:
    """Ends waiting jobs whose expiry came before any worker started them (``db/expiry.py``).

    A job a claim reaches is ended by the worker that claimed it; this sweep is for the jobs no
    claim reaches: a paused queue, a queue no worker serves, a limit that holds them back. It
    looks again at the earliest expiry it knows of, and at least every ``QUIET_EVERY_MS``, on the
    maintenance passes' one-second grid: an expired job waits at most that plus a pass (six
    seconds) after its expiry while a worker holds the duty, and at most a pass when its expiry
    was known at the previous look.
    """

    name = "expiry"
    QUIET_EVERY_MS = 5 * INTERVAL_MS
    BATCH = 500

    def __init__(self, settings: DurqSettings) -> None:
        self.settings = settings
        self.every_ms = INTERVAL_MS

    def run_once(self, now_ms: int) -> dict[str, int]:
        dialect = dialect_for(connections[self.settings.database])
        ended = counters.counted(
            dialect,
            lambda jobs: [(job.queue, job.name, counters.CANCELLED, 1) for job in jobs],
            lambda: end_waiting(dialect, now_ms, self.BATCH),
        )
        for job in ended:
            jobs_log.info(
                "durq: job %s (%s) %s -> cancelled",
                job.id,
                job.name,
                expiry_message(job.expires_ms),
                extra={"job_id": job.id, "job_name": job.name, "queue": job.queue, "attempt": job.attempts},
            )
        upcoming = next_expiry(dialect)
        wait_ms = self.QUIET_EVERY_MS if upcoming is None else upcoming - now_ms
        self.every_ms = min(self.QUIET_EVERY_MS, max(INTERVAL_MS, wait_ms))
        return {"expired": len(ended)}


class RetentionDuty:
    """Deletes finished, cancelled and dead jobs kept longer than KEEP_FINISHED / KEEP_DEAD.

    Rows go in keyset batches of ``batch_size`` ids, each its own short transaction, and at most
    ``max_batches`` per pass so the other duties are not held up; the next pass continues.
    Cancelled jobs follow KEEP_DEAD: like dead letters, they can be retried. A queue's own
    ``keep_finished`` / ``keep_dead`` in ``DURQ["QUEUES"]`` overrides the global one for its jobs.
    """

    name = "retention"

    def __init__(self, settings: DurqSettings, batch_size: int = 500, max_batches: int = 20) -> None:
        self.settings = settings
        self.batch_size = batch_size
        self.max_batches = max_batches
        self._batches_left = 0
        queues = settings.queues.values()
        self.every_ms = prune_every_ms(
            settings.keep_finished_ms,
            settings.keep_dead_ms,
            *(queue.keep_finished_ms for queue in queues),
            *(queue.keep_dead_ms for queue in queues),
        )

    def run_once(self, now_ms: int) -> dict[str, int]:
        counts = {Status.FINISHED.value: 0, Status.CANCELLED.value: 0, Status.DEAD.value: 0}
        self._batches_left = self.max_batches
        for status, key in (
            (Status.FINISHED, "keep_finished_ms"),
            (Status.CANCELLED, "keep_dead_ms"),
            (Status.DEAD, "keep_dead_ms"),
        ):
            for where, keep_ms in self._rules(key):
                if keep_ms is not None:
                    counts[status.value] += self._prune(status, where, now_ms - keep_ms)
        return counts

    def _rules(self, key: str) -> list[tuple[Q, int | None]]:
        """(which jobs, how long they are kept): each queue with its own setting, then the rest."""
        own = {name: getattr(queue, key) for name, queue in self.settings.queues.items() if getattr(queue, key) is not None}
        rules: list[tuple[Q, int | None]] = [(Q(queue=name), keep_ms) for name, keep_ms in sorted(own.items())]
        rules.append((~Q(queue__in=sorted(own)) if own else Q(), getattr(self.settings, key)))
        return rules

    def _prune(self, status: Status, where: Q, horizon_ms: int) -> int:
        jobs = Job.objects.using(self.settings.database)
        # A workflow's jobs go with their workflow (WorkflowRetention); a job others still wait
        # on stays until its end is counted.
        uncounted = Dependency.objects.filter(depends_on_id=OuterRef("pk"), settled=False)
        expired = jobs.filter(where, status=status, finished_ms__lt=horizon_ms, workflow_id__isnull=True).exclude(
            Exists(uncounted)
        )
        deleted = 0
        after: tuple[int | None, int] | None = None
        while self._batches_left > 0:
            self._batches_left -= 1
            page = expired
            if after is not None:
                page = page.filter(Q(finished_ms__gt=after[0]) | Q(finished_ms=after[0], id__gt=after[1]))
            keys = list(page.order_by("finished_ms", "id").values_list("finished_ms", "id")[: self.batch_size])
            if not keys:
                break
            # Deleted only while still expired: an operator may have retried a dead job meanwhile.
            count, _ = expired.filter(id__in=[id_ for _, id_ in keys]).delete()
            deleted += count
            if len(keys) < self.batch_size:
                break
            after = keys[-1]
        return deleted


class StatsRetention:
    """Deletes per-minute counters older than the dashboard and the stats ever look (two days)."""

    name = "stats-retention"
    keep_ms = 2 * 24 * 3600 * 1000
    every_ms = PRUNE_EVERY_MAX_MS

    def __init__(self, settings: DurqSettings) -> None:
        self.settings = settings

    def run_once(self, now_ms: int) -> dict[str, int]:
        stale = QueueStat.objects.using(self.settings.database).filter(minute_ms__lt=now_ms - self.keep_ms)
        ids = list(stale.order_by("id").values_list("id", flat=True)[:500])
        deleted, _ = QueueStat.objects.using(self.settings.database).filter(id__in=ids).delete() if ids else (0, {})
        return {"deleted": deleted}


class CounterFold:
    """Folds counter rows that no writer has added to for ``counters.FOLD_IDLE_MS`` into the writer ``""``.

    Each fold is one transaction, so the metrics view's sums never decrease; the table keeps a
    set of rows per writer that counted lately, not one per process that ever ran.
    """

    name = "counter-fold"
    every_ms = PRUNE_EVERY_MAX_MS

    def __init__(self, settings: DurqSettings) -> None:
        self.settings = settings

    def run_once(self, now_ms: int) -> dict[str, int]:
        dialect = dialect_for(connections[self.settings.database])
        return {"folded": counters.fold(dialect, now_ms)}


class SettleDuty:
    """Counts job ends that the worker which ended them did not (it died, or an operator cancelled).

    Each edge is counted once whoever counts it (``db/dependencies.py``), so this sweep and the
    workers never count an end twice; it only bounds how long a missed count can wait: a second
    while a workflow is in flight. With none in flight there is no count to miss, and the sweep
    looks every ``QUIET_EVERY_MS`` for the next workflow, which an idle worker would otherwise pay
    a read a second for.
    """

    name = "settle"
    QUIET_EVERY_MS = 5 * INTERVAL_MS

    def __init__(self, settings: DurqSettings) -> None:
        self.settings = settings
        self.every_ms = INTERVAL_MS

    def run_once(self, now_ms: int) -> dict[str, int]:
        dialect = dialect_for(connections[self.settings.database])
        in_flight, uncounted = uncounted_ends(dialect)
        self.every_ms = INTERVAL_MS if in_flight else self.QUIET_EVERY_MS
        if not uncounted:
            return {"edges": 0, "released": 0, "cancelled": 0}
        result = settle(dialect, now_ms)
        return {"edges": result.edges, "released": len(result.released), "cancelled": len(result.cancelled)}


class WorkflowRetention:
    """Deletes a workflow as a unit once every job of it has ended and the last ended longer ago than
    KEEP_FINISHED (KEEP_DEAD too when one ended dead or cancelled): never part of a live workflow.

    Nor an end not counted yet: a workflow whose job a later one waits for (``after=``) stays until
    that end is counted (the settle sweep, within a second), so deleting its edges loses no count.

    Each run looks at the next ``batch_size`` workflows after the last one it looked at, and starts
    over from the oldest once it reaches the newest: workflows it must keep (in flight, or kept for
    good) never fill every batch, so every ended workflow is reached within a pass over them all.
    """

    name = "workflow-retention"
    batch_size = 100

    def __init__(self, settings: DurqSettings) -> None:
        self.settings = settings
        self.every_ms = prune_every_ms(settings.keep_finished_ms, settings.keep_dead_ms)
        self.after_id = 0  # the last workflow the previous run looked at

    def run_once(self, now_ms: int) -> dict[str, int]:
        alias = self.settings.database
        deleted = 0
        batch = list(
            Workflow.objects.using(alias)
            .filter(id__gt=self.after_id)
            .order_by("id")
            .values_list("id", flat=True)[: self.batch_size]
        )
        self.after_id = batch[-1] if len(batch) == self.batch_size else 0
        for workflow_id in batch:
            with transaction.atomic(using=alias):
                jobs = Job.objects.using(alias).select_for_update().filter(workflow_id=workflow_id)
                if jobs.filter(status__in=ACTIVE_STATUSES).exists():
                    continue
                last = jobs.aggregate(last=Max("finished_ms"))["last"] or 0
                keep_ms = [self.settings.keep_finished_ms]
                if jobs.filter(status__in=(Status.DEAD, Status.CANCELLED)).exists():
                    keep_ms.append(self.settings.keep_dead_ms)  # type: ignore[arg-type]
                if None in keep_ms or last >= now_ms - max(keep_ms):  # type: ignore[type-var]
                    continue
                ids = list(jobs.values_list("id", flat=True))
                if Dependency.objects.using(alias).filter(depends_on_id__in=ids, settled=False).exists():
                    continue  # an end not counted yet: the settle sweep counts it first
                Dependency.objects.using(alias).filter(Q(job_id__in=ids) | Q(depends_on_id__in=ids)).delete()
                Job.objects.using(alias).filter(id__in=ids).delete()
                Workflow.objects.using(alias).filter(id=workflow_id).delete()
                deleted += 1
        return {"workflows": deleted}


def _cron(runtime: Runtime) -> CronDuty:
    return CronDuty()


def _expiry(runtime: Runtime) -> ExpiryDuty:
    return ExpiryDuty(runtime.settings)


def _retention(runtime: Runtime) -> RetentionDuty:
    return RetentionDuty(runtime.settings)


def _stats_retention(runtime: Runtime) -> StatsRetention:
    return StatsRetention(runtime.settings)


def _counter_fold(runtime: Runtime) -> CounterFold:
    return CounterFold(runtime.settings)


def _settle(runtime: Runtime) -> SettleDuty:
    return SettleDuty(runtime.settings)


def _workflow_retention(runtime: Runtime) -> WorkflowRetention:
    return WorkflowRetention(runtime.settings)


register_duty(_cron)
register_duty(_settle)
register_duty(_expiry)
register_duty(_retention)
register_duty(_workflow_retention)
register_duty(_stats_retention)
register_duty(_counter_fold)
