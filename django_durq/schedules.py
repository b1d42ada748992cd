"""Cron schedules: declared in code or settings, each due time claimed by exactly one replica.

A schedule's row in ``durq_schedule`` holds its next due time. Whoever runs the cron duty takes a
due time by compare-and-set (``UPDATE durq_schedule SET next_due_ms = <next> … WHERE name = %s
AND next_due_ms = <due>``) and enqueues the job in the same transaction. However many replicas
race, one update changes the row and the others change nothing; if the enqueue fails, the
rollback hands the due time back for the next pass.

Due times missed while every worker was down follow the schedule's ``missed`` policy:
``"collapse"`` (the default) runs once for all of them, ``"skip"`` runs none, ``"all"`` runs each
one (at most :data:`CATCH_UP_LIMIT` per pass). A due time counts as missed under ``"skip"`` once
the one after it has also passed, or once it is more than :data:`ON_TIME_MS` late.
"""

from __future__ import annotations

import difflib
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction

from . import clock
from .clock import ms_to_datetime
from .conf import Problem, get_settings
from .cron import CronError, fields, next_due_ms, zone
from .exceptions import DurqError, InvalidPayload
from .models import Job, Schedule
from .payload import encode_arguments
from .registry import JobDefinition, registry

logger = logging.getLogger("django_durq")

MISSED_POLICIES = ("collapse", "skip", "all")
ON_TIME_MS = 60_000
CATCH_UP_LIMIT = 100
SETTINGS_KEYS = {"cron", "job", "kwargs", "queue", "priority", "missed", "timezone"}


class UnknownSchedule(DurqError, LookupError):
    """Raised for a schedule name that nothing declares."""


@dataclass(frozen=True)
class ScheduleSpec:
    """One declared schedule: run ``job`` with ``kwargs`` at each due time of ``cron`` in ``timezone``."""

    name: str
    cron: str
    job: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    missed: str = "collapse"
    timezone: str = "UTC"
    source: str = "django_durq.schedule()"


@dataclass(frozen=True)
class Claim:
    """A due time taken by this caller; ``job_id`` is None when the policy skipped it."""

    schedule: str
    due_ms: int
    next_due_ms: int
    job_id: int | None


@dataclass(frozen=True)
class ScheduleInfo:
    """What the admin and ``manage.py durq_schedules`` show for one schedule."""

    name: str
    cron: str
    timezone: str
    job: str
    missed: str
    source: str
    last_due_ms: int | None
    next_due_ms: int | None
    last_job_id: int | None
    declared: bool
    problem: str | None = None

    @property
    def last_due(self) -> datetime | None:
        return self._local(self.last_due_ms)

    @property
    def next_due(self) -> datetime | None:
        return self._local(self.next_due_ms)

    def _local(self, ms: int | None) -> datetime | None:
        value = ms_to_datetime(ms)
        if value is None:
            return None
        try:
            return value.astimezone(zone(self.timezone))
        except CronError:
            return value


_declared: dict[str, ScheduleSpec] = {}
_conflicts: dict[str, str] = {}
_lock = threading.Lock()


def schedule(
    name: str,
    cron: str,
    job: str | JobDefinition,
    *,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    missed: str = "collapse",
    timezone: str = "UTC",
) -> ScheduleSpec:
    """Declare a schedule; a bad value is reported by ``manage.py check`` (durq.E010-E013), not here."""
    spec = ScheduleSpec(
        name=name,
        cron=cron,
        job=job.name if isinstance(job, JobDefinition) else job,
        kwargs=dict(kwargs or {}),
        queue=queue,
        priority=priority,
        missed=missed,
        timezone=timezone,
    )
    with _lock:
        existing = _declared.get(name)
        if existing is not None and existing != spec:
            _conflicts[name] = f"schedule {name!r} is declared twice with different options"
        _declared[name] = spec
    return spec


def forget(name: str) -> None:
    """Drop a schedule declared with :func:`schedule` (its row and due times stay)."""
    with _lock:
        _declared.pop(name, None)
        _conflicts.pop(name, None)


def _collect() -> tuple[list[ScheduleSpec], list[Problem]]:
    """Every declared schedule, settings over code, and the problems of declaring them."""
    problems = [Problem("durq.E013", message, "Declare each schedule once.") for message in _conflicts.values()]
    specs: dict[str, ScheduleSpec] = {}
    for definition in registry.all():
        if definition.cron is not None:
            specs[definition.name] = ScheduleSpec(definition.name, definition.cron, definition.name, source="@job(cron=...)")
    with _lock:
        declared = dict(_declared)
    for name, spec in declared.items():
        if name in specs:
            problems.append(
                Problem(
                    "durq.E013",
                    f"schedule {name!r} is declared both by @job(cron=...) and by django_durq.schedule()",
                    "Give the django_durq.schedule() declaration another name, or drop cron= from @job.",
                )
            )
        specs[name] = spec
    for name, spec_or_none in _from_settings(get_settings().schedules, problems).items():
        if spec_or_none is None:
            specs.pop(name, None)  # DURQ["SCHEDULES"][name] = None turns a schedule in code off
        else:
            specs[name] = spec_or_none
    return [specs[name] for name in sorted(specs)], problems


