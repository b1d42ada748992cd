"""Orphans: a job whose worker has ended is taken over in about a second, not after its lease.

Where presence shows that a worker's lock is gone (its process was killed; on PostgreSQL and
MariaDB also its database session ended), the maintenance leader records its running jobs as
failed attempts (``worker lost``) and makes them claimable at once; a last attempt becomes a
dead letter. Until then ``durq show`` and the health view show the job as orphaned, with its
last worker. A worker that loses its own presence session tells its handlers to stop.

The jobs here hold leases of 30 s and more, so that a recovery through the lease would take far
longer than the caps below: every cap is a liveness cap of a polling wait, never a speed claim.
"""

from __future__ import annotations

import re
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from django_durq import ops
from django_durq.db.session_locks import PostgreSQLLocks, session_locks
from django_durq.models import Job, Status
from tests.conftest import db_vendor, wait_until
from tests.ledger import checker, jobs
from tests.ledger.models import Effect

from .conftest import one_leg, only_on, problems_in

pytestmark = pytest.mark.processes

LONG_LEASE_S = 60
# A takeover comes within a maintenance pass (1 s) of the end, plus the wake-up and a claim; the
# leader lists workers that started since its last look within 5 s. Far below LONG_LEASE_S.
TAKEOVER_CAP_S = 15


def running_on(job_id: int) -> str:
    row = wait_until(
        lambda: Job.objects.filter(pk=job_id, status=Status.RUNNING).values_list("claimed_by", flat=True).first(),
        60,
        f"job {job_id} to run",
    )
    return str(row)


def show(job_id: int) -> str:
    out = StringIO()
    call_command("durq", "show", str(job_id), stdout=out)
    return out.getvalue()


def test_a_killed_workers_job_is_taken_over_within_a_second_not_a_lease(faults):
    held = jobs.effect.using(lease=LONG_LEASE_S).enqueue(tag="held", sleep_first=30.0)
    victim = faults.spawn_ready("--queue", "default:1")
    victim_id = running_on(held.pk)
    rescuer = faults.spawn_ready("--queue", "default:1")
    others = jobs.effect.enqueue_many([{"tag": "other"} for _ in range(20)])

    victim.kill()
    killed = time.monotonic()
    wait_until(lambda: Job.objects.get(pk=held.pk).status != Status.RUNNING, TAKEOVER_CAP_S, "the orphan to be taken over")
    taken_s = time.monotonic() - killed
    wait_until(lambda: not Job.objects.active().exists(), 60, "the drain")

    row = Job.objects.get(pk=held.pk)
    assert (row.status, row.attempts) == (Status.FINISHED, 2), taken_s
    [entry] = row.error_list
    assert (entry["attempt"], entry["kind"], entry["worker"]) == (1, "worker_lost", victim_id)
    assert entry["message"].startswith("worker lost: ")
    verdict = checker.check({held.pk} | {job.pk for job in others})
    assert verdict.exact, verdict
    output = rescuer.output()
    assert f"taken over from worker {victim_id}" in output
    assert problems_in(output) == []


@one_leg
def test_a_per_key_limit_does_not_stall_behind_a_killed_holder(faults, tmp_path):
    log = tmp_path / "runs.log"
    limited = jobs.one_per_key.using(lease=LONG_LEASE_S)
    first = limited.enqueue(key="k", log=str(log), hold_first=30.0)
    victim = faults.spawn_ready("--queue", "default:2")
    running_on(first.pk)
    rest = [limited.enqueue(key="k", log=str(log)) for _ in range(3)]
    rescuer = faults.spawn_ready("--queue", "default:2")

    victim.kill()
    wait_until(lambda: not Job.objects.active().exists(), TAKEOVER_CAP_S + 5, "the key's jobs to run")
    assert len(log.read_text().splitlines()) == 4
    assert Job.objects.get(pk=first.pk).error_list[0]["kind"] == "worker_lost"
    assert {job.status for job in Job.objects.filter(pk__in=[job.pk for job in rest])} == {Status.FINISHED}
    assert problems_in(rescuer.output()) == []


