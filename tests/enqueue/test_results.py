"""Waiting for a job's result: ``django_durq.result(job, timeout=)`` and ``Job.wait(timeout=)``
return the stored return value, or say why there is none (dead, cancelled, expired, not kept,
still running at the timeout)."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest
from django.db import transaction

import django_durq
from django_durq import JobCancelled, JobExpired, JobFailed, ResultNotKept, ResultTimeout, job, ops
from django_durq.enqueue.results import WaitInTransaction
from django_durq.handlers.registry import registry
from django_durq.testing import drain
from tests.ledger import jobs


@pytest.fixture
def keep(settings):
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 3600}


@pytest.fixture
def answer():
    def handler(ctx, fail=False):
        if fail:
            raise ValueError("no answer today")
        return {"answer": 42}

    definition = job(name="tests.results.answer", max_attempts=2)(handler)
    yield definition
    registry.remove(definition.name)


@pytest.mark.django_db
def test_a_finished_job_gives_its_return_value(clock, keep, answer):
    queued = answer.enqueue()
    drain(clock=clock)
    assert django_durq.result(queued, timeout=0) == {"answer": 42}
    assert django_durq.result(queued.pk, timeout=timedelta(seconds=1)) == {"answer": 42}
    assert queued.wait(timeout=1) == {"answer": 42}
    nothing = jobs.noop.enqueue()
    drain(clock=clock)
    assert nothing.wait(timeout=0) is None


@pytest.mark.django_db
def test_a_dead_job_raises_job_failed_with_its_last_error(clock, keep, answer):
    queued = answer.enqueue(fail=True)
    drain(clock=clock)
    clock.advance(timedelta(minutes=5))
    drain(clock=clock)
    with pytest.raises(JobFailed, match=r"job \d+ \(tests.results.answer\) is a dead letter: no answer today") as raised:
        queued.wait(timeout=0)
    assert raised.value.job_id == queued.pk and len(raised.value.errors) == 2


@pytest.mark.django_db
def test_a_cancelled_or_expired_job_raises_saying_so(clock, keep):
    cancelled = jobs.noop.enqueue()
    ops.cancel([cancelled.pk], now_ms=clock.now_ms())
    with pytest.raises(JobCancelled, match=r"job \d+ \(tests.noop\) was cancelled") as raised:
        cancelled.wait(timeout=0)
    assert not isinstance(raised.value, JobExpired)
    expired = jobs.noop.using(expires=1).enqueue()
    clock.advance(timedelta(seconds=2))
    drain(clock=clock)
    with pytest.raises(JobExpired, match=r"expired at .* before it started"):
        expired.wait(timeout=0)


@pytest.mark.django_db
def test_a_result_that_is_not_kept_is_an_error_at_once(clock, settings):
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 0}
    queued = jobs.noop.enqueue()
    with pytest.raises(ResultNotKept, match=r'KEEP_FINISHED"\] is 0 for queue \'default\''):
        queued.wait(timeout=60)
    with pytest.raises(ResultNotKept, match=r"no job 999999 in the queue's table"):
        django_durq.result(999_999, timeout=0)


@pytest.mark.django_db
def test_waiting_inside_a_transaction_is_refused_when_the_job_has_not_ended(keep):
    with transaction.atomic():
        queued = jobs.noop.enqueue()
        with pytest.raises(WaitInTransaction, match=r"outside transaction\.atomic"):
            queued.wait(timeout=5)


@pytest.mark.django_db(transaction=True)
def test_a_job_still_waiting_at_the_timeout_raises_result_timeout(keep):
    queued = jobs.noop.enqueue()
    began = time.monotonic()
    with pytest.raises(ResultTimeout, match=r"job \d+ \(tests.noop\) is still waiting after 0.3 s") as raised:
        queued.wait(timeout=0.3)
    assert isinstance(raised.value, TimeoutError)
    assert time.monotonic() - began >= 0.3
    with pytest.raises(TypeError):
        queued.wait()  # type: ignore[call-arg]  # a wait without a bound is asked for explicitly


@pytest.mark.processes
@pytest.mark.one_leg
@pytest.mark.django_db(transaction=True)
def test_waiting_for_a_job_a_worker_runs(spawn_worker, keep):
    worker = spawn_worker("--queue", "default:2", env={"DURQ_TEST_KEEP_FINISHED": "300"})
    try:
        quick = jobs.step.enqueue("quick")
        assert django_durq.result(quick, timeout=60) == "quick"
        held = jobs.step.enqueue("held", hold=3.0)
        with pytest.raises(ResultTimeout, match=r"is still (running|waiting) after 0\.5 s"):
            held.wait(timeout=0.5)
        assert held.wait(timeout=60) == "held"
        failing = jobs.step.using(max_attempts=1).enqueue("bad", fail=True)
        with pytest.raises(JobFailed, match="bad fails as asked"):
            failing.wait(timeout=60)
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output()
