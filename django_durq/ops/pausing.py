"""Pausing a queue: no worker, in any process on any host, starts a job of a paused queue until it is resumed.

The state is a row of ``durq_queue_control`` shared by every worker, and every claim reads it
(see ``db/base.py``'s ``NOT_PAUSED``): a pause holds from the commit of :func:`pause` on, without
telling any worker. Jobs that are running when it commits finish; jobs a worker had already
claimed ahead (``PREFETCH``) start only within 10 ms of the commit, or are handed back with
their attempts not counted (``worker/pause_guard.py``). While paused, the queue takes new jobs
as usual: they wait. :func:`resume` wakes the queue's idle workers, so its due jobs start at once.

Each pause and resume that changes the state records when, who and why on the same row, in the
same statement (:func:`queue_switches` reads them back): the admin asks for the reason, ``manage.py
durq pause --reason`` takes it. A pause of a paused queue, or a resume of an active one, changes
nothing, its record included.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from django.db import IntegrityError, transaction
from django.db.models import Q

from ..db import wakeup
from ..db.store import Store
from ..handlers.options import check_queue
from ..models import QueueControl
from .reading import alias_of, now_or

MAX_REASON = 500  # characters of a pause's or a resume's reason (durq_queue_control.switch_reason)
MAX_BY = 150  # characters of who did it: Django's username length


@dataclass(frozen=True)
class QueueSwitch:
    """The last pause or resume of a queue: whether it is paused now, and when, by whom and why it was switched."""

    queue: str
    paused: bool
    at_ms: int | None  # None: paused before django-durq recorded switches
    by: str  # "" when not said
    reason: str  # "" when not said


def check_words(reason: str, by: str) -> tuple[str, str]:
    """``reason`` and ``by`` stripped; ValueError when one is too long or holds a NUL byte."""
    reason, by = reason.strip(), by.strip()
    for label, value, limit in (("reason", reason, MAX_REASON), ("by", by, MAX_BY)):
        if len(value) > limit:
            raise ValueError(f"the {label} is {len(value)} characters long; write at most {limit} characters")
        if "\x00" in value:
            raise ValueError(f"the {label} holds a NUL byte")
    return reason, by


def pause(queue: str, *, now_ms: int | None = None, using: str | None = None, reason: str = "", by: str = "") -> bool:
    """Stop workers from starting jobs of ``queue``; True when this call paused it, False when it already was.

    ``reason`` and ``by`` (who asks) are recorded with the time. Pausing a paused queue changes
    nothing: it stays paused since the first pause, for the first pause's reason.
    """
    check_queue(queue)
    reason, by = check_words(reason, by)
    alias = alias_of(using)
    return Store(alias).retrying("pause", partial(_pause, queue, now_or(now_ms), reason, by, alias))


def _pause(queue: str, now: int, reason: str, by: str, alias: str, _dialect: object) -> bool:
    unpaused = QueueControl.objects.using(alias).filter(queue=queue, paused=False)
    record = {"paused": True, "paused_ms": now, "updated_ms": now, "switched_ms": now, "switched_by": by, "switch_reason": reason}
    with transaction.atomic(using=alias):
        if unpaused.update(**record):
            return True
        try:
            # No row yet, or a paused one. A savepoint, as the insert fails when the row exists.
            with transaction.atomic(using=alias):
                QueueControl.objects.using(alias).create(queue=queue, limited=False, **record)
            return True
        except IntegrityError:
            # The row was there (paused), or another session inserted it first (a pause, a limited
            # job): the answer is what this update finds, not what an earlier read saw.
            return unpaused.update(**record) == 1


def resume(queue: str, *, now_ms: int | None = None, using: str | None = None, reason: str = "", by: str = "") -> bool:
    """Let workers start jobs of ``queue`` again and wake its idle workers; True when it was paused.

    ``reason`` and ``by`` are recorded with the time, in place of the pause's.
    """
    check_queue(queue)
    reason, by = check_words(reason, by)
    alias = alias_of(using)
    return Store(alias).retrying("resume", partial(_resume, queue, now_or(now_ms), reason, by, alias))


def _resume(queue: str, now: int, reason: str, by: str, alias: str, _dialect: object) -> bool:
    with transaction.atomic(using=alias):
        # The row stays: it may also say that the queue holds limited jobs.
        resumed = (
            QueueControl.objects.using(alias)
            .filter(queue=queue, paused=True)
            .update(paused=False, paused_ms=None, updated_ms=now, switched_ms=now, switched_by=by, switch_reason=reason)
        )
        if resumed:
            # Its idle workers sleep (nothing was due for them): wake them once this commits.
            wakeup.wake_on_commit(alias, [queue])
    return resumed == 1


def paused_queues(*, using: str | None = None) -> dict[str, int]:
    """The paused queues, by name (sorted), with when each was paused (epoch ms)."""
    rows = QueueControl.objects.using(alias_of(using)).filter(paused=True).order_by("queue")
    return {queue: paused_ms or 0 for queue, paused_ms in rows.values_list("queue", "paused_ms")}


def queue_switches(*, using: str | None = None) -> dict[str, QueueSwitch]:
    """Each queue that is paused or was switched, by name (sorted), with its last pause or resume."""
    rows = (
        QueueControl.objects.using(alias_of(using))
        .filter(Q(paused=True) | Q(switched_ms__isnull=False))
        .order_by("queue")
        .values_list("queue", "paused", "paused_ms", "switched_ms", "switched_by", "switch_reason")
    )
    return {
        queue: QueueSwitch(queue, paused, switched_ms if switched_ms is not None else paused_ms, by or "", reason or "")
        for queue, paused, paused_ms, switched_ms, by, reason in rows
    }
