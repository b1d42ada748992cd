"""A retry from the admin or from ops wakes idle workers of other processes at once, not at their next poll."""

from __future__ import annotations

import json
import signal
import time

import pytest
from django.contrib.auth.models import User
from django.test import Client

from django_durq import ops
from django_durq.clock import now_ms
from django_durq.models import Job, WorkerProcess
from tests.conftest import db_vendor, wait_until
from tests.ledger.models import Effect

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.test_admin"),
    pytest.mark.skipif(db_vendor() == "mysql", reason="MariaDB has no cross-process wake-up: workers poll"),
]

POLL_S = 30  # the worker's poll interval: finishing well inside it proves the wake-up


def stranded(status: str, tag: str) -> Job:
    now = now_ms()
    return Job.objects.create(
        name="tests.effect",
        queue="default",
        status=status,
        arguments=json.dumps({"args": [], "kwargs": {"tag": tag}}),
        run_at_ms=now - 60_000,
        created_ms=now - 60_000,
        finished_ms=now - 1_000,
        lease_ms=30_000,
        attempts=3 if status == "dead" else 0,
        max_attempts=3,
    )


def test_a_job_retried_from_the_admin_or_ops_runs_before_the_next_poll(spawn_worker):
    dead, cancelled = stranded("dead", "dead-retried"), stranded("cancelled", "cancelled-retried")
    worker = spawn_worker("--queue", "default:1", env={"DURQ_TEST_POLL": str(POLL_S)})
    wait_until(lambda: WorkerProcess.objects.exists(), 30, "the worker to register")
    time.sleep(1)  # let it finish its first probe and go idle
    admin = Client()
    admin.force_login(User.objects.create_superuser("root"))
    retries = {
        dead.pk: lambda: admin.post(f"/admin/django_durq/deadletter/{dead.pk}/retry/").status_code == 302,
        cancelled.pk: lambda: ops.retry([cancelled.pk]).retried == [cancelled.pk],
    }
    for job in (dead, cancelled):
        started = time.monotonic()
        assert retries[job.pk]()
        tag = json.loads(job.arguments)["kwargs"]["tag"]
        try:
            wait_until(lambda tag=tag: Effect.objects.filter(tag=tag).exists(), POLL_S / 3, f"the {job.status} job's retry")
        except AssertionError as error:
            raise AssertionError(f"{error}\n--- worker output ---\n{worker.output()}") from None
        assert time.monotonic() - started < POLL_S / 3
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
