"""The cron duty's pass: each due time of each schedule (cron or interval) taken by exactly one replica.

A schedule's row in ``durq_schedule`` holds its next due time. Whoever runs the cron duty takes a
due time by compare-and-set (``UPDATE durq_schedule SET next_due_ms = <next> … WHERE name = %s
AND next_due_ms = <due>``) and enqueues the job in the same transaction. However many replicas
race, one update changes the row and the others change nothing; if the enqueue fails, the
rollback hands the due time back for the next pass.

A due time is missed only when no worker was up to enqueue it: when the pass that reaches it
comes more than ``on_time_ms`` (:data:`ON_TIME_MS`, many times what taking over the duty from a
dead worker takes) after it. Every due time a pass reaches sooner is enqueued, each on its own,
so a pass that comes late merges and drops nothing. Missed due times follow the schedule's ``missed``
policy: ``"collapse"`` (the default) runs once for all of them, ``"skip"`` runs none, ``"all"``
runs each one. A pass takes at most :data:`CATCH_UP_LIMIT` due times of a schedule; the next
pass goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction

from ..clock import ms_to_datetime
from ..conf import get_settings
from ..handlers.registry import registry
from ..models import Schedule
from .declarations import ScheduleSpec, schedules

logger = logging.getLogger("django_durq")

ON_TIME_MS = 60_000
CATCH_UP_LIMIT = 100


@dataclass(frozen=True)
class Claim:
    """A due time taken by this caller; ``job_id`` is None when the policy skipped it."""

    schedule: str
    due_ms: int
    next_due_ms: int
    job_id: int | None


def plan(spec: ScheduleSpec, due_ms: int, now_ms: int, on_time_ms: int = ON_TIME_MS) -> tuple[bool, int]:
    """Whether taking ``due_ms`` at ``now_ms`` runs the job, and the due time that follows it.

    The following due time is always strictly after ``due_ms``; for a missed one it is the first
    due time that is still on time, so the missed ones go together.
    """
    if spec.missed == "all" or now_ms - due_ms <= on_time_ms:
        return True, spec.next_due_ms(due_ms, on_grid_ms=due_ms)
    following = spec.next_due_ms(now_ms - on_time_ms - 1, on_grid_ms=due_ms)
    return spec.missed == "collapse", following


def claim(spec: ScheduleSpec, due_ms: int, now_ms: int, *, on_time_ms: int = ON_TIME_MS) -> Claim | None:
    """Take due time ``due_ms`` of ``spec`` unless another caller has; None when it lost or is early."""
    if due_ms > now_ms:
        return None
    run, next_due = plan(spec, due_ms, now_ms, on_time_ms)
    alias = get_settings().database
    changes: dict[str, Any] = {"next_due_ms": next_due, "updated_ms": now_ms}
    if run:
        changes["last_due_ms"] = due_ms
    with transaction.atomic(using=alias):
        rows = Schedule.objects.using(alias).filter(name=spec.name, cron=spec.cron, timezone=spec.timezone, next_due_ms=due_ms)
        if rows.update(**changes) != 1:
            return None
        job_id = None
        if run:
            definition = registry.require(spec.job).using(queue=spec.queue, priority=spec.priority, run_at=ms_to_datetime(due_ms))
            job_id = definition.enqueue(*spec.args, **spec.kwargs).pk
            Schedule.objects.using(alias).filter(name=spec.name).update(last_job_id=job_id)
    return Claim(spec.name, due_ms, next_due, job_id)


def claim_next(spec: ScheduleSpec, now_ms: int, *, on_time_ms: int = ON_TIME_MS) -> Claim | None:
    """Take the schedule's stored next due time if it has come; None otherwise."""
    due = Schedule.objects.using(get_settings().database).filter(name=spec.name).values_list("next_due_ms", flat=True).first()
    if due is None:
        return None
    return claim(spec, due, now_ms, on_time_ms=on_time_ms)


def sync(specs: list[ScheduleSpec], now_ms: int) -> dict[str, int]:
    """Create or update the rows of ``specs``; returns each schedule's stored next due time.

    A new schedule, or one whose cron or time zone changed, gets the first due time after
    ``now_ms``: declaring a schedule never fires it at once.
    """
    alias = get_settings().database
    manager = Schedule.objects.using(alias)
    stored = {
        name: (expression, tz, due)
        for name, expression, tz, due in manager.filter(name__in=[s.name for s in specs]).values_list(
            "name", "cron", "timezone", "next_due_ms"
        )
    }
    due_times: dict[str, int] = {}
    for spec in specs:
        row = stored.get(spec.name)
        if row is not None and row[:2] == (spec.cron, spec.timezone):
            due_times[spec.name] = row[2]
            continue
        next_due = spec.next_due_ms(now_ms)
        if row is None:
            try:
                with transaction.atomic(using=alias):
                    manager.create(
                        name=spec.name, cron=spec.cron, timezone=spec.timezone, next_due_ms=next_due, updated_ms=now_ms
                    )
            except IntegrityError:
                continue  # another replica created it; the next pass reads it
        else:
            changed = manager.filter(name=spec.name, cron=row[0], timezone=row[1], next_due_ms=row[2]).update(
                cron=spec.cron, timezone=spec.timezone, next_due_ms=next_due, updated_ms=now_ms
            )
            if not changed:
                continue
            logger.info("durq: schedule %s is now %r (%s); next due time recomputed", spec.name, spec.cron, spec.timezone)
        due_times[spec.name] = next_due
    return due_times


def tick(now_ms: int, *, on_time_ms: int = ON_TIME_MS, specs: list[ScheduleSpec] | None = None) -> dict[str, int]:
    """One pass of the cron duty: sync rows, then claim every due time that has come.

    ``specs``: the schedules that can run, when the caller has just read them.
    """
    counts = {"ran": 0, "skipped": 0, "lost": 0, "failed": 0}
    specs = schedules(now_ms) if specs is None else specs
    if not specs:
        return counts  # nothing declared: nothing to read (a site without cron pays nothing each second)
    due_times = sync(specs, now_ms)
    for spec in specs:
        due = due_times.get(spec.name)
        for _ in range(CATCH_UP_LIMIT):
            if due is None or due > now_ms:
                break
            try:
                taken = claim(spec, due, now_ms, on_time_ms=on_time_ms)
            except DatabaseError:
                raise  # the maintenance runner retries the pass
            except Exception:
                logger.exception("durq: schedule %s could not enqueue its run due at %s", spec.name, ms_to_datetime(due))
                counts["failed"] += 1
                break
            if taken is None:
                counts["lost"] += 1
                break
            if taken.job_id is None:
                logger.info(
                    "durq: schedule %s missed its due times from %s until %s; skipped",
                    spec.name,
                    ms_to_datetime(due),
                    ms_to_datetime(taken.next_due_ms),
                )
                counts["skipped"] += 1
            else:
                counts["ran"] += 1
            due = taken.next_due_ms
    return counts
