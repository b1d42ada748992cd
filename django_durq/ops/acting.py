"""Acting on jobs: retry dead or cancelled ones, purge dead letters, cancel waiting, blocked or running ones.

Each works in batches of ids, so that no statement holds locks on a large part of the table. A
retry or cancel commits per batch; the ``*_together`` forms, which act on a workflow, put every
batch in one transaction, so that no job of it is released or started half-way through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial

from django.db import IntegrityError, connections, transaction
from django.db.models import QuerySet

from ..db import counters, dialect_for, wakeup
from ..db.dependencies import settle
from ..db.revival import revive
from ..db.store import Store
from ..models import Job, JobQuerySet, Status
from .reading import alias_of, jobs_on, now_or

BATCH = 500
RETRYABLE = (Status.DEAD, Status.CANCELLED)
NOT_STARTED = (Status.WAITING, Status.BLOCKED)

Selection = Iterable[int] | QuerySet[Job]


@dataclass
class RetryResult:
    retried: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)  # job id -> why it was left alone

    def merge(self, other: RetryResult) -> None:
        self.retried += other.retried
        self.skipped.update(other.skipped)


@dataclass
class CancelResult:
    cancelled: list[int] = field(default_factory=list)  # were waiting or blocked: cancelled now
    stopping: list[int] = field(default_factory=list)  # were running: asked to stop (ctx.should_stop())
    skipped: dict[int, str] = field(default_factory=dict)

    def merge(self, other: CancelResult) -> None:
        self.cancelled += other.cancelled
        self.stopping += other.stopping
        self.skipped.update(other.skipped)


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


def _only(batch: list[int]) -> Callable[[], list[list[int]]]:
    """A selection of one batch, for the per-batch forms of the one-transaction actions."""
    return lambda: [batch]


def _status_reasons(batch: list[int], done: set[int], alias: str, verb: str) -> dict[int, str]:
    """Why the ids of ``batch`` not in ``done`` were left alone."""
    left = [job_id for job_id in batch if job_id not in done]
    if not left:
        return {}
    statuses = dict(jobs_on(alias).filter(pk__in=left).values_list("pk", "status"))
    return {job_id: (f"is {statuses[job_id]}, so it is not {verb}" if job_id in statuses else "no such job") for job_id in left}


def retry(selection: Selection, *, now_ms: int | None = None, using: str | None = None) -> RetryResult:
    """Dead or cancelled jobs back to waiting, due now, attempts reset; their error history is kept.

    A running (or waiting, or finished) job is never touched. A job whose dedupe key another
    active job now holds is skipped: the unique index would refuse it. Jobs of a workflow wait
    again for what they wait for, and what waits for them is counted again (``db/revival.py``).
    Each batch of 500 ids is one transaction; :func:`retry_together` makes the whole selection one.
    """
    now = now_or(now_ms)
    alias = alias_of(using)
    store = Store(alias)
    result = RetryResult()
    for batch in _batches(selection, alias):
        result.merge(store.retrying("retry", partial(_retry_in_one, _only(batch), now, alias)))
    return result


def retry_together(selection: Selection, now: int, alias: str) -> RetryResult:
    """Retry the whole selection in one transaction: nothing of it is seen (or released) before all of it is done."""
    return Store(alias).retrying("retry", partial(_retry_in_one, lambda: _batches(selection, alias), now, alias))


def retry_failed(*, queue: str | None = None, now_ms: int | None = None, using: str | None = None) -> RetryResult:
    """Retry every dead letter (of one queue)."""
    dead = jobs_on(alias_of(using)).dead()
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
    "cancelled_by": None,
    "expires_ms": None,  # an operator's retry asks for a run: an expiry would end it at once
}


def _retry_in_one(batches: Callable[[], Iterable[list[int]]], now: int, alias: str, _dialect: object) -> RetryResult:
    """Retry what is retryable in ``batches``, then count the workflows they belong to again: one transaction."""
    result = RetryResult()
    retried: list[int] = []
    queues: set[str] = set()
    with transaction.atomic(using=alias):
        for batch in batches():
            done, batch_queues = _reset(batch, now, alias, result)
            retried += [job_id for job_id in batch if job_id in done and job_id not in result.skipped]
            queues |= batch_queues
            result.skipped.update(_status_reasons(batch, done, alias, "retried"))
        # Jobs of a workflow wait again for what has not ended; what waits for them is counted again.
        revived = revive(dialect_for(connections[alias]), retried, now)
        # A retried job is counted as any other: one that waits for a job that failed stays cancelled.
        roots = set(retried)
        stays = {job_id: upstream for job_id, upstream in revived.cancelled.items() if job_id in roots}
        for job_id, upstream in stays.items():
            result.skipped[job_id] = f"it stays cancelled: job {upstream}, which it waits for, ended without finishing"
        if queues:
            wakeup.wake_on_commit(alias, sorted(queues))
    result.retried = sorted(roots - stays.keys())
    return result


def _reset(batch: list[int], now: int, alias: str, result: RetryResult) -> tuple[set[int], set[str]]:
    """Turn the retryable jobs of ``batch`` waiting; returns the ids handled (retried or skipped for a key) and their queues."""
    # Locks only dead and cancelled rows, which no worker reads, so claims never wait on it.
    rows = list(
        jobs_on(alias).select_for_update().filter(pk__in=batch, status__in=RETRYABLE).values_list("pk", "unique_key", "queue")
    )
    plain = [job_id for job_id, key, _ in rows if key is None]
    jobs_on(alias).filter(pk__in=plain).update(run_at_ms=now, **_RESET)
    handled = set(plain)
    for job_id, key, _ in rows:
        if key is None:
            continue
        try:
            # A savepoint keeps the batch alive when the unique index refuses this one.
            with transaction.atomic(using=alias):
                jobs_on(alias).filter(pk=job_id).update(run_at_ms=now, **_RESET)
        except IntegrityError:
            holder = jobs_on(alias).active().filter(unique_key=key).values_list("pk", flat=True).first()
            result.skipped[job_id] = f"its dedupe key {key!r} is held by active job {holder}"
        handled.add(job_id)
    return handled, {queue for job_id, _, queue in rows if job_id not in result.skipped}


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
    alias = alias_of(using)
    dead = jobs_on(alias).dead()
    if older_than_ms is not None:
        dead = dead.filter(finished_ms__lte=now_or(now_ms) - older_than_ms)
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
    """Waiting and blocked jobs become cancelled; running jobs are asked to stop.

    A running handler sees ``ctx.should_stop()`` turn true at its worker's next heartbeat; when
    it returns (whether or not it saw the request), the job is recorded as cancelled. Each batch
    of 500 ids is one transaction; :func:`cancel_together` makes the whole selection one.
    """
    now = now_or(now_ms)
    alias = alias_of(using)
    store = Store(alias)
    result = CancelResult()
    for batch in _batches(selection, alias):
        result.merge(store.retrying("cancel", partial(_cancel_in_one, _only(batch), now, alias)))
    return result


def cancel_together(selection: Selection, now: int, alias: str) -> CancelResult:
    """Cancel the whole selection in one transaction: none of it is released by another's cancel meanwhile."""
    return Store(alias).retrying("cancel", partial(_cancel_in_one, lambda: _batches(selection, alias), now, alias))


