"""What the admin and ``manage.py durq_schedules`` show of the schedules, and running one now."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .. import clock
from ..clock import ms_to_datetime
from ..conf import get_settings
from ..cron import CronError, zone
from ..handlers.registry import registry
from ..models import Job, Schedule
from .declarations import UnknownSchedule, collect, find, spec_problems


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


def list_schedules(now_ms: int | None = None) -> list[ScheduleInfo]:
    """Every declared schedule with its last and next due time, then rows that nothing declares."""
    now = clock.now_ms() if now_ms is None else now_ms
    specs, _ = collect()
    rows = {row.name: row for row in Schedule.objects.using(get_settings().database).all()}
    infos = []
    for spec in specs:
        row = rows.pop(spec.name, None)
        problems = spec_problems(spec, now)
        next_due = row.next_due_ms if row is not None else None
        if next_due is None and not problems:
            next_due = spec.next_due_ms(now)
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
    return registry.require(spec.job).using(queue=spec.queue, priority=spec.priority).enqueue(*spec.args, **spec.kwargs)


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
