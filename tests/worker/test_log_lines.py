"""The worker's per-job log lines: whole messages (no word or value cut off), and the job's id, type,
queue and attempt as structured ``extra`` on every one of them."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from django_durq import job
from django_durq.clock import ManualClock, use_clock
from django_durq.conf import get_settings
from django_durq.db.store import Store
from django_durq.execution.executor import Executor
from django_durq.execution.outcomes import MAX_MESSAGE_CHARS
from django_durq.handlers.registry import WHERE_HANDLERS_LIVE, registry, unknown_job_message
from django_durq.models import Job
from django_durq.testing import drain
from tests.ledger import jobs

pytestmark = pytest.mark.django_db

EXTRA = ("job_id", "job_name", "queue", "attempt")


@pytest.fixture
def clock():
    manual = ManualClock(start_ms=1_800_000_000_000)
    with use_clock(manual):
        yield manual


@pytest.fixture
def lines(caplog):
    caplog.set_level(logging.DEBUG, logger="django_durq")
    return caplog


def job_lines(caplog, job_id: int) -> list[logging.LogRecord]:
    return [record for record in caplog.records if f"job {job_id} " in record.getMessage()]


def test_an_unknown_job_types_hand_back_line_keeps_the_whole_message(clock, lines):
    definition = job(name="tests.logs.vanished", max_attempts=2)(lambda ctx: None)
    queued = definition.enqueue()
    registry.remove(definition.name)
    drain(clock=clock)
    said = [record.getMessage() for record in lines.records if "'tests.logs.vanished'" in record.getMessage()]
    assert len(said) == 1, said  # once per type, not once per job
    assert said[0].startswith(f"durq: {unknown_job_message('tests.logs.vanished')}. Its jobs are handed back")
    assert WHERE_HANDLERS_LIVE in said[0]
    row = Job.objects.get(pk=queued.pk)
    assert (row.status, row.attempts) == ("waiting", 0)  # handed back, no attempt spent


def test_a_long_message_is_logged_whole_and_stored_cut_at_a_word_with_a_note(clock, lines):
    words = " ".join(f"word{n}" for n in range(1_000))  # about 6,900 characters
    queued = jobs.fail.using(max_attempts=1).enqueue(message=words)
    drain(clock=clock)
    (dead,) = job_lines(lines, queued.pk)
    assert words in dead.getMessage()
    stored = Job.objects.get(pk=queued.pk).last_error["message"]
    kept, note = stored.rsplit(" … ", 1)
    assert len(kept) <= MAX_MESSAGE_CHARS and words.startswith(kept + " ")
    assert note == f"({len(words) - len(kept)} more characters)"


def test_every_per_job_line_carries_the_job(clock, lines, settings):
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 60}
    store = Store(get_settings().database)
    executor = Executor(store, get_settings(), clock, "logs-test")
    # A job whose worker died on its last attempt: buried by another worker.
    lost = jobs.noop.enqueue()
    Job.objects.filter(pk=lost.pk).update(
        status="running", attempts=5, max_attempts=5, claim_token=7, lease_expires_ms=clock.now_ms() - 1, claimed_by="gone"
    )
    executor.bury_lost("default", (lost.pk, 7), "tests.noop", 5, "[]", "gone")
    # Finished, cancelled, expired.
    finished = jobs.noop.enqueue()
    drain(clock=clock)
    expired = jobs.noop.using(expires=1).enqueue()
    clock.advance(2_000)
    drain(clock=clock)
    for queued in (lost, finished, expired):
        records = job_lines(lines, queued.pk)
        assert records, f"no line for job {queued.pk}"
        for record in records:
            assert all(hasattr(record, key) for key in EXTRA), record.getMessage()
            assert record.job_id == queued.pk and record.queue == "default"


def test_a_handler_returning_after_its_timeout_was_recorded_is_logged_with_the_job(clock, lines):
    store = Store(get_settings().database)
    executor = Executor(store, get_settings(), clock, "logs-test")
    queued = jobs.noop.enqueue()
    (claimed,) = store.claim("default", 1, clock.now_ms(), "logs-test")
    from django_durq.handlers.context import JobContext

    ctx = JobContext(claimed, worker_id="logs-test", store=store, clock=clock, shutdown=threading.Event())
    ctx.settle()  # the monitor recorded a timeout first
    executor.record(claimed, ctx, None, None, [])
    (late,) = job_lines(lines, queued.pk)
    assert "returned after its attempt was settled" in late.getMessage() and late.attempt == 1
    assert json.loads(Job.objects.get(pk=queued.pk).errors) == []
