"""What the schedule tests share: wall times in a zone, the jobs a schedule queued, passes of the cron
duty with a manual clock, and replicas racing in real processes for each due time."""

from __future__ import annotations

import multiprocessing
import os
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django_durq.clock import ManualClock

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
RACERS = 3


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, tz: str = "UTC") -> int:
    """Epoch ms of a local wall time (the first one, where clocks go back)."""
    return int(datetime(year, month, day, hour, minute, second, tzinfo=ZoneInfo(tz)).timestamp()) * 1000


def local(ms: int, tz: str) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(tz)).isoformat()


def local_day(year: int, month: int, day: int, tz: str) -> tuple[int, int]:
    """(start, end) in epoch ms of one local calendar day; 23 or 25 hours on a daylight-saving day."""
    start = at(year, month, day, tz=tz)
    end = int(datetime.fromordinal(datetime(year, month, day).toordinal() + 1).replace(tzinfo=ZoneInfo(tz)).timestamp()) * 1000
    return start, end


def problem_ids(name: str) -> list[str]:
    from django_durq.checks import check_schedules

    return sorted(m.id for m in check_schedules() if f"schedule {name!r}" in m.msg)


def scheduled_jobs(name: str = "tests.noop") -> list[int]:
    """The due times of the jobs named ``name``, in order."""
    from django_durq.models import Job

    return list(Job.objects.filter(name=name).order_by("run_at_ms", "id").values_list("run_at_ms", flat=True))


def run_clock(clock: ManualClock, until_ms: int, step_ms: int, **options: Any) -> dict[str, int]:
    """Tick the cron duty every ``step_ms`` until ``until_ms``; returns the summed counts."""
    from django_durq import schedules

    totals: dict[str, int] = {}
    while clock.now_ms() <= until_ms:
        for key, value in schedules.tick(clock.now_ms(), **options).items():
            totals[key] = totals.get(key, 0) + value
        clock.advance(step_ms)
    return totals


def race_claimer(
    db_in_use: str,
    barrier: Any,
    declaration: dict[str, Any],
    start_ms: int,
    step_ms: int,
    steps: int,
    lateness_ms: int,
    results: Any,
) -> None:
    """One replica: at each due time, together with the others, try to take it.

    Every replica tries the compare-and-set for every due time, as when all of them read the row
    before any of them wrote it: the worst case for the claim.
    """
    os.environ["DURQ_TEST_DB_IN_USE"] = db_in_use
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    won: list[int] = []
    error = ""
    try:
        import django

        django.setup()
        from django_durq import schedule, schedules
        from django_durq.conf import get_settings
        from django_durq.db.store import Store

        spec = schedule(**declaration)
        store = Store(get_settings().database)
        for step in range(steps):
            due = start_ms + step * step_ms
            barrier.wait(timeout=60)
            taken = store.retrying("cron claim", lambda _d, due=due: schedules.claim(spec, due, due + lateness_ms))
            if taken is not None:
                won.append(taken.due_ms)
    except Exception as failure:  # noqa: BLE001 - reported to the test
        error = f"{type(failure).__name__}: {failure}"
        barrier.abort()
    results.put((os.getpid(), won, error))


def race(declaration: dict[str, Any], start_ms: int, step_ms: int, steps: int) -> list[tuple[int, list[int], str]]:
    """``RACERS`` replicas in processes of their own race for each of ``steps`` due times from ``start_ms``.

    Each replica's clock is a little late by a different amount, as on real hosts. Returns each
    replica's (pid, due times it took, error).
    """
    from django.db import connection, connections

    db_in_use = str(connection.settings_dict["NAME"])
    connections.close_all()
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(RACERS)
    results = context.Queue()
    racers = [
        context.Process(target=race_claimer, args=(db_in_use, barrier, declaration, start_ms, step_ms, steps, k * 7_000, results))
        for k in range(RACERS)
    ]
    for racer in racers:
        racer.start()
    outcomes = [results.get(timeout=180) for _ in racers]
    for racer in racers:
        racer.join(timeout=30)
    return outcomes
