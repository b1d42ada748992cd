"""Cron on the nights clocks change: every due time strictly after the moment it is computed from,
the same due times whatever moment a search starts from, and a daily job once a day, in every zone.

The property tests are seeded random loops over zones of ``zoneinfo.available_timezones()``,
years and expressions; a failure prints the zone, the expression and the moment to replay it.
"""

from __future__ import annotations

import random
import zoneinfo
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_durq import cron
from django_durq.clock import ManualClock, use_clock
from tests.schedules.helpers import BERLIN, NEW_YORK, at, local, scheduled_jobs

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def transitions(tz: ZoneInfo, year: int) -> list[int]:
    """Epoch seconds at which the UTC offset of ``tz`` changes during ``year``."""
    start = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
    found = []
    offset = datetime.fromtimestamp(start, tz).utcoffset()
    for day in range(1, 367):
        moment = start + day * 86_400
        following = datetime.fromtimestamp(moment, tz).utcoffset()
        if following != offset:
            low, high = moment - 86_400, moment  # the change is in (low, high]
            while high - low > 1:
                middle = (low + high) // 2
                if datetime.fromtimestamp(middle, tz).utcoffset() == offset:
                    low = middle
                else:
                    high = middle
            found.append(high)
            offset = following
    return found


def expressions(rng: random.Random, tz: ZoneInfo, moment: int) -> list[str]:
    """Expressions whose due times fall near ``moment``: local hours on both sides of a change."""
    before = datetime.fromtimestamp(moment - 1, tz)
    after = datetime.fromtimestamp(moment, tz)
    hours = sorted({before.hour, after.hour, (before.hour + 1) % 24, (after.hour + 23) % 24})
    minute = rng.choice([0, 15, 30, 45, rng.randrange(60)])
    hour = rng.choice(hours)
    return [
        f"{minute} {hour} * * *",
        f"{rng.randrange(60)} {rng.choice(hours)} * * *",
        f"0,30 {','.join(str(h) for h in hours)} * * *",
        f"{rng.randrange(60)} {minute} {hour} * * *",
        rng.choice(["*/30 * * * *", "*/7 * * * *", "0 * * * *", f"{minute} */2 * * *", "*/15 2 * * *"]),
    ]


def chain(expression: str, timezone: str, after_ms: int, until_ms: int) -> list[int]:
    return list(cron.due_times(expression, timezone, after_ms, until_ms))


def test_due_times_around_every_change_are_strictly_after_and_do_not_depend_on_where_a_search_starts():
    rng = random.Random(20241027)
    zones = sorted(zoneinfo.available_timezones())
    cases = 0
    for name in rng.sample(zones, 120):
        tz = ZoneInfo(name)
        for year in rng.sample(range(1900, 2038), 3):
            for moment in transitions(tz, year)[:2]:
                for expression in expressions(rng, tz, moment):
                    where = f"{expression!r} in {name} around {datetime.fromtimestamp(moment, tz).isoformat()}"
                    start, end = (moment - 2 * DAY_MS // 1000) * 1000, (moment + 2 * DAY_MS // 1000) * 1000
                    dues = chain(expression, name, start, end)
                    assert dues == sorted(set(dues)), where
                    assert all(due % 1000 == 0 for due in dues), where
                    # From any moment, the next due time is the first of the chain after it: none
                    # is skipped and none comes back, whichever pass of a repeated hour we are in.
                    probes = [moment * 1000 + delta for delta in (-1, 0, 1, -HOUR_MS, HOUR_MS, -HOUR_MS - 1, HOUR_MS - 1)]
                    probes += [rng.randrange(start + DAY_MS, end - DAY_MS) for _ in range(12)]
                    for probe in probes:
                        due = cron.next_due_ms(expression, name, probe)
                        assert due > probe, f"{where}: from {local(probe, name)} the next due time is {local(due, name)}"
                        assert due == next(d for d in dues if d > probe), f"{where}: from {local(probe, name)}"
                        cases += 1
    assert cases > 5_000  # the sample really went through changes


def test_a_daily_job_runs_once_a_day_across_changes_in_every_zone():
    rng = random.Random(31032024)
    zones = sorted(zoneinfo.available_timezones())
    days_checked = 0
    for name in rng.sample(zones, 200):
        tz = ZoneInfo(name)
        moments = [moment for year in rng.sample(range(1900, 2038), 3) for moment in transitions(tz, year)[:2]]
        for moment in moments:
            local_day = datetime.fromtimestamp(moment, tz).date()
            for expression in expressions(rng, tz, moment)[:2]:
                # From the first moment of a day, through the days around the change.
                first, last = local_day - timedelta(days=2), local_day + timedelta(days=3)
                start = _day_start(first, tz)
                end = _day_start(last, tz)
                dues = chain(expression, name, start - 1, end - 1)
                days = Counter(_run_day(due, expression, tz) for due in dues)
                expected = {first + timedelta(days=n) for n in range((last - first).days)}
                assert days == dict.fromkeys(expected, 1), f"{expression!r} in {name} around {local_day}: {days}"
                days_checked += len(expected)
    assert days_checked > 1_000  # the sample really went through changes


def _day_start(day: date, tz: ZoneInfo) -> int:
    """The first instant of a local calendar day (its midnight may not exist)."""
    noon = int(datetime(day.year, day.month, day.day, 12, tzinfo=tz).timestamp())
    low, high = noon - 36 * 3600, noon  # the last instant of the day before is in [low, high)
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, tz).date() < day:
            low = middle
        else:
            high = middle
    return high * 1000


