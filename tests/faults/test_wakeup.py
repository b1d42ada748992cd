"""Idle workers wake for every job that becomes due, whatever the order of the commits that made it so.

The workers here poll only every 30 s, so a job that runs within seconds was woken for.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from django.db import connections, transaction

from django_durq.models import Job
from tests.conftest import wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect

from .conftest import only_on

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

SLOW_POLL = {"DURQ_TEST_POLL": "30"}


@only_on("postgres", "mysql")  # SQLite's writers are serialized: no commit can overtake another
def test_a_wake_up_is_not_missed_when_commits_arrive_out_of_id_order(faults):
    # Ids handed out and gone before the worker starts: its first look finds an empty table.
    jobs.noop.enqueue_many([{} for _ in range(300)])
    Job.objects.all().delete()
    faults.spawn_ready("--queue", "default:1", env=SLOW_POLL)
    time.sleep(0.5)
    inserted, release = threading.Event(), threading.Event()

    def earlier_transaction() -> None:
        try:
            with transaction.atomic():
                jobs.stamp.enqueue(tag="earlier")  # takes the lower id
                inserted.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=earlier_transaction)
    thread.start()
    try:
        assert inserted.wait(10)
        jobs.stamp.enqueue(tag="later")  # a higher id, committed first
        wait_until(lambda: Effect.objects.filter(tag="later").exists(), 10, "the job committed first")
    finally:
        release.set()
        thread.join()
    wait_until(lambda: Effect.objects.filter(tag="earlier").exists(), 5, "the job committed after a later one")


@only_on("postgres", "mysql")  # SQLite wakes on any commit
def test_a_job_handed_back_at_shutdown_wakes_an_idle_worker_elsewhere(faults):
    # A long lease: the idle worker must not find the job by waking for the lease's expiry.
    long_lease = {"DURQ_TEST_LEASE": "60", "DURQ_TEST_HEARTBEAT": "10"}
    queued = jobs.stop_aware.enqueue(seconds=30.0, marker_dir=str(faults.gates.folder))
    stopping = faults.spawn_ready("--queue", "default:1", env=long_lease)
    wait_until(lambda: Job.objects.get(pk=queued.pk).status == "running", 30, "the job to start")
    faults.spawn_ready("--queue", "default:1", env={**SLOW_POLL, **long_lease})
    time.sleep(0.5)
    stopping.signal(signal.SIGTERM)
    assert stopping.wait(30) == 0, stopping.output()
    handed_back_by_ms = time.time_ns() // 1_000_000  # the hand-back committed before the process ended
    wait_until(lambda: Effect.objects.filter(job_id=queued.pk, tag="stop_aware").exists(), 5, "the other worker to take it")
    taken_after_ms = Effect.objects.get(job_id=queued.pk, tag="stop_aware").started_ms - handed_back_by_ms
    # Within the watcher's look (25 ms on MariaDB) and a claim: not at a poll or any other timer.
    assert taken_after_ms < 300, taken_after_ms
