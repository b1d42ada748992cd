"""Behind PgBouncer with nothing configured, a killed worker's job is taken over by its silent row, not a lease later.

No presence lock can be held through a transaction pooler, so each worker writes its row every
few seconds (worker/row_presence.py) and the leader takes over the jobs of a worker whose row has
been silent for ``GONE_S``. The job's lease is a minute: the takeover must come long before it.
"""

from __future__ import annotations

import time

import pytest

from django_durq.models import Job
from django_durq.worker import row_presence
from tests.conftest import db_vendor, wait_until
from tests.db.test_pgbouncer import _logs, _spawn_ready, _through
from tests.ledger import jobs
from tests.ledger.checker import check
from tests.ledger.models import Effect

pytestmark = [
    pytest.mark.skipif(db_vendor() != "postgres", reason="PgBouncer pools PostgreSQL connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
]

LEASE_S = 60


def test_a_killed_workers_job_is_taken_over_by_its_silent_row_not_its_lease(bouncer, pooled, spawn_worker):
    # DURQ["LISTEN_DATABASE"] not set: the likeliest set-up. The finished job is kept, to be read.
    env = {**_through(bouncer, None, poll=0.25), "DURQ_TEST_KEEP_FINISHED": "3600"}
    victim = _spawn_ready(spawn_worker, env, "--queue", "default:1")
    job = jobs.effect.using(lease=LEASE_S).enqueue(tag="held", sleep_first=LEASE_S)
    wait_until(lambda: Job.objects.filter(pk=job.pk, status="running").exists(), 30, "the victim to start the job")
    rescuer = _spawn_ready(spawn_worker, env, "--queue", "default:1")
    time.sleep(1)  # the rescuer's first beat
    victim.kill()
    killed = time.monotonic()
    try:
        wait_until(lambda: Effect.objects.filter(job_id=job.pk).exists(), LEASE_S - 15, "the job to run again")
    except AssertionError as late:
        raise AssertionError(f"{late}\n{_logs([victim, rescuer])}") from None
    took = time.monotonic() - killed
    # The row's silence (GONE_S), a new leader's duty lease and its watch of GONE_S at the most.
    assert took < 2 * row_presence.GONE_S + 10, took
    wait_until(lambda: not Job.objects.filter(pk=job.pk).active().exists(), 30, "the job to finish")
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts) == ("finished", 2)
    [lost] = row.error_list
    assert lost["kind"] == "worker_lost" and "row went unwritten" in lost["message"], lost
    assert Effect.objects.get(job_id=job.pk).pid == rescuer.pid
    assert check([job.pk]).exact
