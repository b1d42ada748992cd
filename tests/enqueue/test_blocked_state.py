"""A job that waits for upstream jobs is ``blocked``: how every view shows it, and the migration that made it a status."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client, override_settings

from django_durq import Workflow, ops
from django_durq.models import Job
from tests.conftest import db_vendor
from tests.ledger import jobs

NOW = 1_800_000_000_000
SENTINEL_MS = 253_402_300_799_000  # where migrations before 0008 parked a job that waits


def two_waiting() -> tuple[Job, Job, Job]:
    """first, then second after it, then a callback after both: two jobs blocked."""
    flow = Workflow("shown")
    first = flow.add(jobs.step, tag="first")
    second = flow.add(jobs.step, tag="second", after=[first])
    callback = flow.add(jobs.summary, after=[first, second])
    flow.enqueue()
    return first.job, second.job, callback.job  # type: ignore[return-value]


def durq(*args: str) -> str:
    out = StringIO()
    call_command("durq", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.django_db
@pytest.mark.urls("tests.admin.test_admin")
def test_a_blocked_job_is_shown_as_a_state_of_its_own_never_as_delayed():
    first, second, callback = two_waiting()
    (row,) = [row for row in ops.stats() if row.queue == "default"]
    assert (row.waiting, row.delayed, row.blocked) == (1, 0, 2)
    shown = durq("show", str(callback.pk))
    data = json.loads(durq("show", str(second.pk), "--json"))[0]
    listed = durq("workflow", str(first.workflow_id))
    assert shown.splitlines()[0] == f"Job {callback.pk} (tests.summary) in queue 'default': blocked (waiting for 2 upstream)"
    assert "once its upstream jobs end, not before" in shown and "9999" not in shown
    assert (data["status"], data["waiting_for"]) == ("blocked", 1)
    assert "blocked (waiting for 1 upstream)" in listed and "9999" not in listed
    bearer = {"HTTP_AUTHORIZATION": "Bearer s3cret-s3cret-s3cret"}
    with override_settings(DURQ={**settings.DURQ, "MONITORING": {"TOKEN": "s3cret-s3cret-s3cret"}}):
        metrics = Client().get("/durq/metrics/", **bearer).content.decode()
    assert 'durq_jobs{queue="default",state="blocked"} 2' in metrics
    assert 'durq_jobs{queue="default",state="delayed"} 0' in metrics
    admin = Client()
    admin.force_login(User.objects.create_superuser("root"))
    page = admin.get("/admin/django_durq/job/").content.decode()
    assert "waiting for 2 upstream jobs to end" in page and "waiting for 1 upstream job to end" in page


@pytest.mark.django_db
def test_cancel_and_retry_act_on_blocked_jobs_and_a_blocked_job_holds_its_dedupe_key():
    flow = Workflow("keyed")
    first = flow.add(jobs.step, tag="first")
    keyed = flow.add(jobs.step.using(unique="report:7"), tag="keyed", after=[first])
    flow.enqueue()
    assert jobs.step.using(unique="report:7").enqueue(tag="again").pk == keyed.job.pk  # deduplicated onto it
    assert ops.cancel([keyed.job.pk]).cancelled == [keyed.job.pk]
    assert ops.retry([keyed.job.pk]).retried == [keyed.job.pk]
    assert Job.objects.get(pk=keyed.job.pk).state == "blocked (waiting for 1 upstream)"


def _migrate(executor: MigrationExecutor, target: tuple[str, str]) -> MigrationExecutor:
    executor.migrate([target])
    return MigrationExecutor(connection)


def _indexes() -> dict[str, str]:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name, sql FROM sqlite_master WHERE tbl_name = 'durq_job' AND sql LIKE 'CREATE%INDEX%'")
        else:
            cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'durq_job'")
        return dict(cursor.fetchall())


@pytest.mark.django_db(transaction=True)
def test_the_migration_turns_parked_members_blocked_keeps_their_keys_and_reverses():
    executor = MigrationExecutor(connection)
    (latest,) = executor.loader.graph.leaf_nodes("django_durq")
    before, blocked = ("django_durq", "0007_worker_holds_lock"), ("django_durq", "0008_blocked_state")
    executor = _migrate(executor, before)
    try:
        old = executor.loader.project_state([before]).apps.get_model("django_durq", "Job")
        common = {"name": "tests.step", "arguments": '{"args": [], "kwargs": {"tag": "x"}}', "lease_ms": 30_000}
        parked = old.objects.create(
            **common, run_at_ms=SENTINEL_MS, created_ms=NOW, deps_left=1, workflow_id=1, unique_key="parked"
        )
        due = old.objects.create(**common, run_at_ms=NOW, created_ms=NOW, deps_left=0, workflow_id=1)
        executor = _migrate(executor, blocked)
        # The model as of that migration: later ones add columns this state of the table lacks.
        Job = executor.loader.project_state([blocked]).apps.get_model("django_durq", "Job")  # noqa: N806
        row = Job.objects.get(pk=parked.pk)
        assert (row.status, row.run_at_ms, row.unique_active) == ("blocked", NOW, "parked")
        assert Job.objects.get(pk=due.pk).status == "waiting"
        if db_vendor() != "mysql":  # MariaDB keeps migration 0001's full indexes
            indexes = _indexes()
            assert "unique_active IS NOT NULL" in indexes["durq_job_unique_active"]
            assert "'blocked'" in indexes["durq_job_blocked"]
            for name in ("durq_job_claim", "durq_job_due"):
                assert "'waiting'" in indexes[name].split("WHERE", 1)[1], name
            assert {"durq_job_lease", "durq_job_done", "durq_job_limited", "durq_job_workflow"} <= indexes.keys()
        executor = _migrate(executor, before)
        back = old.objects.get(pk=parked.pk)
        assert (back.status, back.run_at_ms, back.unique_active) == ("waiting", SENTINEL_MS, "parked")
    finally:
        _migrate(MigrationExecutor(connection), latest)