def _run_day(due_ms: int, expression: str, tz: ZoneInfo) -> date:
    """The local day a run stands for: its own, or the day before when a gap over midnight pushed it on."""
    when = datetime.fromtimestamp(due_ms / 1000, tz)
    minute, hour = (int(part) for part in expression.split()[:2])
    if (when.hour, when.minute) < (hour, minute):
        return when.date() - timedelta(days=1)
    return when.date()


@pytest.mark.parametrize(
    ("tz", "moment", "expression", "expected"),
    [
        # The second pass of Berlin's repeated hour (02:00-03:00 happens twice on 27 October 2024).
        (BERLIN, "2024-10-27T02:10:00+01:00", "30 2 * * *", "2024-10-28T02:30:00+01:00"),
        (BERLIN, "2024-10-27T02:10:00+01:00", "0 30 2 * * *", "2024-10-28T02:30:00+01:00"),
        (BERLIN, "2024-10-27T02:10:00+01:00", "15,45 30 2 * * *", "2024-10-28T02:30:15+01:00"),
        (BERLIN, "2024-10-27T02:10:00+01:00", "0 1-3 * * *", "2024-10-27T03:00:00+01:00"),
        (BERLIN, "2024-10-27T02:10:00+01:00", "*/30 * * * *", "2024-10-27T02:30:00+01:00"),
        # The first pass of it.
        (BERLIN, "2024-10-27T02:10:00+02:00", "30 2 * * *", "2024-10-27T02:30:00+02:00"),
        (BERLIN, "2024-10-27T02:40:00+02:00", "30 2 * * *", "2024-10-28T02:30:00+01:00"),
        # Just before and inside the skipped hour of 31 March 2024.
        (BERLIN, "2024-03-31T01:59:59+01:00", "30 2 * * *", "2024-03-31T03:00:00+02:00"),
        (BERLIN, "2024-03-31T03:00:00+02:00", "30 2 * * *", "2024-04-01T02:30:00+02:00"),
        (NEW_YORK, "2024-11-03T01:10:00-05:00", "30 1 * * *", "2024-11-04T01:30:00-05:00"),
    ],
)
def test_next_due_time_in_a_repeated_or_skipped_hour(tz, moment, expression, expected):
    after = int(datetime.fromisoformat(moment).timestamp() * 1000)
    assert local(cron.next_due_ms(expression, tz, after), tz) == expected


# --- the duty's pass in the repeated hour ----------------------------------------------------------


def second_pass(hour: int, minute: int) -> int:
    """Epoch ms of a wall time in the second pass of Berlin's repeated hour, 27 October 2024."""
    return at(2024, 10, 27, hour, minute, tz=BERLIN) + HOUR_MS


def passes(clock: ManualClock, count: int, step_ms: int) -> int:
    from django_durq import schedules

    ran = 0
    for _ in range(count):
        ran += schedules.tick(clock.now_ms())["ran"]
        clock.advance(step_ms)
    return ran


