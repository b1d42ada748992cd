"""The maintenance pass runs each duty at its own pace: cron every second, pruning at a tenth of
the time rows are kept (at most a minute), a duty that found work again at the next pass, and a
worker that becomes the holder runs every duty at once. Driven by a manual clock, no worker."""

from __future__ import annotations

import pytest

from django_durq.clock import ManualClock
from django_durq.conf import get_settings
from django_durq.models import DutyLease, Job, Status
from django_durq.worker.duties import prune_every_ms
from django_durq.worker.maintenance import LEASE_NAME, MaintenanceRunner
from django_durq.worker.runtime import Runtime
from tests.test_retention import make

START = 1_800_000_000_000
EVERY_DUTY = {"stale-workers", "cron", "settle", "retention", "workflow-retention", "stats-retention"}


def test_pruning_looks_again_after_a_tenth_of_the_shortest_window_between_a_second_and_a_minute():
    assert prune_every_ms(0) == 1_000
    assert prune_every_ms(3_600_000, None) == 60_000
    assert prune_every_ms(300_000, 3_600_000) == 30_000
    assert prune_every_ms(None, None) == 60_000


@pytest.fixture
def runner(settings) -> tuple[MaintenanceRunner, ManualClock]:
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 3600}
    clock = ManualClock(start_ms=START)
    return MaintenanceRunner(Runtime(settings=get_settings(), clock=clock)), clock


def ran(runner: MaintenanceRunner, clock: ManualClock) -> set[str]:
    results = runner.run_once(clock.now_ms())
    assert results is not None, "this runner holds the maintenance lease"
    return set(results)


@pytest.mark.django_db
def test_an_idle_pass_runs_cron_and_settle_each_second_and_the_rest_at_their_pace(runner):
    runner, clock = runner
    assert ran(runner, clock) == EVERY_DUTY  # the first pass of a holder runs everything
    for _ in range(4):
        clock.advance(1_000)
        assert ran(runner, clock) == {"cron", "settle"}
    clock.advance(1_000)  # 5 s after the first pass
    assert ran(runner, clock) == {"cron", "settle", "stale-workers"}
    clock.set(START + 60_000)  # a tenth of an hour is past the one-minute bound: a minute
    assert ran(runner, clock) == EVERY_DUTY


@pytest.mark.django_db
def test_a_duty_that_found_work_runs_again_at_the_next_pass(runner):
    runner, clock = runner
    ran(runner, clock)
    for _ in range(3):
        make(Status.FINISHED, START - 7_200_000)  # past the hour they are kept
    clock.set(START + 60_000)
    results = runner.run_once(clock.now_ms())
    assert results is not None and results["retention"]["finished"] == 3
    clock.advance(1_000)
    assert "retention" in ran(runner, clock)  # it found rows: there may be more
    clock.advance(1_000)
    assert "retention" not in ran(runner, clock)  # it found none: back to its pace
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_worker_that_becomes_the_holder_again_runs_every_duty_at_once(runner):
    runner, clock = runner
    ran(runner, clock)
    clock.advance(1_000)
    DutyLease.objects.filter(name=LEASE_NAME).update(holder="another:1", expires_ms=clock.now_ms() + 4_000)
    assert runner.run_once(clock.now_ms()) is None  # another worker holds the duties now
    clock.advance(5_000)  # its lease ran out: this worker takes the duties back
    assert ran(runner, clock) == EVERY_DUTY
