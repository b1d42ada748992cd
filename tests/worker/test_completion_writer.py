"""A pool's completion writer (``worker/completion_writer.py``): where writers run in parallel, a
pool's finished jobs are written on a connection of their own, so a completion that waits does
not hold up the pool's claims."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from django.db import connection

from django_durq.models import Job, Status
from tests.conftest import db_vendor, drop_refusing_trigger, refusing_trigger, wait_until
from tests.faults.conftest import problems_in
from tests.ledger import checker, jobs
from tests.ledger.models import Effect

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
    pytest.mark.skipif(db_vendor() == "sqlite", reason="SQLite serializes writers: completions commit with the next claim"),
]


def test_a_completion_held_up_by_a_row_lock_does_not_hold_up_the_pools_claims(spawn_worker):
    worker = spawn_worker("--queue", "default:2")
    held = jobs.effect.enqueue(tag="held", sleep=1.0)
    wait_until(lambda: Job.objects.get(pk=held.pk).status == Status.RUNNING, 30, "the first job to be claimed")
    # An operator's open transaction on the job's row, say, on a connection of its own: the
    # job's completion waits for the lock.
    locker = connection.get_new_connection(connection.get_connection_params())
    try:
        if connection.vendor == "mysql":
            locker.autocommit(False)
        else:
            locker.autocommit = False
        locker.cursor().execute("SELECT id FROM durq_job WHERE id = %s FOR UPDATE", [held.pk])
        wait_until(lambda: Effect.objects.filter(tag="held").exists(), 30, "the first handler to return")
        following = jobs.effect.enqueue_many([{"tag": "following"} for _ in range(20)])
        wait_until(lambda: Effect.objects.filter(tag="following").count() == 20, 20, "the jobs queued behind the held one")
        assert Job.objects.get(pk=held.pk).status == Status.RUNNING  # its completion still waits
    finally:
        locker.rollback()
        locker.close()
    wait_until(lambda: not Job.objects.active().exists(), 30, "every completion")

    verdict = checker.check({held.pk, *(row.pk for row in following)})
    assert verdict.exact, verdict
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert problems_in(worker.output()) == []


@pytest.fixture
def completions_refused() -> Iterator[None]:
    """The database rejects every completion with an error no retry can cure.

    The suite deletes finished jobs (``KEEP_FINISHED`` 0): a completion is the row's delete.
    """
    with refusing_trigger("DELETE", None, "completions refused by a test trigger"):
        yield


def test_a_completion_writer_that_fails_stops_the_worker_with_status_3_and_loses_no_job(spawn_worker, completions_refused):
    # A short lease: the job is claimed again once it runs out.
    refused = jobs.effect.using(lease=2).enqueue(tag="refused")
    worker = spawn_worker("--queue", "default:1")
    status = worker.stops_by_itself(60)
    output = worker.output()
    assert status == 3, output
    assert "the completion writer of queue 'default' stopped on an unexpected error" in output
    assert Job.objects.get(pk=refused.pk).status == Status.RUNNING  # its completion never committed

    # Restarted, as a process manager would: the job runs again once its lease has run out (its
    # attempt ended with the handler's return, so the stopping worker had nothing to hand back).
    drop_refusing_trigger()
    again = spawn_worker("--queue", "default:1")
    wait_until(lambda: not Job.objects.filter(pk=refused.pk).exists(), 60, "the job to run again")
    # At least once: run again under a claim of its own, not lost (finished jobs are deleted here).
    verdict = checker.check({refused.pk}, history_deleted=True)
    assert verdict.ok and verdict.duplicated == [refused.pk], verdict
    again.signal(signal.SIGTERM)
    assert again.wait(timeout=30) == 0