def _from_settings(raw: dict[str, Any], problems: list[Problem]) -> dict[str, ScheduleSpec | None]:
    hint = 'Write DURQ["SCHEDULES"]["name"] = {"cron": "0 3 * * *", "job": "app.job_name"}; see docs/cron.md.'
    found: dict[str, ScheduleSpec | None] = {}
    for name, options in raw.items():
        where = f'DURQ["SCHEDULES"][{name!r}]'
        if options is None:
            found[name] = None
            continue
        if not isinstance(options, dict):
            problems.append(Problem("durq.E013", f"schedule {name!r}: {where} must be a dict or None", hint))
            continue
        unknown = sorted(set(options) - SETTINGS_KEYS)
        missing = sorted({"cron", "job"} - set(options))
        if unknown or missing:
            what = f"has unknown keys {unknown}" if unknown else f"lacks {missing}"
            problems.append(
                Problem("durq.E013", f"schedule {name!r}: {where} {what}", f"Known keys: {', '.join(sorted(SETTINGS_KEYS))}.")
            )
            if missing:
                continue
        kwargs = options.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            problems.append(Problem("durq.E013", f"schedule {name!r}: {where}['kwargs'] must be a dict", hint))
            continue
        found[name] = ScheduleSpec(
            name=name,
            cron=options["cron"],
            job=options["job"],
            kwargs=kwargs,
            queue=options.get("queue"),
            priority=options.get("priority"),
            missed=options.get("missed", "collapse"),
            timezone=options.get("timezone", "UTC"),
            source=where,
        )
    return found


def spec_problems(spec: ScheduleSpec, now_ms: int) -> list[Problem]:
    """What is wrong with one declaration, each message naming the schedule and where it is declared."""
    label = f"schedule {spec.name!r} ({spec.source})"
    found: list[Problem] = []

    def add(id_: str, message: str, hint: str) -> None:
        found.append(Problem(id_, f"{label}: {message}", hint))

    if not isinstance(spec.name, str) or not 0 < len(spec.name) <= 200:
        add("durq.E013", "the name must be a string of 1 to 200 characters", "Rename the schedule.")
    zone_ok = True
    try:
        zone(spec.timezone)
    except CronError as error:
        add("durq.E011", str(error), "Use an IANA name such as 'Europe/Berlin', 'America/New_York' or 'UTC'.")
        zone_ok = False
    cron_hint = "Write five fields (minute hour day month weekday), or six with seconds first, e.g. '*/5 * * * *'."
    try:
        fields(spec.cron)
        if len(spec.cron) > 200:
            raise CronError("the cron expression is longer than 200 characters")
        next_due_ms(spec.cron, spec.timezone if zone_ok else "UTC", now_ms)
    except CronError as error:
        add("durq.E010", str(error), cron_hint)
    if not isinstance(spec.job, str) or registry.get(spec.job) is None:
        close = difflib.get_close_matches(spec.job, [d.name for d in registry.all()], n=3) if isinstance(spec.job, str) else []
        hint = f"Did you mean {', '.join(repr(c) for c in close)}?" if close else "Name a job registered with @job."
        add("durq.E012", f"no job is registered under the name {spec.job!r}", hint)
    if spec.missed not in MISSED_POLICIES:
        add("durq.E013", f"missed={spec.missed!r} is not a policy", f"Use one of {', '.join(MISSED_POLICIES)}.")
    queue_ok = isinstance(spec.queue, str) and 0 < len(spec.queue) <= 100 and ":" not in spec.queue
    if spec.queue is not None and not queue_ok:
        add("durq.E013", f"queue={spec.queue!r} is not a queue name", "Use a name without ':' of 1 to 100 characters.")
    if spec.priority is not None and (
        isinstance(spec.priority, bool) or not isinstance(spec.priority, int) or not -32768 <= spec.priority <= 32767
    ):
        add("durq.E013", f"priority={spec.priority!r} is not a whole number in -32768..32767", "Write for example priority=5.")
    if not isinstance(spec.kwargs, dict) or not all(isinstance(key, str) for key in spec.kwargs):
        add("durq.E013", "kwargs must be a dict with string keys", 'Write kwargs={"key": "value"}.')
    else:
        try:
            encode_arguments([], spec.kwargs, get_settings().max_payload_bytes)
        except InvalidPayload as error:
            add("durq.E013", f"kwargs cannot be stored: {error}", "Pass JSON values: str, int, float, bool, None, list, dict.")
    return found


