"""``expires``: a job not started by then never runs. Refused at the boundary when it could never
start; ended without running when a claim finds it expired (its attempt not spent); ended by the
maintenance sweep when no claim reaches it (a paused queue, a queue no worker serves)."""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime, timedelta

import pytest

from django_durq import Workflow, job, ops
from django_durq.clock import ManualClock
from django_durq.conf import get_settings
from django_durq.handlers.registry import registry
from django_durq.models import Job
from django_durq.testing import drain
from django_durq.worker.duties import ExpiryDuty
from tests.conftest import wait_until
from tests.enqueue.helpers import START
from tests.ledger import jobs
from tests.ledger.models import Effect

pytestmark = pytest.mark.django_db


def sweep(clock: ManualClock) -> dict[str, int]:
    return ExpiryDuty(get_settings()).run_once(clock.now_ms())


# --- the option, refused where it is given ------------------------------------------------------------


def test_expires_takes_a_duration_or_an_aware_datetime(clock):
    by_duration = jobs.effect.using(expires=timedelta(minutes=5)).enqueue(tag="a")
    by_seconds = jobs.effect.using(expires=30).enqueue(tag="b")
    at = datetime.fromtimestamp(START / 1000 + 3600, UTC)
    by_moment = jobs.effect.using(expires=at).enqueue(tag="c")
    assert [Job.objects.get(pk=j.pk).expires_ms for j in (by_duration, by_seconds, by_moment)] == [
        START + 300_000,
        START + 30_000,
        START + 3_600_000,
    ]
    assert Job.objects.get(pk=jobs.effect.enqueue(tag="d").pk).expires_ms is None


@pytest.mark.parametrize(
    ("value", "error", "fragment"),
    [
        ("soon", TypeError, "expires must be a timedelta, a number of seconds or an aware datetime"),
        (0, ValueError, "expires is 0; it must be at least a millisecond"),
        (datetime(2030, 1, 1), ValueError, "expires must be an aware datetime"),
        (True, TypeError, "not bool"),
    ],
)
def test_a_bad_expires_raises_where_it_is_given(value, error, fragment):
    with pytest.raises(error, match=fragment):
        jobs.effect.using(expires=value)


def test_an_expiry_at_or_before_the_due_time_is_refused_before_anything_is_written(clock):
    with pytest.raises(ValueError, match=r"expires .* is not after the job's due time .*: it could never start"):
        jobs.effect.using(run_in=60, expires=60).enqueue(tag="never")
    at = datetime.fromtimestamp(START / 1000 - 1, UTC)
    with pytest.raises(ValueError, match="could never start"):
        jobs.effect.using(expires=at).enqueue(tag="past")
    assert not Job.objects.exists()


def test_a_handler_gives_every_job_an_expiry_that_using_overrides(clock):
    definition = job(name="tests.expiring", expires=timedelta(seconds=90))(lambda ctx: None)
    try:
        assert Job.objects.get(pk=definition.enqueue().pk).expires_ms == START + 90_000
        assert Job.objects.get(pk=definition.using(expires=10).enqueue().pk).expires_ms == START + 10_000
    finally:
        registry.remove(definition.name)
    with pytest.raises(TypeError, match="expires must be a timedelta or a number of seconds"):
        job(name="tests.expiring.bad", expires=datetime(2030, 1, 1, tzinfo=UTC))(lambda ctx: None)


# --- a claim that finds it expired ------------------------------------------------------------------------


def test_a_job_claimed_after_its_expiry_ends_cancelled_without_running_and_its_attempt_is_not_spent(clock):
    queued = jobs.effect.using(expires=timedelta(seconds=10)).enqueue(tag="late")
    clock.advance(timedelta(seconds=10))
    assert drain(clock=clock) == {"expired": 1}
    row = Job.objects.get(pk=queued.pk)
    assert (row.status, row.attempts, row.finished_ms) == ("cancelled", 0, START + 10_000)
    assert row.last_error["kind"] == "expired"
    assert row.last_error["message"] == "expired at 2027-01-15T08:00:10.000+00:00, before it started"
    assert not Effect.objects.exists(), "the handler never ran"


def test_a_job_claimed_before_its_expiry_runs(clock):
    queued = jobs.effect.using(expires=timedelta(seconds=10)).enqueue(tag="early")
    clock.advance(timedelta(seconds=9))
    assert drain(clock=clock) == {"finished": 1}
    assert Effect.objects.filter(job_id=queued.pk).count() == 1


def test_a_retry_due_after_the_expiry_does_not_start(clock):
    queued = jobs.fail.using(expires=timedelta(seconds=30)).enqueue(message="boom")
    assert drain(clock=clock) == {"retrying": 1}
    clock.advance(timedelta(minutes=1))
    assert drain(clock=clock) == {"expired": 1}
    row = Job.objects.get(pk=queued.pk)
    assert (row.status, row.attempts, [e["kind"] for e in row.error_list]) == ("cancelled", 1, ["exception", "expired"])


# --- the sweep: no claim reaches it ------------------------------------------------------------------------