@pytest.mark.django_db
def test_declaring_a_schedule_in_the_second_pass_of_a_repeated_hour_does_not_fire_it(declare):
    from django_durq.models import Schedule

    declare("tests.cron.repeated", "30 2 * * *", timezone=BERLIN)
    clock = ManualClock(start_ms=second_pass(2, 10))
    with use_clock(clock):
        assert passes(clock, 120, 1_000) == 0
    assert scheduled_jobs() == []
    row = Schedule.objects.get(name="tests.cron.repeated")
    assert local(row.next_due_ms, BERLIN) == "2024-10-28T02:30:00+01:00"


@pytest.mark.django_db
def test_changing_a_schedule_in_the_second_pass_of_a_repeated_hour_does_not_fire_it(declare):
    from django_durq import schedules
    from django_durq.models import Schedule

    declare("tests.cron.changed", "0 4 * * *", timezone=BERLIN)
    clock = ManualClock(start_ms=at(2024, 10, 26, 12, tz=BERLIN))
    with use_clock(clock):
        schedules.tick(clock.now_ms())
        schedules.forget("tests.cron.changed")
        declare("tests.cron.changed", "30 2 * * *", timezone=BERLIN)
        clock.set(second_pass(2, 5))
        assert passes(clock, 120, 1_000) == 0
    assert local(Schedule.objects.get(name="tests.cron.changed").next_due_ms, BERLIN) == "2024-10-28T02:30:00+01:00"


@pytest.mark.django_db
@pytest.mark.parametrize("missed", ["collapse", "skip", "all"])
def test_catching_up_in_the_second_pass_of_a_repeated_hour_runs_at_most_once(declare, missed):
    from django_durq import schedules
    from django_durq.models import Schedule

    declare("tests.cron.caught-up", "30 2 * * *", timezone=BERLIN, missed=missed)
    clock = ManualClock(start_ms=at(2024, 10, 27, 1, tz=BERLIN))
    with use_clock(clock):
        schedules.tick(clock.now_ms())  # next due: the first 02:30
        clock.set(second_pass(2, 10))  # every worker was down from 01:00 until the second 02:10
        ran = passes(clock, 120, 1_000)
    assert ran == (0 if missed == "skip" else 1)
    assert scheduled_jobs() == ([] if missed == "skip" else [at(2024, 10, 27, 2, 30, tz=BERLIN)])
    assert local(Schedule.objects.get(name="tests.cron.caught-up").next_due_ms, BERLIN) == "2024-10-28T02:30:00+01:00"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("tz", "year"),
    [(BERLIN, 2024), (NEW_YORK, 2024), ("Australia/Lord_Howe", 2024), ("America/Santiago", 2024), ("Asia/Beirut", 2022)],
)
def test_daily_and_quarter_hourly_schedules_through_each_change_with_the_duty(declare, tz, year):
    """Passes a minute or so apart for a day from two hours before each change: a daily job at the
    hour of the change runs once, and an every-quarter-hour job once per quarter hour elapsed."""
    from django_durq import schedules
    from django_durq.models import Job, Schedule

    zone_info = ZoneInfo(tz)
    rng = random.Random(year)
    for moment in transitions(zone_info, year):
        daily = f"{rng.choice([0, 30])} {datetime.fromtimestamp(moment, zone_info).hour} * * *"
        declare("tests.cron.daily", daily, "tests.effect", timezone=tz)
        declare("tests.cron.quarter", "*/15 * * * *", timezone=tz)
        clock = ManualClock(start_ms=(moment - 2 * 3600) * 1000)
        with use_clock(clock):
            start = clock.now_ms()
            while clock.now_ms() < start + DAY_MS:
                schedules.tick(clock.now_ms())
                clock.advance(45_000 + rng.randrange(30_000))
        runs = scheduled_jobs("tests.effect")
        assert len(runs) == 1, (tz, daily, [local(run, tz) for run in runs])
        quarters = scheduled_jobs()
        assert quarters == [quarters[0] + n * 900_000 for n in range(len(quarters))], tz
        assert len(quarters) in (95, 96), tz
        for name in ("tests.cron.daily", "tests.cron.quarter"):
            schedules.forget(name)
        Job.objects.all().delete()
        Schedule.objects.all().delete()