def _cancel_in_one(batches: Callable[[], Iterable[list[int]]], now: int, alias: str, _dialect: object) -> CancelResult:
    result = CancelResult()
    running: list[int] = []
    selected: list[int] = []
    with transaction.atomic(using=alias):
        for batch in batches():
            selected += batch
            rows = list(
                jobs_on(alias).select_for_update().filter(pk__in=batch, status__in=NOT_STARTED).values_list("pk", "queue", "name")
            )
            waiting = [pk for pk, _, _ in rows]
            jobs_on(alias).filter(pk__in=waiting).update(status=Status.CANCELLED, finished_ms=now)
            counters.add(dialect_for(connections[alias]), [(queue, name, counters.CANCELLED, 1) for _, queue, name in rows])
            result.cancelled += waiting
            running += jobs_on(alias).filter(pk__in=batch, status=Status.RUNNING).values_list("pk", flat=True)
        # What waits for these is counted once every one of them is cancelled: a job waiting
        # "to run anyway" for one of them is cancelled with the selection, not released by it.
        settle(dialect_for(connections[alias]), now, result.cancelled)
        # Running rows last: a worker renewing one waits for this commit, so it is kept short.
        for start in range(0, len(running), BATCH):
            chunk = running[start : start + BATCH]
            stopping = list(
                jobs_on(alias).select_for_update().filter(pk__in=chunk, status=Status.RUNNING).values_list("pk", flat=True)
            )
            jobs_on(alias).filter(pk__in=stopping).update(stop_requested=True)
            result.stopping += stopping
        done = set(result.cancelled) | set(result.stopping)
        for start in range(0, len(selected), BATCH):
            result.skipped.update(_status_reasons(selected[start : start + BATCH], done, alias, "cancelled"))
    result.cancelled.sort()
    result.stopping.sort()
    return result