def test_the_sweep_ends_expired_jobs_of_a_paused_queue_and_leaves_the_rest(clock):
    ops.pause("default", now_ms=START)
    expiring = [jobs.effect.using(expires=10 + k).enqueue(tag=f"e{k}") for k in range(3)]
    later = jobs.effect.using(expires=60).enqueue(tag="later")
    forever = jobs.effect.enqueue(tag="forever")
    assert sweep(clock) == {"expired": 0}
    clock.advance(timedelta(seconds=12))
    assert sweep(clock) == {"expired": 3}
    statuses = dict(Job.objects.values_list("pk", "status"))
    assert [statuses[j.pk] for j in expiring] == ["cancelled"] * 3
    assert (statuses[later.pk], statuses[forever.pk]) == ("waiting", "waiting")
    row = Job.objects.get(pk=expiring[0].pk)
    assert (row.finished_ms, row.attempts, row.last_error["kind"]) == (START + 12_000, 0, "expired")
    assert sweep(clock) == {"expired": 0}
    ops.resume("default", now_ms=clock.now_ms())
    assert drain(clock=clock) == {"finished": 2}


def test_the_sweep_looks_again_at_the_next_expiry_within_five_seconds(clock):
    duty = ExpiryDuty(get_settings())
    duty.run_once(clock.now_ms())
    assert duty.every_ms == 5_000  # nothing expiring: every five seconds
    jobs.effect.using(expires=2.5).enqueue(tag="soon")
    duty.run_once(clock.now_ms())
    assert duty.every_ms == 2_500  # at its expiry
    jobs.effect.using(expires=0.2).enqueue(tag="sooner")
    duty.run_once(clock.now_ms())
    assert duty.every_ms == 1_000  # never more often than the maintenance pass


def test_the_sweep_leaves_a_job_that_runs_or_ended(clock):
    running = jobs.effect.using(expires=5).enqueue(tag="run")
    Job.objects.filter(pk=running.pk).update(status="running", attempts=1, lease_expires_ms=START + 60_000)
    done = jobs.effect.using(expires=5).enqueue(tag="done")
    Job.objects.filter(pk=done.pk).update(status="finished", finished_ms=START)
    clock.advance(timedelta(seconds=6))
    assert sweep(clock) == {"expired": 0}
    assert dict(Job.objects.values_list("pk", "status")) == {running.pk: "running", done.pk: "finished"}


def test_an_expired_job_of_a_workflow_cancels_what_waits_for_it(clock):
    flow = Workflow("expiring")
    first = flow.add(jobs.effect.using(expires=5), tag="first")
    then = flow.add(jobs.effect, tag="then", after=[first])
    flow.enqueue()
    ops.pause("default", now_ms=START)
    clock.advance(timedelta(seconds=6))
    assert sweep(clock) == {"expired": 1}
    assert Job.objects.get(pk=then.job.pk).status == "cancelled"
    assert Job.objects.get(pk=then.job.pk).cancelled_by == first.job.pk


def test_a_retried_expired_job_runs_as_asked(clock):
    queued = jobs.effect.using(expires=5).enqueue(tag="again")
    clock.advance(timedelta(seconds=6))
    assert drain(clock=clock) == {"expired": 1}
    assert ops.retry([queued.pk], now_ms=clock.now_ms()).retried == [queued.pk]
    assert Job.objects.get(pk=queued.pk).expires_ms is None, "an operator's retry asks for a run: the expiry goes"
    assert drain(clock=clock) == {"finished": 1}


def test_a_debounce_moves_the_expiry_with_the_due_time(clock):
    first = jobs.effect.using(unique="debounce", run_in=5, expires=10, on_duplicate="reschedule").enqueue(tag="x")
    clock.advance(timedelta(seconds=8))
    jobs.effect.using(unique="debounce", run_in=5, expires=10, on_duplicate="reschedule").enqueue(tag="x")
    row = Job.objects.get(pk=first.pk)
    assert (row.run_at_ms, row.expires_ms) == (START + 13_000, START + 18_000)


def test_the_stored_error_names_the_expiry_in_django_tasks_terms(clock):
    from django_durq.tasks.results import _task_error

    queued = jobs.effect.using(expires=1).enqueue(tag="task")
    clock.advance(timedelta(seconds=2))
    drain(clock=clock)
    entry = Job.objects.get(pk=queued.pk).last_error
    assert _task_error(entry).exception_class_path == "django_durq.tasks.results.TaskCancelled"
    assert json.loads(json.dumps(entry)) == entry


# --- a real worker --------------------------------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.one_leg
@pytest.mark.django_db(transaction=True)
def test_a_worker_ends_an_expired_job_of_a_paused_queue_and_runs_the_others(spawn_worker):
    ops.pause("slow")
    expiring = jobs.slow.using(expires=1).enqueue(seconds=0)
    kept = jobs.effect.using(expires=300).enqueue(tag="kept")
    worker = spawn_worker("--queue", "default:1", env={"DURQ_TEST_KEEP_FINISHED": "300"})
    wait_until(lambda: Job.objects.get(pk=expiring.pk).status == "cancelled", timeout=30, message="the expired job ended")
    wait_until(lambda: Job.objects.get(pk=kept.pk).status == "finished", timeout=30, message="the other job ran")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    assert Job.objects.get(pk=expiring.pk).last_error["kind"] == "expired"
    assert "expired" in worker.output()
