"""A failed job reaches an error tracker through logging: once per failed attempt, with its exception and its
job id, type, queue and attempt as fields; a job that finishes reaches it never (docs/error-trackers.md)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from django_durq.clock import ManualClock, now_ms
from django_durq.testing import drain
from tests.ledger import jobs


class TrackerHandler(logging.Handler):
    """Does what a logging-integrated tracker does (Sentry's LoggingIntegration, Rollbar's, Bugsnag's): every
    record that carries an exception becomes an event, tagged from the record's fields."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.events: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info is None:
            return
        tags = {key: getattr(record, key) for key in ("job_id", "job_name", "queue", "attempt")}
        self.events.append({"exception": record.exc_info[1], "level": record.levelname, "tags": tags})


@pytest.fixture
def tracker() -> Iterator[TrackerHandler]:
    handler = TrackerHandler()
    root = logging.getLogger()
    root.addHandler(handler)  # where a tracker's integration listens: the root logger, records propagated to it
    yield handler
    root.removeHandler(handler)


def test_each_failed_attempt_is_one_event_with_the_job_as_tags(tracker, transactional_db):
    clock = ManualClock(now_ms() + 1000)
    failing = jobs.fail.using(max_attempts=2).enqueue(message="card declined")
    jobs.noop.enqueue_many([{} for _ in range(3)])
    drain(clock=clock)
    clock.advance(120_000)  # past the backoff
    drain(clock=clock)

    assert [event["tags"] for event in tracker.events] == [
        {"job_id": failing.pk, "job_name": "tests.fail", "queue": "default", "attempt": 1},
        {"job_id": failing.pk, "job_name": "tests.fail", "queue": "default", "attempt": 2},
    ], "one event per failed attempt, none for the jobs that finished"
    assert [str(event["exception"]) for event in tracker.events] == ["card declined", "card declined"]
    assert [event["level"] for event in tracker.events] == ["WARNING", "ERROR"], "retried, then a dead letter"


def test_a_retry_the_handler_asks_for_is_no_error_event(tracker, transactional_db):
    jobs.retry_explicit.enqueue(seconds=30)
    jobs.abort.enqueue()
    drain()
    assert [event["tags"]["job_name"] for event in tracker.events] == ["tests.abort"]
