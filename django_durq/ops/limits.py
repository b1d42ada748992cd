"""Limits at work: per queue, how much of its running and rate limits is used, and which keys are full.

Read from the same rows the limited claim counts (``db/places.py``, ``db/starts.py``), so what an
operator sees is what holds jobs back: places held by running handlers, and starts in the rate's
window. A key is one scope across queues: a queue lists the keys that hold back its due jobs or
that its own handlers hold, with the places they hold in every queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.db.models import Min, Sum

from ..conf import get_settings
from ..db import dialect_for, places
from ..db.starts import key_scope, queue_scope
from ..models import JobStart
from .reading import alias_of, jobs_on, now_or

# The most keys listed per queue; the count of keys at their limit is exact.
MAX_KEYS_LISTED = 20
# The most rate-limited keys with due jobs looked at per queue (one count of the start log each).
MAX_RATED_KEYS = 1_000


@dataclass
class KeyAtLimit:
    key: str
    running: int
    max_running: int | None  # None: held back by its rate, not by running jobs
    started_in_window: int = 0
    rate: int | None = None
    period_ms: int | None = None


@dataclass
class LimitUsage:
    queue: str
    max_running: int | None  # the queue's own limit (DURQ["QUEUES"]), None when it has none
    running: int  # places held by the queue's running handlers: what the limit counts
    rate: str | None  # the queue's own rate, as "10/s"
    started_in_window: int  # starts in the rate's window ending now
    keys_at_limit: int  # keys whose jobs wait because the key is full
    held_back: int  # due jobs waiting for their key or the queue to have room
    keys: list[KeyAtLimit] = field(default_factory=list)  # up to MAX_KEYS_LISTED of them

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["keys"] = [dict(key.__dict__) for key in self.keys]
        return data


def limit_usage(*, queue: str | None = None, now_ms: int | None = None, using: str | None = None) -> list[LimitUsage]:
    """Queues with limits of their own, limited jobs or places held, with what their limits hold back now."""
    now = now_or(now_ms)
    alias = alias_of(using)
    settings = get_settings()
    jobs = jobs_on(alias)
    held = places.held(dialect_for(connections[alias]), now)
    limited_queues = set(jobs.filter(limit_key__isnull=False).active().values_list("queue", flat=True).distinct())
    limited_queues |= {held_queue for held_queue, key, _ in held if key is not None}
    configured = {name for name, options in settings.queues.items() if options.limits.any}
    names = sorted((limited_queues | configured) if queue is None else {queue})
    return [_usage(name, now, alias, held) for name in names]


def _usage(queue: str, now: int, alias: str, held: list[tuple[str, str | None, int | None]]) -> LimitUsage:
    limits = get_settings().queue(queue).limits
    jobs = jobs_on(alias).in_queue(queue)
    running = sum(1 for held_queue, _, _ in held if held_queue == queue)
    started = 0
    if limits.rate is not None:
        since = now - limits.rate.period_ms
        started = _starts(alias, queue_scope(queue), since)
    keys = _full_keys(queue, now, alias, held)
    due = jobs.due(now)
    queue_full = (limits.max_running is not None and running >= limits.max_running) or (
        limits.rate is not None and started >= limits.rate.count
    )
    held_back = due.count() if queue_full else due.filter(limit_key__in=[key.key for key in keys]).count()
    return LimitUsage(
        queue=queue,
        max_running=limits.max_running,
        running=running,
        rate=str(limits.rate) if limits.rate else None,
        started_in_window=started,
        keys_at_limit=len(keys),
        held_back=held_back,
        keys=keys[:MAX_KEYS_LISTED],
    )


def _full_keys(queue: str, now: int, alias: str, held: list[tuple[str, str | None, int | None]]) -> list[KeyAtLimit]:
    """Keys that hold back due jobs of ``queue``, or that its handlers hold, and may not start another job now."""
    due = jobs_on(alias).in_queue(queue).due(now).filter(limit_key__isnull=False)
    running: dict[str, tuple[int, int | None]] = {}
    for _, key, at_most in held:
        if key is not None:
            count, least = running.get(key, (0, None))
            known = [value for value in (least, at_most) if value is not None]
            running[key] = (count + 1, min(known) if known else None)  # the least max_running among them
    at_limit = {key for key, (count, least) in running.items() if least is not None and count >= least}
    here = {key for held_queue, key, _ in held if held_queue == queue and key in at_limit}
    here |= {str(key) for key in due.filter(limit_key__in=at_limit).values_list("limit_key", flat=True)}
    full: dict[str, KeyAtLimit] = {key: KeyAtLimit(key, *running[key]) for key in here}
    rated = (
        due.filter(limit_rate__isnull=False).values("limit_key").annotate(rate=Min("limit_rate"), period=Min("limit_period_ms"))
    )
    for row in rated[:MAX_RATED_KEYS]:
        key, rate, period = str(row["limit_key"]), int(row["rate"]), int(row["period"])
        started = _starts(alias, key_scope(key), now - period)
        if started >= rate:
            entry = full.setdefault(key, KeyAtLimit(key, running.get(key, (0, None))[0], None))
            entry.started_in_window, entry.rate, entry.period_ms = started, rate, period
    return sorted(full.values(), key=lambda key: (-key.running, -key.started_in_window, key.key))


def _starts(alias: str, scope: str, since: int) -> int:
    """Starts logged on ``scope`` later than ``since`` (a row holds the starts of one claim)."""
    rows = JobStart.objects.using(alias).filter(scope=scope, started_ms__gt=since)
    return int(rows.aggregate(total=Sum("starts"))["total"] or 0)
