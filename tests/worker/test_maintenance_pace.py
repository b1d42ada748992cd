"""The maintenance pass runs each duty at its own pace: the look for ended workers every second
(it reads their locks, no table, while none has ended), cron every second once a schedule is
declared, the settle sweep every second while a workflow is in flight, the expiry sweep at the
next expiry (five seconds at most), pruning at a tenth of the
time rows are kept (at most a minute), a duty that found work again at the next pass, and a
worker that becomes the holder runs every duty at once. Driven by a manual clock, no worker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_durq import Workflow
from django_durq.clock import ManualClock, use_clock
from django_durq.conf import get_settings
from django_durq.models import Dependency, DutyLease, Job, Status
from django_durq.worker.duties import prune_every_ms
from django_durq.worker.maintenance import LEASE_NAME, MaintenanceRunner
from django_durq.worker.runtime import Runtime
from tests.ledger import jobs
from tests.worker.test_retention import make

START = 1_800_000_000_000
EVERY_DUTY = {"stale-workers", "cron", "settle", "expiry", "retention", "workflow-retention", "stats-retention", "counter-fold"}


def test_pruning_looks_again_after_a_tenth_of_the_shortest_window_between_a_second_and_a_minute():
    assert prune_every_ms(0) == 1_000
    assert prune_every_ms(3_600_000, None) == 60_000
    assert prune_every_ms(300_000, 3_600_000) == 30_000
    assert prune_every_ms(None, None) == 60_000


@pytest.fixture
def runner(settings) -> Iterator[tuple[MaintenanceRunner, ManualClock]]:
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 3600}
    clock = ManualClock(start_ms=START)
    with use_clock(clock):  # one timeline: what the test enqueues is stamped with the runner's time
        yield MaintenanceRunner(Runtime(settings=get_settings(), clock=clock)), clock


def ran(runner: MaintenanceRunner, clock: ManualClock) -> set[str]:
    results = runner.run_once(clock.now_ms())
    assert results is not None, "this runner holds the maintenance lease"
    return set(results)


@pytest.mark.django_db
def test_an_idle_pass_with_nothing_declared_or_in_flight_looks_only_for_ended_workers_each_second(runner):
    runner, clock = runner
    assert ran(runner, clock) == EVERY_DUTY  # the first pass of a holder runs everything
    for _ in range(4):
        clock.advance(1_000)
        # No schedule to fire, no workflow whose count could be missed: only the look for ended
        # workers, whose running jobs are taken over within a second.
        assert ran(runner, clock) == {"stale-workers"}
    clock.advance(1_000)  # 5 s after the first pass
    assert ran(runner, clock) == {"settle", "expiry", "stale-workers"}
    clock.set(START + 60_000)  # a tenth of an hour is past the one-minute bound: a minute
    assert ran(runner, clock) == EVERY_DUTY


@pytest.mark.django_db
def test_cron_runs_each_second_once_a_schedule_is_declared(runner, settings):
    runner, clock = runner
    ran(runner, clock)
    settings.DURQ = {**settings.DURQ, "SCHEDULES": {"tests.cron.pace": {"cron": "0 3 * * *", "job": "tests.noop"}}}
    clock.set(START + 60_000)  # the cron duty looks for declared schedules each minute while there are none
    assert "cron" in ran(runner, clock)
    for _ in range(3):
        clock.advance(1_000)
        assert ran(runner, clock) == {"cron", "stale-workers"}


@pytest.mark.django_db
def test_the_settle_sweep_runs_each_second_while_a_workflow_is_in_flight(runner):
    runner, clock = runner
    flow = Workflow("pace")
    first = flow.add(jobs.step, tag="a")
    flow.add(jobs.step, tag="b", after=[first])
    flow.enqueue()
    assert ran(runner, clock) == EVERY_DUTY
    for _ in range(3):
        clock.advance(1_000)
        assert ran(runner, clock) == {"settle", "stale-workers"}  # a count missed now would wait a second at most
    Dependency.objects.update(settled=True)  # the workflow's ends are all counted
    clock.advance(1_000)
    assert ran(runner, clock) == {"settle", "stale-workers"}
    clock.advance(1_000)
    assert ran(runner, clock) == {"stale-workers", "expiry"}  # at their own pace; the sweep now waits five seconds
    for _ in range(3):
        clock.advance(1_000)
        assert ran(runner, clock) == {"stale-workers"}  # the sweep now waits five seconds
    clock.advance(1_000)
    assert ran(runner, clock) == {"settle", "stale-workers"}  # five seconds after it found none in flight


class Leading:
    """A presence that says this worker leads (what a held lock says), for the pass timing alone."""

    def lead(self) -> bool:
        return True

    def renewed(self) -> bool:
        return False

    def withdraw(self) -> None:
        pass


@pytest.mark.django_db
def test_a_leader_by_lock_sleeps_until_the_next_pass_that_runs_a_duty(runner):
    runner, clock = runner
    clock.set(START + 20)  # passes fall 20 ms after each whole second
    assert runner._until_next_pass_s() == 1.0  # not leading yet: the next pass on the grid
    runner.runtime.presence = Leading()
    assert runner.run_once(clock.now_ms()) is not None
    assert runner._until_next_pass_s() == 1.0  # the look for ended workers, each second
    clock.advance(300)
    assert runner._until_next_pass_s() == 0.7
    runner.runtime.presence = None  # a holder of the lease row renews it each pass
    assert runner._until_next_pass_s() == 0.7


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