def schedule_problems(now_ms: int | None = None) -> list[Problem]:
    """Every problem of every declared schedule (the system check reports these)."""
    now = clock.now_ms() if now_ms is None else now_ms
    specs, problems = _collect()
    for spec in specs:
        problems.extend(spec_problems(spec, now))
    return problems


def schedules(now_ms: int | None = None) -> list[ScheduleSpec]:
    """The declared schedules that can run (a schedule with a problem is left out)."""
    now = clock.now_ms() if now_ms is None else now_ms
    specs, _ = _collect()
    return [spec for spec in specs if not spec_problems(spec, now)]


def find(name: str) -> ScheduleSpec:
    for spec in _collect()[0]:
        if spec.name == name:
            return spec
    raise UnknownSchedule(f"no schedule is declared under the name {name!r}")


# --- claiming ------------------------------------------------------------------------------------


def plan(spec: ScheduleSpec, due_ms: int, now_ms: int, on_time_ms: int = ON_TIME_MS) -> tuple[bool, int]:
    """Whether taking ``due_ms`` at ``now_ms`` runs the job, and the due time that follows it."""
    if spec.missed == "all":
        return True, next_due_ms(spec.cron, spec.timezone, due_ms)
    following = next_due_ms(spec.cron, spec.timezone, now_ms)
    if spec.missed == "skip":
        missed = now_ms - due_ms > on_time_ms or next_due_ms(spec.cron, spec.timezone, due_ms) <= now_ms
        return not missed, following
    return True, following


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
            job_id = definition.enqueue(**spec.kwargs).pk
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
        next_due = next_due_ms(spec.cron, spec.timezone, now_ms)
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


def tick(now_ms: int, *, on_time_ms: int = ON_TIME_MS) -> dict[str, int]:
    """One pass of the cron duty: sync rows, then claim every due time that has come."""
    counts = {"ran": 0, "skipped": 0, "lost": 0, "failed": 0}
    specs = schedules(now_ms)
    due_times = sync(specs, now_ms)
    for spec in specs:
        due = due_times.get(spec.name)
        for _ in range(CATCH_UP_LIMIT if spec.missed == "all" else 1):
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
                logger.info("durq: schedule %s missed its due time %s; skipped", spec.name, ms_to_datetime(due))
                counts["skipped"] += 1
            else:
                counts["ran"] += 1
            due = taken.next_due_ms
    return counts


# --- for the admin and the command line ----------------------------------------------------------


def list_schedules(now_ms: int | None = None) -> list[ScheduleInfo]:
    """Every declared schedule with its last and next due time, then rows that nothing declares."""
    now = clock.now_ms() if now_ms is None else now_ms
    specs, _ = _collect()
    rows = {row.name: row for row in Schedule.objects.using(get_settings().database).all()}
    infos = []
    for spec in specs:
        row = rows.pop(spec.name, None)
        problems = spec_problems(spec, now)
        next_due = row.next_due_ms if row is not None else None
        if next_due is None and not problems:
            next_due = next_due_ms(spec.cron, spec.timezone, now)
        infos.append(
            ScheduleInfo(
                name=spec.name,
                cron=spec.cron,
                timezone=spec.timezone,
                job=spec.job,
                missed=spec.missed,
                source=spec.source,
                last_due_ms=row.last_due_ms if row is not None else None,
                next_due_ms=next_due,
                last_job_id=row.last_job_id if row is not None else None,
                declared=True,
                problem=problems[0].message if problems else None,
            )
        )
    for row in rows.values():
        infos.append(
            ScheduleInfo(
                name=row.name,
                cron=row.cron,
                timezone=row.timezone,
                job="",
                missed="",
                source="",
                last_due_ms=row.last_due_ms,
                next_due_ms=row.next_due_ms,
                last_job_id=row.last_job_id,
                declared=False,
            )
        )
    return infos


def run_now(name: str) -> Job:
    """Enqueue one run of the schedule now, outside its due times (which stay as they are)."""
    spec = find(name)
    problems = spec_problems(spec, clock.now_ms())
    if problems:
        raise UnknownSchedule(problems[0].message)
    return registry.require(spec.job).using(queue=spec.queue, priority=spec.priority).enqueue(**spec.kwargs)


def format_schedules(now_ms: int | None = None) -> str:
    """The schedule list as a text table, for ``manage.py durq_schedules``."""
    infos = list_schedules(now_ms)
    if not infos:
        return "No schedules are declared."
    header = ("NAME", "CRON", "TIME ZONE", "JOB", "MISSED", "LAST DUE", "NEXT DUE")
    lines = [header]
    for info in infos:
        job = info.job if info.declared else "(no longer declared)"
        lines.append((info.name, info.cron, info.timezone, job, info.missed, _when(info.last_due), _when(info.next_due)))
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines]
    text.extend(f"error: {info.problem}" for info in infos if info.problem)
    return "\n".join(text)


def _when(value: datetime | None) -> str:
    return value.isoformat(sep=" ") if value is not None else "-"
