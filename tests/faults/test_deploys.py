"""Rolling deploys: workers of the old and the new release side by side lose nothing and burn nothing.

A worker started with ``DURQ_TEST_CODE=old`` runs the former release of ``tests/ledger/jobs.py``:
it lacks the job type ``tests.added_in_new`` and its ``tests.reshaped`` takes the former
arguments. The test process, and workers started without it, run the new release.

- A job whose type a worker does not know is handed back without spending an attempt, for a
  worker that knows it; the worker says so once per type.
- A job whose stored arguments do not fit its handler is a dead letter at once, saying why (a
  signature is changed by giving the new version a new name; see docs/rolling-deploys.md); a
  ``TypeError`` raised inside a handler stays an ordinary failure.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from django_durq.conf import get_settings
from django_durq.models import Job, Status
from tests.conftest import wait_until
from tests.ledger import checker, jobs
from tests.ledger.models import Effect

from .conftest import problems_in

pytestmark = [pytest.mark.processes, pytest.mark.one_leg]

OLD = {"DURQ_TEST_CODE": "old"}


def queued_as_old_code(name: str, kwargs: dict, *, max_attempts: int = 5) -> int:
    """A job the former release queued: its arguments are not checked against this release's handler."""
    now = int(time.time() * 1000)
    row = Job.objects.create(
        name=name,
        arguments=json.dumps({"args": [], "kwargs": kwargs}),
        max_attempts=max_attempts,
        run_at_ms=now,
        created_ms=now,
        lease_ms=get_settings().lease_ms,
    )
    return row.pk


def test_a_type_added_while_an_old_worker_runs_spends_no_attempt(faults):
    old = faults.spawn_ready("--queue", "default:1", env=OLD)
    added = [jobs.added_in_new.enqueue(tag=f"new-{i}") for i in range(3)]  # max_attempts=2
    # The old worker claims each, does not know its type, and hands it back.
    wait_until(
        lambda: all(row.errors != "[]" for row in Job.objects.filter(pk__in=[job.pk for job in added])),
        30,
        "the old worker to meet every job of the new type",
    )
    for row in Job.objects.filter(pk__in=[job.pk for job in added]):
        assert (row.status, row.attempts) == (Status.WAITING, 0), (row.status, row.attempts, row.errors)
    old.signal(signal.SIGTERM)
    assert old.wait(timeout=30) == 0, old.output()
    assert old.output().count("no handler is registered under this name in this worker") == 1  # once per type

    new = faults.spawn("--queue", "default:1")
    wait_until(lambda: not Job.objects.active().exists(), 30, "the new worker to run them")
    for row in Job.objects.filter(pk__in=[job.pk for job in added]):
        assert (row.status, row.attempts) == (Status.FINISHED, 1), (row.status, row.attempts, row.errors)
        # The hand-back is noted in the job's history, as not counted.
        assert {(entry["kind"], entry["counted"]) for entry in row.error_list} == {("unknown_job", False)}
    assert checker.check({job.pk for job in added}).exact
    assert problems_in(new.output()) == []


def test_arguments_that_no_longer_fit_the_handler_are_a_dead_letter_at_once(faults):
    stale = queued_as_old_code("tests.reshaped", {"size": 3})
    fresh = jobs.reshaped.enqueue(width=2, height=3)
    buggy = jobs.type_error_inside.enqueue(tag="bug")  # max_attempts=2
    worker = faults.spawn("--queue", "default:1")
    tried = [stale, buggy.pk]
    wait_until(
        lambda: all(row.attempts and row.status != Status.RUNNING for row in Job.objects.filter(pk__in=tried)),
        30,
        "both jobs to be tried",
    )

    row = Job.objects.get(pk=stale)
    assert (row.status, row.attempts) == (Status.DEAD, 1), (row.status, row.attempts, row.errors)
    [entry] = row.error_list
    assert entry["kind"] == "arguments"
    assert "do not fit" in entry["message"] and "'size'" in entry["message"], entry["message"]
    assert not Effect.objects.filter(job_id=stale).exists()  # the handler never ran
    wait_until(lambda: Job.objects.get(pk=fresh.pk).status == Status.FINISHED, 30, "the new-shape job")
    # A TypeError raised inside the handler is an ordinary failure: retried with backoff.
    bug = Job.objects.get(pk=buggy.pk)
    assert bug.status == Status.WAITING and [e["kind"] for e in bug.error_list] == ["exception"], bug.errors
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    assert "do not fit" in worker.output()


def test_old_and_new_workers_side_by_side_run_every_job_once(faults):
    """A rolling deploy in small: an old and a new worker, jobs of both releases, nothing burned."""
    old = faults.spawn_ready("--queue", "default:2", env=OLD)
    new = faults.spawn_ready("--queue", "default:2")
    added = jobs.added_in_new.enqueue_many([{"tag": "added"} for _ in range(20)])
    plain = jobs.effect.enqueue_many([{"tag": "plain"} for _ in range(20)])
    wait_until(lambda: not Job.objects.active().exists(), 60, "the drain")

    ids = {job.pk for job in [*added, *plain]}
    rows = Job.objects.filter(pk__in=ids)
    assert {row.attempts for row in rows} == {1}, sorted((row.name, row.attempts) for row in rows if row.attempts != 1)
    verdict = checker.check(ids)
    assert verdict.ok and not verdict.duplicated, verdict
    for process in (old, new):
        process.signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, process.output()
