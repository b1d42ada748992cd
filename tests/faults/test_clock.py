"""One timeline across hosts whose clocks disagree (PostgreSQL and MariaDB).

A worker started with ``DURQ_TEST_SKEW_MS`` runs on a "host" whose wall clock is that far off
(tests/settings.py shifts its system clock). The queue reads the database server's clock
(``django_durq.clock.ServerClock``), so such a worker runs no job early, keeps the leases it
holds, and leaves none far in the future when it dies. This process's clock is the true one.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from django_durq.models import Job
from tests.conftest import wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect

from .conftest import LEASE_S, POLL_S, only_on

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, only_on("postgres", "mysql")]

AHEAD = {"DURQ_TEST_SKEW_MS": "30000"}
BEHIND = {"DURQ_TEST_SKEW_MS": "-30000"}


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def test_a_worker_whose_clock_runs_ahead_runs_no_job_early(faults):
    queued = jobs.stamp.using(run_in=timedelta(seconds=8)).enqueue(tag="due")
    faults.spawn_ready("--queue", "default:1", env=AHEAD)
    time.sleep(max(0.0, (queued.run_at_ms - 1_000 - wall_ms()) / 1000))
    assert not Effect.objects.filter(job_id=queued.pk).exists(), "ran before its due time"
    wait_until(lambda: Effect.objects.filter(job_id=queued.pk).exists(), 20, "the job to run once due")


def test_a_worker_whose_clock_runs_behind_keeps_the_lease_it_holds(faults):
    queued = jobs.stubborn.enqueue(seconds=6.0)  # sleeps on its first claim only
    faults.spawn_ready("--queue", "default:1", env=BEHIND)
    wait_until(lambda: Job.objects.get(pk=queued.pk).status == "running", 30, "the job to start")
    faults.spawn_ready("--queue", "default:1")
    wait_until(lambda: Job.objects.get(pk=queued.pk).status == "finished", 30, "the job to finish")
    row = Job.objects.get(pk=queued.pk)
    assert (row.attempts, row.error_list) == (1, [])
    assert list(Effect.objects.filter(job_id=queued.pk).values_list("token", flat=True)) == [1]


def test_a_worker_whose_clock_runs_ahead_leaves_no_lease_far_in_the_future(faults):
    queued = jobs.stubborn.enqueue(seconds=60.0)
    ahead = faults.spawn_ready("--queue", "default:1", env=AHEAD)
    wait_until(lambda: Job.objects.get(pk=queued.pk).status == "running", 30, "the job to start")
    expires_in_ms = Job.objects.get(pk=queued.pk).lease_expires_ms - wall_ms()
    assert expires_in_ms <= LEASE_S * 1000 + 1_000, expires_in_ms
    ahead.kill()
    faults.spawn_ready("--queue", "default:1")
    wait_until(
        lambda: Effect.objects.filter(job_id=queued.pk, token=2).exists(), LEASE_S + POLL_S + 5, "the job to be taken over"
    )
