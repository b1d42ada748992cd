"""Which due times count as missed: only those no worker was up to enqueue, never those of a pass
that is a little late. Passes of the cron duty with a manual clock, late by seeded random amounts."""

from __future__ import annotations

import random

import pytest

from django_durq.clock import ManualClock, use_clock
from tests.schedules.helpers import at, scheduled_jobs


@pytest.fixture
def clock():
    manual = ManualClock(start_ms=at(2024, 5, 6, 12, 0, 0) + 300)
    with use_clock(manual):
        yield manual


def late_passes(clock: ManualClock, count: int, rng: random.Random, late_ms: int) -> None:
    """``count`` passes of the duty, each 1 s after the last plus up to ``late_ms`` (a busy host)."""
    from django_durq import schedules

    for _ in range(count):
        schedules.tick(clock.now_ms())
        clock.advance(1_000 + rng.randrange(late_ms + 1))


@pytest.mark.django_db
@pytest.mark.parametrize("missed", ["collapse", "skip", "all"])
def test_passes_that_drift_enqueue_every_due_time_once(declare, clock, missed):
    declare("tests.cron.every-second", "* * * * * *", missed=missed)
    first = clock.now_ms() // 1000 * 1000 + 1000
    late_passes(clock, 150, random.Random(7), late_ms=400)
    dues = scheduled_jobs()
    last = clock.now_ms() - 1_400  # the last pass ran at or after this
    assert dues[0] == first
    assert dues == list(range(first, dues[-1] + 1, 1000))
    assert dues[-1] >= last // 1000 * 1000


@pytest.mark.django_db
@pytest.mark.parametrize("missed", ["collapse", "skip"])
def test_a_pass_late_by_less_than_the_on_time_window_enqueues_each_due_time(declare, clock, missed):
    from django_durq import schedules

    declare("tests.cron.ten-seconds", "*/10 * * * * *", missed=missed)
    schedules.tick(clock.now_ms())
    rng = random.Random(11)
    for _ in range(40):
        # A pass that comes up to 50 s late: a stalled duty or a takeover, not an outage.
        clock.advance(rng.randrange(1_000, 50_000))
        schedules.tick(clock.now_ms())
    dues = scheduled_jobs()
    assert dues == list(range(dues[0], dues[-1] + 1, 10_000))
    assert dues[0] == at(2024, 5, 6, 12, 0, 10)


@pytest.mark.django_db
@pytest.mark.parametrize(("missed", "collapsed"), [("collapse", [at(2024, 5, 6, 12, 0, 1)]), ("skip", []), ("all", None)])
def test_an_outage_longer_than_the_window_follows_the_policy_and_the_window_runs_each(declare, clock, missed, collapsed):
    from django_durq import schedules

    declare("tests.cron.outage", "* * * * * *", missed=missed)
    schedules.tick(clock.now_ms())  # next due 12:00:01
    clock.set(at(2024, 5, 6, 12, 10))  # every worker was down for ten minutes
    while True:
        counts = schedules.tick(clock.now_ms())
        if not counts["ran"] and not counts["skipped"]:
            break
    dues = scheduled_jobs()
    window = [at(2024, 5, 6, 12, 9) + n * 1000 for n in range(61)]  # 12:09:00 to 12:10:00, less than a minute late
    if collapsed is None:
        assert dues == list(range(at(2024, 5, 6, 12, 0, 1), at(2024, 5, 6, 12, 10) + 1, 1000))
    else:
        assert dues == collapsed + window


@pytest.mark.django_db
def test_the_duty_enqueues_each_due_time_across_a_takeover(declare, clock):
    from django_durq.worker.duties import CronDuty
    from django_durq.worker.maintenance import TAKEOVER_MS

    duty = CronDuty()
    declare("tests.cron.takeover", "* * * * * *")
    duty.run_once(clock.now_ms())
    clock.advance(TAKEOVER_MS + 1_000)
    duty.run_once(clock.now_ms())
    dues = scheduled_jobs()
    assert dues == list(range(dues[0], clock.now_ms() // 1000 * 1000 + 1, 1000))


def test_passes_start_just_after_each_whole_second_however_long_the_last_one_took():
    from django_durq.conf import get_settings
    from django_durq.worker.maintenance import PASS_OFFSET_MS, MaintenanceRunner
    from django_durq.worker.runtime import Runtime

    clock = ManualClock(start_ms=at(2024, 5, 6, 12))
    runner = MaintenanceRunner(Runtime(settings=get_settings(), clock=clock))
    for elapsed_ms in (0, 1, 370, 999, 1_000 + PASS_OFFSET_MS, 2_650, 7_999):
        clock.set(at(2024, 5, 6, 12) + PASS_OFFSET_MS + elapsed_ms)
        following = clock.now_ms() + round(runner._until_next_pass_s() * 1000)
        assert following % 1000 == PASS_OFFSET_MS and 0 < following - clock.now_ms() <= 1000, elapsed_ms
