"""Shutdown: SIGTERM with short jobs in every pool, and jobs that outlive the grace period (T15, T16).

The rule asserted here and documented in docs/reliability.md: a job handed back at shutdown
(its handler returned after ``should_stop()``, or it was still running when the grace ran out)
is due at once and its interrupted attempt is not counted against ``max_attempts``. After a
second SIGINT nothing is handed back: the leases expire and the attempt counts.
"""

from __future__ import annotations

import signal
import time

import pytest

from django_durq.models import Job, Status, WorkerProcess
from tests.conftest import wait_until
from tests.ledger import checker, jobs
from tests.ledger.models import Effect

from .conftest import LEASE_S, POLL_S, one_leg, only_on, problems_in

pytestmark = [pytest.mark.processes, only_on("sqlite", "postgres")]


def test_t15_sigterm_finishes_short_jobs_in_every_pool_and_claims_nothing_new(faults):
    grace = 5.0
    in_flight = [
        *jobs.effect.using(priority=10).enqueue_many([{"tag": "short", "sleep": 1.0} for _ in range(2)]),
        jobs.slow.using(queue="fast", priority=10).enqueue(seconds=1.0, tag="short"),
        jobs.slow.using(priority=10).enqueue(seconds=1.0, tag="short"),
    ]
    queued = [
        *jobs.effect.enqueue_many([{"tag": "queued"} for _ in range(80)]),
        *jobs.effect_fast.enqueue_many([{"tag": "queued"} for _ in range(10)]),
        *jobs.slow.enqueue_many([{"seconds": 0, "tag": "queued"} for _ in range(10)]),
    ]
    worker = faults.spawn("--queue", "default:2", "--queue", "fast:1", "--queue", "slow:1", "--grace", str(grace))
    wait_until(lambda: Job.objects.running().count() == 4, 60, "a short job running in every slot")
    time.sleep(0.3)  # claimed is not yet started: let the slots take the jobs (a claimed, unstarted job is handed back)

    signalled_ms = time.time() * 1000
    for _ in range(5):  # process managers resend: five TERMs inside half a second change nothing
        worker.signal(signal.SIGTERM)
        time.sleep(0.1)
    assert worker.wait(timeout=grace + 2) == 0, worker.output()

    assert checker.check({row.pk for row in in_flight}).exact
    assert set(Job.objects.filter(pk__in=[row.pk for row in in_flight]).values_list("status", flat=True)) == {"finished"}
    assert not Effect.objects.filter(tag="queued").exists()
    assert set(Job.objects.filter(pk__in=[row.pk for row in queued]).values_list("attempts", "status")) == {(0, "waiting")}
    assert max(Effect.objects.values_list("started_ms", flat=True)) < signalled_ms
    assert not WorkerProcess.objects.exists()
    assert problems_in(worker.output()) == []


def test_t16_sigterm_hands_back_jobs_that_outlive_the_grace(faults, tmp_path):
    polite = jobs.stop_aware.enqueue(seconds=30, marker_dir=str(tmp_path))
    stubborn = jobs.stubborn.enqueue(seconds=30)
    worker = faults.spawn("--queue", "default:2", "--grace", "2")
    wait_until(lambda: Job.objects.running().count() == 2, 60, "both jobs running")
    time.sleep(0.3)  # claimed is not yet started: let the slots take the jobs
    successor = faults.spawn_ready("--queue", "default:2")

    worker.signal(signal.SIGTERM)
    # should_stop() turns true within 1 s: the polite handler notes it and returns.
    wait_until(lambda: (tmp_path / f"stopped.{polite.pk}").exists(), 1.0, "should_stop() to turn true", interval=0.02)
    assert worker.wait(timeout=2 + 2) == 0, worker.output()
    # The stubborn job was handed back at exit: claimed again within P + 1 s, not after the lease.
    wait_until(lambda: Job.objects.get(pk=stubborn.pk).claim_token == 2, POLL_S + 1, "the released job to be claimed")
    wait_until(lambda: not Job.objects.active().exists(), 30, "both jobs to finish on the successor")

    for pk in (polite.pk, stubborn.pk):
        row = Job.objects.get(pk=pk)
        # Handed back at shutdown: the interrupted attempt is not counted and leaves no error.
        assert (row.status, row.attempts, row.claim_token, row.error_list) == (Status.FINISHED, 1, 2, [])
    assert checker.check({polite.pk, stubborn.pk}).exact
    assert set(Effect.objects.values_list("pid", flat=True)) == {successor.pid}
    assert "shutdown grace ran out; released 1 running job(s)" in worker.output()
    assert problems_in(worker.output()) == []


@one_leg
def test_t16_second_sigint_exits_at_once_and_the_leases_expire(faults, tmp_path):
    polite = jobs.stop_aware.enqueue(seconds=30, marker_dir=str(tmp_path))
    stubborn = jobs.stubborn.enqueue(seconds=30)
    worker = faults.spawn("--queue", "default:2", "--grace", "30")
    wait_until(lambda: Job.objects.running().count() == 2, 60, "both jobs running")
    time.sleep(0.3)  # claimed is not yet started: let the slots take the jobs
    successor = faults.spawn_ready("--queue", "default:2")

    worker.signal(signal.SIGINT)
    wait_until(lambda: (tmp_path / f"stopped.{polite.pk}").exists(), 1.0, "should_stop() to turn true", interval=0.02)
    # The polite job returned; once it is handed back, a second Ctrl-C.
    wait_until(
        lambda: Job.objects.get(pk=polite.pk).attempts == 0 or Job.objects.get(pk=polite.pk).claim_token == 2, 5, "the hand-back"
    )
    worker.signal(signal.SIGINT)
    assert worker.wait(timeout=1) == 1
    wait_until(
        lambda: Job.objects.get(pk=stubborn.pk).claim_token == 2, LEASE_S + POLL_S + 2, "the lease to expire and be reclaimed"
    )
    wait_until(lambda: not Job.objects.active().exists(), 30, "both jobs to finish on the successor")

    # The polite job had been handed back before the second signal; the stubborn one was not.
    polite_row, stubborn_row = Job.objects.get(pk=polite.pk), Job.objects.get(pk=stubborn.pk)
    assert (polite_row.attempts, polite_row.error_list) == (1, [])
    assert stubborn_row.attempts == 2 and [e["kind"] in checker.WORKER_LOST_KINDS for e in stubborn_row.error_list] == [True]
    assert checker.check({polite.pk, stubborn.pk}).exact
    assert set(Effect.objects.values_list("pid", flat=True)) == {successor.pid}
