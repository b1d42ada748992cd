"""A pause holds for a job whose slot was held up between taking it and starting its handler.

A slot may wait there for seconds: for a renewal to confirm the lease of a job claimed ahead
(``JobContext.wait_confirmed``), for the write of a lost lease's error, or stalled like any
thread. Whether the queue is paused is asked last, right before the handler starts.
"""

from __future__ import annotations

import time

import pytest

from django_durq import ops
from django_durq.models import Job, Status
from tests.conftest import wait_until
from tests.ledger import checker, jobs
from tests.ledger.models import Effect

from .conftest import problems_in

pytestmark = pytest.mark.processes


def test_a_job_held_up_before_its_start_while_its_queue_is_paused_is_handed_back_unstarted(faults):
    """Model chaos, SQLite seed 102: two jobs claimed ahead started 2.9 s after their queue's pause.

    Their slot had found the queue not paused, then waited for a renewal to confirm their leases
    while a lock held the renewals up; the pause committed meanwhile, and once a renewal got
    through they started.
    """
    held = jobs.effect.enqueue(tag="held")
    faults.gates.close("after_claim")  # after the slot took the job, before the handler starts
    worker = faults.spawn("--queue", "default:1", hooks=True)
    faults.gates.wait("after_claim", held.pk)
    assert ops.pause("default", reason="a pause while the slot is held up")

    faults.gates.open("after_claim")
    time.sleep(1.5)  # the slot goes on: it would start the job now, were the pause not asked last
    assert not Effect.objects.filter(tag="held").exists(), "the job started after its queue's pause"
    wait_until(
        lambda: Job.objects.filter(pk=held.pk, status=Status.WAITING, attempts=0).exists(), 10, "the job to be handed back"
    )

    assert ops.resume("default", reason="resumed")
    wait_until(lambda: Effect.objects.filter(tag="held").exists(), 10, "the job to run after the resume")
    wait_until(lambda: Job.objects.get(pk=held.pk).status == Status.FINISHED, 10, "its completion")
    assert Job.objects.get(pk=held.pk).attempts == 1
    assert checker.check({held.pk}).exact
    assert problems_in(worker.output()) == []