@one_leg
def test_an_orphan_is_shown_with_its_worker_until_a_worker_takes_it_over(faults):
    held = jobs.effect.using(lease=2 * LONG_LEASE_S).enqueue(tag="held", sleep=30.0)
    victim = faults.spawn_ready("--queue", "default:1")
    victim_id = running_on(held.pk)
    assert "orphaned" not in show(held.pk)

    victim.kill()  # no other worker: nobody takes the job over yet
    text = wait_until(lambda: "orphaned" in show(held.pk) and show(held.pk), 10, "durq show to call the job orphaned")
    assert f"worker    {victim_id} (ended" in text and re.search(r"lease +expires \d{4}-", text), text
    [orphan] = ops.health()["orphaned_jobs"]
    assert (orphan["id"], orphan["worker"]) == (held.pk, victim_id)
    assert orphan["lease_expires_at"] is not None

    rescuer = faults.spawn_ready("--queue", "default:1")
    wait_until(lambda: Job.objects.get(pk=held.pk).attempts == 2, TAKEOVER_CAP_S, "the rescuer to take the orphan over")
    assert ops.health()["orphaned_jobs"] == []
    assert f"taken over from worker {victim_id}" in rescuer.output()


@one_leg
def test_a_last_attempt_of_a_killed_worker_is_a_dead_letter_at_once(faults):
    last = jobs.effect.using(lease=LONG_LEASE_S, max_attempts=1).enqueue(tag="last", sleep=30.0)
    victim = faults.spawn_ready("--queue", "default:1")
    victim_id = running_on(last.pk)
    rescuer = faults.spawn_ready("--queue", "default:1")

    victim.kill()
    wait_until(lambda: Job.objects.get(pk=last.pk).status == Status.DEAD, TAKEOVER_CAP_S, "the dead letter")
    row = Job.objects.get(pk=last.pk)
    assert row.attempts == 1 and [(e["kind"], e["worker"]) for e in row.error_list] == [("worker_lost", victim_id)]
    assert not Effect.objects.filter(job_id=last.pk).exists()
    assert "-> dead letter" in rescuer.output()


def kill_presence_session(worker_id: str) -> None:
    """End the database session that holds ``worker_id``'s presence lock, as a network reset would."""
    with connection.cursor() as cursor:
        if db_vendor() == "postgres":
            namespace, key = PostgreSQLLocks.key(worker_id)
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND classid = %s AND objid = %s AND objsubid = 2",
                [namespace, key],
            )
            assert cursor.fetchall(), "no session holds the worker's lock"
        else:
            cursor.execute("SELECT IS_USED_LOCK(%s)", [session_locks("default").name(worker_id)])
            holder = cursor.fetchone()[0]
            assert holder is not None, "no session holds the worker's lock"
            cursor.execute(f"KILL CONNECTION {int(holder)}")


LEADS = "this worker now runs the maintenance duties"


@one_leg
@only_on("postgres", "mysql")
def test_a_worker_that_loses_its_presence_session_stops_its_handlers(faults, tmp_path):
    leader = faults.spawn_ready("--queue", "default:1")
    wait_until(lambda: LEADS in leader.output(), 30, "the first worker to lead")
    began = tmp_path / "began"
    held = jobs.stop_reason.using(lease=LONG_LEASE_S).enqueue(seconds=30.0, began=str(began))
    worker = faults.spawn("--queue", "default:1")
    wait_until(began.exists, 60, "the handler to start")
    worker_id = Job.objects.get(pk=held.pk).claimed_by

    kill_presence_session(worker_id)
    # Its handler hears it at once, before its lease is anywhere near its end.
    stopped = wait_until(lambda: Effect.objects.filter(job_id=held.pk, tag__startswith="stopped:").first(), 10, "the stop")
    _, reason, stopped_ms = stopped.tag.split(":")
    assert reason == "presence lost", stopped.tag
    wait_until(lambda: Job.objects.get(pk=held.pk).status == Status.FINISHED, 30, "the job to run again and finish")
    rerun = Effect.objects.get(job_id=held.pk, tag="rerun")
    # A takeover may come before the worker hears of its lost session, but never by more than the
    # presence session's pace (2 s), with a second for scheduling.
    assert int(stopped_ms) - rerun.started_ms <= 3_000, (stopped.tag, rerun.started_ms)
    assert Effect.objects.filter(job_id=held.pk).count() == 2  # the stopped run and the rerun
    for process in (leader, worker):
        assert problems_in(process.output()) == []
