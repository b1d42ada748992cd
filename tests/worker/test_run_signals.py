"""``job_prerun`` and ``job_postrun``: sent in the handler's own thread around each handler run, with
the job's id, type, queue and attempt; a receiver that raises is logged and changes nothing."""

from __future__ import annotations

import logging
import signal
import sys
import threading

import pytest

from django_durq.clock import ManualClock, use_clock
from django_durq.models import Job
from django_durq.signals import job_postrun, job_prerun
from django_durq.testing import drain
from tests.conftest import wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock():
    manual = ManualClock(start_ms=1_800_000_000_000)
    with use_clock(manual):
        yield manual


@pytest.fixture
def heard():
    """Every prerun and postrun as (signal, kwargs, thread, exc_info) tuples."""
    seen: list[tuple[str, dict, int, object]] = []

    def on_prerun(sender, **kwargs):
        seen.append(("prerun", kwargs, threading.get_ident(), None))

    def on_postrun(sender, **kwargs):
        seen.append(("postrun", kwargs, threading.get_ident(), sys.exc_info()[1]))

    job_prerun.connect(on_prerun)
    job_postrun.connect(on_postrun)
    yield seen
    job_prerun.disconnect(on_prerun)
    job_postrun.disconnect(on_postrun)


def test_prerun_and_postrun_come_around_the_handler_in_its_thread(clock, heard):
    queued = jobs.step.enqueue("first")
    assert drain(clock=clock) == {"finished": 1}
    (before, kwargs_before, thread_before, _), (after, kwargs_after, thread_after, _) = heard
    assert (before, after) == ("prerun", "postrun")
    assert thread_before == thread_after == threading.get_ident()  # drain runs handlers in this thread
    for kwargs in (kwargs_before, kwargs_after):
        assert {k: kwargs[k] for k in ("job_id", "name", "queue", "attempt")} == {
            "job_id": queued.pk,
            "name": "tests.step",
            "queue": "default",
            "attempt": 1,
        }
        assert kwargs["ctx"].job_id == queued.pk
    assert (kwargs_after["result"], kwargs_after["error"]) == ("first", None)


def test_postrun_of_a_failed_attempt_carries_its_error_in_exc_info(clock, heard):
    jobs.fail.enqueue(message="boom")
    drain(clock=clock)
    _, kwargs, _, exc_info = heard[-1]
    assert isinstance(kwargs["error"], ValueError) and str(kwargs["error"]) == "boom"
    assert exc_info is kwargs["error"] and kwargs["result"] is None


def test_no_prerun_for_a_job_that_never_starts(clock, heard):
    jobs.effect.using(expires=1).enqueue(tag="late")
    clock.advance(2_000)
    assert drain(clock=clock) == {"expired": 1}
    assert heard == []


@pytest.mark.parametrize("raised", [RuntimeError("receiver bug"), SystemExit(3)])
def test_a_receiver_that_raises_is_logged_and_the_job_goes_on(clock, caplog, raised):
    def broken(sender, **kwargs):
        raise raised

    job_prerun.connect(broken)
    job_postrun.connect(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="django_durq"):
            queued = jobs.effect.enqueue(tag="goes on")
            assert drain(clock=clock) == {"finished": 1}
    finally:
        job_prerun.disconnect(broken)
        job_postrun.disconnect(broken)
    assert Effect.objects.filter(job_id=queued.pk).count() == 1
    logged = [r for r in caplog.records if "signal receiver" in r.getMessage()]
    assert len(logged) == 2 and all(r.job_id == queued.pk for r in logged)


@pytest.mark.processes
@pytest.mark.one_leg
@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_receivers_raise_keeps_running_jobs(spawn_worker):
    worker = spawn_worker("--queue", "default:2", env={"DURQ_TEST_RUN_SIGNALS": "raise", "DURQ_TEST_KEEP_FINISHED": "300"})
    queued = [jobs.effect.enqueue(tag=f"job{k}") for k in range(4)]
    wait_until(
        lambda: Job.objects.filter(pk__in=[j.pk for j in queued], status="finished").count() == 4,
        timeout=60,
        message="every job finished",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    ran_in = dict(Effect.objects.filter(tag__startswith="job").values_list("job_id", "pid"))
    heard_in = dict(Effect.objects.filter(tag="prerun").values_list("job_id", "pid"))
    assert ran_in == heard_in  # the receiver ran for every job, in the worker that ran it
    assert worker.output().count("a signal receiver") == 8  # each raising receiver logged, none lost a job
