"""A handler that returns because it was told to stop ends as what it was told, never as a normal finish.

- Told "lease at risk" (its renewals stalled), it hands its job back, attempt not counted; the
  job then runs to completion under a new claim. It is never recorded ``finished`` under the
  claim whose handler gave up.
- Asked to stop by an operator's cancel that commits while it runs, it ends ``cancelled`` even
  when it returns before a heartbeat could tell it, with finished jobs kept or deleted; the log
  line says cancelled, and no ``finished`` line is written for it.

Process tests use the fault suite's short settings (lease 2 s, heartbeat 0.5 s, poll 0.25 s).
"""

from __future__ import annotations

import pytest

from django_durq.models import Job
from tests.conftest import wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_a_handler_that_returns_on_lease_at_risk_hands_its_job_back(faults, tmp_path):
    queued = jobs.stop_aware.enqueue(seconds=20.0, marker_dir=str(tmp_path))
    worker = faults.spawn_ready("--queue", "default:2", hooks=True)
    wait_until(lambda: Job.objects.get(pk=queued.pk).status == "running", 30, "the job to start")
    faults.gates.close("in_heartbeat")  # the keeper stalls: no renewal gets through
    faults.gates.wait("in_heartbeat", queued.pk)
    stopped = tmp_path / f"stopped.{queued.pk}"
    wait_until(stopped.exists, 10, "the handler to hear that its lease is at risk")
    faults.gates.open("in_heartbeat")
    wait_until(lambda: Job.objects.get(pk=queued.pk).status in ("finished", "dead", "cancelled"), 30, "the job to end")
    job = Job.objects.get(pk=queued.pk)
    ran = list(Effect.objects.filter(job_id=queued.pk).values_list("token", flat=True))
    assert (job.status, ran) == ("finished", [job.claim_token]), (
        f"{job.status} under claim {job.claim_token}, completed runs under {ran}: the run that gave up was recorded"
        f" as a finish\n{worker.output()}"
    )
    assert job.claim_token >= 2 and job.attempts == 1, (job.claim_token, job.attempts)


@pytest.mark.parametrize("keep", ["3600", "0"], ids=["kept", "deleted"])
def test_a_cancel_that_lands_before_the_next_heartbeat_ends_the_job_cancelled(faults, keep):
    queued = jobs.cancels_itself.enqueue()
    worker = faults.spawn_ready("--queue", "default:1", env={"DURQ_TEST_KEEP_FINISHED": keep})
    wait_until(lambda: Effect.objects.filter(job_id=queued.pk).exists(), 30, "the handler to run")
    wait_until(lambda: f"job {queued.pk} (tests.cancels_itself)" in worker.output(), 10, "the outcome's log line")
    job = Job.objects.filter(pk=queued.pk).first()
    assert job is not None and job.status == "cancelled", f"{job.status if job else 'deleted as finished'}\n{worker.output()}"
    lines = [line for line in worker.output().splitlines() if f"job {queued.pk} (tests.cancels_itself)" in line]
    assert lines and all("finished" not in line for line in lines) and "cancelled" in lines[-1], lines
