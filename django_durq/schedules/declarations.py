"""Schedules as declared: in code (``@job(cron=...)``, ``django_durq.schedule()``) or in settings.

A schedule runs at each due time of a cron expression, or every so long (``intervals.py``).
Declaring records a schedule and nothing more; ``manage.py check`` reports what is wrong with
one (durq.E010-E013), and only schedules without a problem run.
"""

from __future__ import annotations

import difflib
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .. import clock
from ..conf import Problem, get_settings
from ..cron import CronError, fields, next_due_ms, zone
from ..exceptions import DurqError, InvalidPayload
from ..handlers.payload import encode_arguments
from ..handlers.registry import JobDefinition, registry
from . import intervals

MISSED_POLICIES = ("collapse", "skip", "all")
SETTINGS_KEYS = {"cron", "every", "job", "args", "kwargs", "queue", "priority", "missed", "timezone"}
WHEN_HINT = "Give either cron='0 3 * * *' or every=timedelta(minutes=45) (whole seconds, at least one)."


class UnknownSchedule(DurqError, LookupError):
    """Raised for a schedule name that nothing declares."""


@dataclass(frozen=True)
class ScheduleSpec:
    """One declared schedule: run ``job`` with ``args`` and ``kwargs`` at each due time of ``cron`` in
    ``timezone``, or every ``every_ms``; then ``cron`` is the interval's text (``every 45m``), which is
    what the schedule's row stores and lists show."""

    name: str
    cron: str
    job: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    missed: str = "collapse"
    timezone: str = "UTC"
    source: str = "django_durq.schedule()"
    every_ms: int | None = None
    args: tuple[Any, ...] = ()
    # Why ``cron`` and ``every`` do not make a schedule (both, neither, a bad interval), or "".
    when_problem: str = ""

    def next_due_ms(self, after_ms: int, on_grid_ms: int | None = None) -> int:
        """The first due time strictly after ``after_ms``; an interval's lies on the grid through
        ``on_grid_ms`` (a due time of this schedule) when given (see ``intervals.py``)."""
        if self.every_ms is not None:
            return intervals.next_due_ms(self.every_ms, after_ms, on_grid_ms)
        return next_due_ms(self.cron, self.timezone, after_ms)


def _when(cron: object, every: object) -> tuple[str, int | None, str]:
    """(the text stored as ``cron``, the interval in ms or None, the problem or "") of a declaration."""
    if every is None:
        if cron is None:
            return "", None, "it has neither cron nor every"
        return cron, None, ""  # type: ignore[return-value]  # a non-str cron is reported by the check
    if cron is not None:
        return str(cron), None, "it has both cron and every; give one of them"
    try:
        every_ms = intervals.interval_ms(every)
    except intervals.IntervalError as error:
        return f"every {every!r}", None, str(error)
    return intervals.text(every_ms), every_ms, ""


_declared: dict[str, ScheduleSpec] = {}
_conflicts: dict[str, str] = {}
_lock = threading.Lock()


def schedule(
    name: str,
    cron: str | None = None,
    job: str | JobDefinition | None = None,
    *,
    every: timedelta | float | None = None,
    args: list[Any] | tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    missed: str = "collapse",
    timezone: str = "UTC",
) -> ScheduleSpec:
    """Declare a schedule; a bad value is reported by ``manage.py check`` (durq.E010-E013), not here.

    Give ``cron`` (an expression) or ``every`` (a timedelta or seconds), not both. Only a missing
    ``job`` raises here, as a missing argument would.
    """
    if job is None:
        raise TypeError("schedule() needs the job to run: schedule(name, cron, job) or schedule(name, job=..., every=...)")
    text, every_ms, when_problem = _when(cron, every)
    spec = ScheduleSpec(
        name=name,
        cron=text,
        job=job.name if isinstance(job, JobDefinition) else job,
        kwargs=dict(kwargs or {}),
        queue=queue,
        priority=priority,
        missed=missed,
        timezone=timezone,
        every_ms=every_ms,
        args=_positional(args),
        when_problem=when_problem,
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


def _positional(args: object) -> Any:
    """Positional arguments as a tuple; anything that is not a list or tuple is kept for the check to name."""
    if args is None:
        return ()
    return tuple(args) if isinstance(args, (list, tuple)) else args


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
        missing = sorted({"job"} - set(options))
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
        text, every_ms, when_problem = _when(options.get("cron"), options.get("every"))
        found[name] = ScheduleSpec(
            name=name,
            cron=text,
            job=options["job"],
            kwargs=kwargs,
            queue=options.get("queue"),
            priority=options.get("priority"),
            missed=options.get("missed", "collapse"),
            timezone=options.get("timezone", "UTC"),
            source=where,
            every_ms=every_ms,
            args=_positional(options.get("args")),
            when_problem=when_problem,
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
    if spec.when_problem:
        add("durq.E010", spec.when_problem, WHEN_HINT)
    elif spec.every_ms is not None:
        if spec.timezone != "UTC":
            add("durq.E013", "an interval runs by elapsed time; timezone applies to cron only", "Drop timezone.")
    else:
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
    found.extend(_argument_problems(spec, label))
    return found


def _argument_problems(spec: ScheduleSpec, label: str) -> list[Problem]:
    """What is wrong with a schedule's arguments: not JSON, or not what its handler takes."""
    if not isinstance(spec.args, tuple):
        return [Problem("durq.E013", f"{label}: args must be a list or a tuple", "Write args=[1, 2].")]
    if not isinstance(spec.kwargs, dict) or not all(isinstance(key, str) for key in spec.kwargs):
        return [Problem("durq.E013", f"{label}: kwargs must be a dict with string keys", 'Write kwargs={"key": "value"}.')]
    json_hint = "Pass JSON values: str, int, float, bool, None, list, dict."
    try:
        encode_arguments(list(spec.args), spec.kwargs, get_settings().max_payload_bytes)
    except InvalidPayload as error:
        return [Problem("durq.E013", f"{label}: the arguments cannot be stored: {error}", json_hint)]
    definition = registry.get(spec.job) if isinstance(spec.job, str) else None
    if definition is not None:
        try:
            definition.check_arguments(spec.args, spec.kwargs)
        except TypeError as error:
            return [Problem("durq.E013", f"{label}: {error}", "Give args and kwargs that the handler takes.")]
    return []


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
