"""Pausing a queue: no worker, in any process on any host, starts a job of a paused queue until it is resumed.

The state is a row of ``durq_queue_control`` shared by every worker, and every claim reads it
(see ``db/base.py``'s ``NOT_PAUSED``): a pause holds from the commit of :func:`pause` on, without
telling any worker. Jobs that are running when it commits finish; jobs a worker had already
claimed ahead (``PREFETCH``) start only within 10 ms of the commit, or are handed back with
their attempts not counted (``worker/pause_guard.py``). While paused, the queue takes new jobs
as usual: they wait. :func:`resume` wakes the queue's idle workers, so its due jobs start at once.
"""

from __future__ import annotations

from functools import partial

from django.db import IntegrityError, transaction

from ..db import wakeup
from ..db.store import Store
from ..handlers.options import check_queue
from ..models import QueueControl
from .reading import alias_of, now_or


def pause(queue: str, *, now_ms: int | None = None, using: str | None = None) -> bool:
    """Stop workers from starting jobs of ``queue``; True when this call paused it, False when it already was.

    Pausing a paused queue changes nothing: it stays paused since the first pause.
    """
    check_queue(queue)
    alias = alias_of(using)
    return Store(alias).retrying("pause", partial(_pause, queue, now_or(now_ms), alias))


def _pause(queue: str, now: int, alias: str, _dialect: object) -> bool:
    unpaused = QueueControl.objects.using(alias).filter(queue=queue, paused=False)
    with transaction.atomic(using=alias):
        if unpaused.update(paused=True, paused_ms=now, updated_ms=now):
            return True
        try:
            # No row yet, or a paused one. A savepoint, as the insert fails when the row exists.
            with transaction.atomic(using=alias):
                QueueControl.objects.using(alias).create(queue=queue, paused=True, paused_ms=now, limited=False, updated_ms=now)
            return True
        except IntegrityError:
            # The row was there (paused), or another session inserted it first (a pause, a limited
            # job): the answer is what this update finds, not what an earlier read saw.
            return unpaused.update(paused=True, paused_ms=now, updated_ms=now) == 1


def resume(queue: str, *, now_ms: int | None = None, using: str | None = None) -> bool:
    """Let workers start jobs of ``queue`` again and wake its idle workers; True when it was paused."""
    check_queue(queue)
    alias = alias_of(using)
    return Store(alias).retrying("resume", partial(_resume, queue, now_or(now_ms), alias))


def _resume(queue: str, now: int, alias: str, _dialect: object) -> bool:
    with transaction.atomic(using=alias):
        # The row stays: it may also say that the queue holds limited jobs.
        resumed = (
            QueueControl.objects.using(alias)
            .filter(queue=queue, paused=True)
            .update(paused=False, paused_ms=None, updated_ms=now)
        )
        if resumed:
            # Its idle workers sleep (nothing was due for them): wake them once this commits.
            wakeup.wake_on_commit(alias, [queue])
    return resumed == 1


def paused_queues(*, using: str | None = None) -> dict[str, int]:
    """The paused queues, by name (sorted), with when each was paused (epoch ms)."""
    rows = QueueControl.objects.using(alias_of(using)).filter(paused=True).order_by("queue")
    return {queue: paused_ms or 0 for queue, paused_ms in rows.values_list("queue", "paused_ms")}
