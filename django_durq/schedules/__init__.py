"""Schedules, cron or interval: declared in code or settings, each due time enqueued by exactly one replica.

``declarations`` holds what was declared and checks it, ``intervals`` the due times of an
interval, ``claims`` is the cron duty's pass that takes due times, and ``listing`` is what the
admin and the command line show.
"""

from __future__ import annotations

from .claims import CATCH_UP_LIMIT, ON_TIME_MS, Claim, claim, claim_next, plan, sync, tick
from .declarations import (
    MISSED_POLICIES,
    ScheduleSpec,
    UnknownSchedule,
    find,
    forget,
    schedule,
    schedule_problems,
    schedules,
    spec_problems,
)
from .declarations import _declared as _declared  # what test runs of the docs reset between pages
from .listing import ScheduleInfo, format_schedules, list_schedules, run_now

__all__ = [
    "CATCH_UP_LIMIT",
    "MISSED_POLICIES",
    "ON_TIME_MS",
    "Claim",
    "ScheduleInfo",
    "ScheduleSpec",
    "UnknownSchedule",
    "claim",
    "claim_next",
    "find",
    "forget",
    "format_schedules",
    "list_schedules",
    "plan",
    "run_now",
    "schedule",
    "schedule_problems",
    "schedules",
    "spec_problems",
    "sync",
    "tick",
]
