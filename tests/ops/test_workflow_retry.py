"""A retry counts again every edge of every job it touches, in one transaction for a whole workflow, on every database."""

from __future__ import annotations

from typing import Any

import pytest

from django_durq import Workflow, ops
from django_durq.clock import ManualClock, use_clock
from django_durq.db import wakeup
from django_durq.models import Job
from django_durq.testing import drain
from tests.enqueue.test_workflow_races import START, claim_all, fix, row, run
from tests.ledger import jobs


@pytest.fixture
def clock():
    manual = ManualClock(start_ms=START)
    with use_clock(manual):
        yield manual


@pytest.mark.django_db
def test_a_retried_member_whose_upstream_failed_stays_cancelled_and_the_retry_says_why(clock):
    flow = Workflow("chain")
    first = flow.add(jobs.step.using(max_attempts=1), tag="first", fail=True)
    second = flow.add(jobs.step, tag="second", after=[first])
    flow.enqueue()
    drain(clock=clock)
    assert row(second.job.pk).cancelled_by == first.job.pk
    result = ops.retry([second.job.pk], now_ms=clock.now_ms())
    assert result.retried == []
    assert result.skipped == {
        second.job.pk: f"it stays cancelled: job {first.job.pk}, which it waits for, ended without finishing"
    }
    assert (row(second.job.pk).status, row(second.job.pk).attempts) == ("cancelled", 0)
    fix(first.job.pk, "first")
    assert ops.retry([first.job.pk, second.job.pk], now_ms=clock.now_ms()).retried == [first.job.pk, second.job.pk]
    drain(clock=clock)
    assert row(second.job.pk).status == "finished"


@pytest.mark.django_db
def test_a_run_anyway_callback_not_started_yet_waits_again_for_a_retried_member(clock):
    flow = Workflow("report", on_failure="run")
    a = flow.add(jobs.step.using(max_attempts=1), tag="a", fail=True)
    b = flow.add(jobs.step, tag="b")
    callback = flow.add(jobs.summary, after=[a, b])
    flow.enqueue()
    for job in claim_all(clock):
        run(job, clock)
    assert row(callback.job.pk).status == "waiting"  # released: a died, b finished
    fix(a.job.pk, "a")
    ops.retry([a.job.pk], now_ms=clock.now_ms())
    due = claim_all(clock)
    assert [job.id for job in due] == [a.job.pk], "the callback is due while a, retried, has not ended"
    assert (row(callback.job.pk).status, row(callback.job.pk).deps_left) == ("blocked", 1)
    run(due[0], clock)
    drain(clock=clock)
    assert row(callback.job.pk).result == '{"finished":2,"dead":0,"cancelled":0}'


@pytest.mark.django_db(transaction=True)
def test_retrying_the_failed_members_of_a_large_workflow_is_one_transaction(clock):
    """Issue #29: retry of failed members is one transaction, whatever the workflow's size (batches of 500 before)."""
    flow = Workflow("large")
    members = [flow.add(jobs.step.using(max_attempts=1), tag=f"m{n}", fail=True) for n in range(600)]
    flow.add(jobs.summary, after=members)
    flow.enqueue()
    Job.objects.filter(pk__in=[step.job.pk for step in members]).update(status="dead", finished_ms=clock.now_ms())
    ops.cancel_workflow(flow.row.pk, now_ms=clock.now_ms())  # the callback, cancelled with its workflow
    seen: list[dict[str, Any]] = []

    def idle_pool(named: bool) -> bool:
        # Woken when jobs of its queue commit due: what does a worker see of the workflow then?
        seen.append(ops.workflow(flow.row.pk).summary.counts)
        return False

    wakeup.subscribe("default", idle_pool)
    try:
        result = ops.retry_workflow(flow.row.pk, now_ms=clock.now_ms())
    finally:
        wakeup.unsubscribe("default", idle_pool)
    assert len(result.retried) == 601
    assert seen and all(counts == {"waiting": 600, "blocked": 1} for counts in seen), seen
