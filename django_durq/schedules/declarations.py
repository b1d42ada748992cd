"""Schedules as declared: in code (``@job(cron=...)``, ``django_durq.schedule()``) or in settings.

Declaring records a schedule and nothing more; ``manage.py check`` reports what is wrong with
one (durq.E010-E013), and only schedules without a problem run.
"""

from __future__ import annotations

import difflib
import threading
from dataclasses import dataclass, field
from typing import Any

from .. import clock
from ..conf import Problem, get_settings
from ..cron import CronError, fields, next_due_ms, zone
from ..exceptions import DurqError, InvalidPayload
from ..handlers.payload import encode_arguments
from ..handlers.registry import JobDefinition, registry

MISSED_POLICIES = ("collapse", "skip", "all")
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


def collect() -> tuple[list[ScheduleSpec], list[Problem]]:
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
    specs, problems = collect()
    for spec in specs:
        problems.extend(spec_problems(spec, now))
    return problems


def schedules(now_ms: int | None = None) -> list[ScheduleSpec]:
    """The declared schedules that can run (a schedule with a problem is left out)."""
    now = clock.now_ms() if now_ms is None else now_ms
    specs, _ = collect()
    return [spec for spec in specs if not spec_problems(spec, now)]


def find(name: str) -> ScheduleSpec:
    for spec in collect()[0]:
        if spec.name == name:
            return spec
    raise UnknownSchedule(f"no schedule is declared under the name {name!r}")
