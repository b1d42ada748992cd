"""Idle workers wake for every job that becomes due, whatever the order of the commits that made it so.

The workers here poll only every 30 s, so a job that runs within seconds was woken for. A worker
given a temporary directory of its own stands for one on another host: no enqueue here can ring
its bell, so on MariaDB only its watcher's reads of the job ids find the job.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.db import connections, transaction

from django_durq.models import Job, WorkerProcess
from tests.conftest import db_vendor, wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect

from .conftest import only_on, size

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

SLOW_POLL = {"DURQ_TEST_POLL": "30"}


@only_on("postgres", "mysql")  # SQLite's writers are serialized: no commit can overtake another
@pytest.mark.parametrize("host", ["same host", "other host"])
def test_a_wake_up_is_not_missed_when_commits_arrive_out_of_id_order(faults, host, tmp_path):
    # Ids handed out and gone before the worker starts: its first look finds an empty table.
    jobs.noop.enqueue_many([{} for _ in range(300)])
    Job.objects.all().delete()
    elsewhere = {"TMPDIR": str(tmp_path)} if host == "other host" else {}
    faults.spawn_ready("--queue", "default:1", env={**SLOW_POLL, **elsewhere})
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


@only_on("sqlite", "mysql")  # where enqueues on the workers' host ring their bells
def test_each_enqueue_wakes_one_idle_worker_and_a_busy_one_passes_it_on(faults):
    count = size(4, 16)
    workers = [faults.spawn_ready("--queue", "default:1", "--verbosity", "2", env=SLOW_POLL) for _ in range(count)]
    time.sleep(0.5)
    queued = []
    for _ in range(count):
        # Each job keeps its worker's only slot: the next ring must go on to a worker still idle.
        queued.append(jobs.stop_aware.enqueue(seconds=60.0, marker_dir=str(faults.gates.folder)))
        wait_until(lambda: Job.objects.get(pk=queued[-1].pk).status == "running", 10, f"job {len(queued)} to start")
    holders = {job.claimed_by for job in Job.objects.filter(pk__in=[job.pk for job in queued])}
    assert len(holders) == count  # one job on every worker: none waited behind a busy one
    logs = "".join(worker.output() for worker in workers)
    if db_vendor() == "sqlite":
        # One claimer per enqueue: a ring is taken by exactly one worker; the others only passed it on.
        assert logs.count("bell: claiming it here") == count, logs[-3000:]
        assert "no other worker to ask" not in logs
    else:
        # MariaDB's watcher reads new ids too, so a worker may take a job it saw before its bell
        # was rung (no "claiming it here"), and a worker already claiming passes a ring on: a
        # ring is still never taken by two workers.
        assert logs.count("bell: claiming it here") <= count, logs[-3000:]


@only_on("sqlite")  # MariaDB's watchers also read new ids: every idle worker there finds the job by itself
def test_a_ring_that_comes_while_the_worker_claims_enough_to_fill_it_goes_on_to_an_idle_worker(faults, monkeypatch):
    """A ring taken during a claim is a promise to claim that job: a pool the claim fills passes it on."""
    from django_durq.db import doorbell

    first = faults.spawn_ready("--queue", "default:1", "--verbosity", "2", hooks=True, env=SLOW_POLL)
    root = doorbell.directory("default")
    assert root is not None
    first_bell = WorkerProcess.objects.get(pid=first.pid).worker_id.replace(os.sep, "_") + doorbell.SUFFIX
    faults.spawn_ready("--queue", "default:1", env=SLOW_POLL)
    # Each enqueue's ring goes to the first worker, as a random pick may.
    monkeypatch.setattr(doorbell, "ring", lambda *args, **kwargs: None)
    faults.gates.close("in_claim")
    long = jobs.sleeper.enqueue(seconds=15.0)
    assert doorbell._send(root, first_bell, "default", [])
    faults.gates.wait("in_claim", 0)  # its claim of the long job is in flight
    short = jobs.stamp.enqueue(tag="rung during a claim")
    assert doorbell._send(root, first_bell, "default", [])
    wait_until(lambda: first.output().count("rang this worker's bell") == 2, 10, "the first worker to answer the ring")
    faults.gates.open("in_claim")
    wait_until(lambda: Effect.objects.filter(job_id=short.pk).exists(), 10, "the job rung during a claim to start elsewhere")
    assert Job.objects.get(pk=long.pk).status == "running"
