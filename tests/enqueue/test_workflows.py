"""Workflows in one process, on every database, with a manual clock: chains, fan-out/fan-in, failure, retry.

Real workers killed at random while they run a workflow are in tests/enqueue/test_workflows_workers.py.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from django_durq import Workflow, WorkflowError, ops
from django_durq.conf import get_settings
from django_durq.db import dialect_for
from django_durq.db.dependencies import settle
from django_durq.models import Dependency, Job
from django_durq.testing import drain
from django_durq.worker.duties import SettleDuty, WorkflowRetention
from tests.enqueue.helpers import START, claim_all, run
from tests.ledger import jobs

pytestmark = pytest.mark.django_db


def status(step) -> str:
    return Job.objects.get(pk=step.job.pk).status


def test_a_chain_runs_in_order_and_passes_results_along(clock):
    flow = Workflow("chain")
    first, second, third = flow.chain((jobs.step, {"tag": "a"}), (jobs.step, {"tag": "b"}), (jobs.step, {"tag": "c"}))
    flow.enqueue()
    assert [Job.objects.get(pk=s.job.pk).state for s in (second, third)] == ["blocked (waiting for 1 upstream)"] * 2
    assert [Job.objects.get(pk=s.job.pk).run_at_ms for s in (second, third)] == [START, START]  # their own due time
    assert drain(clock=clock)["finished"] == 3
    rows = {row.pk: row for row in Job.objects.filter(workflow_id=flow.row.pk)}
    assert [rows[s.job.pk].status for s in (first, second, third)] == ["finished"] * 3
    assert rows[first.job.pk].started_ms <= rows[second.job.pk].started_ms <= rows[third.job.pk].started_ms
    assert rows[third.job.pk].result == '"c"'
    assert not Dependency.objects.filter(settled=False).exists()


def test_nothing_waiting_starts_before_what_it_waits_for_has_ended(clock):
    flow = Workflow("fan")
    scan = flow.add(jobs.step, tag="scan")
    encodes = [flow.add(jobs.step, tag=f"encode-{p}", after=[scan]) for p in ("1080p", "720p", "480p")]
    publish = flow.add(jobs.summary, after=encodes)
    flow.enqueue()
    (claimed,) = claim_all(clock)  # only the scan is due
    assert claimed.id == scan.job.pk and claim_all(clock) == []
    run(claimed, clock)
    claimed = claim_all(clock)
    assert sorted(job.id for job in claimed) == sorted(step.job.pk for step in encodes)
    for job in claimed[:2]:
        run(job, clock)
    assert claim_all(clock) == []  # one encode still runs
    run(claimed[2], clock)
    (last,) = claim_all(clock)
    assert last.id == publish.job.pk
    run(last, clock)
    assert Job.objects.get(pk=publish.job.pk).result == '{"finished":3,"dead":0,"cancelled":0}'


def test_a_fan_in_callback_is_queued_once_with_how_every_member_ended(clock):
    flow = Workflow("import", on_failure="run")
    members = [flow.add(jobs.step, tag=f"chunk-{n}", fail=n == 3) for n in range(10)]
    callback = flow.add(jobs.summary, after=members)
    flow.enqueue()
    drain(clock=clock)
    row = Job.objects.get(pk=callback.job.pk)
    assert (row.status, row.attempts, row.result) == ("finished", 1, '{"finished":9,"dead":1,"cancelled":0}')


def test_an_empty_group_fires_at_once(clock):
    flow = Workflow("empty")
    callback = flow.add(jobs.summary, after=[])
    flow.enqueue()
    assert Job.objects.get(pk=callback.job.pk).run_at_ms == START
    assert drain(clock=clock)["finished"] == 1


def test_a_failed_job_cancels_what_waits_for_it_down_the_graph_and_a_retry_brings_it_back(clock):
    flow = Workflow("media")
    scan = flow.add(jobs.step, tag="scan", fail=True)
    encode = flow.add(jobs.step, tag="encode", after=[scan])
    publish = flow.add(jobs.step, tag="publish", after=[encode])
    flow.enqueue()
    drain(clock=clock)
    assert [status(s) for s in (scan, encode, publish)] == ["dead", "cancelled", "cancelled"]
    assert Job.objects.get(pk=encode.job.pk).cancelled_by == scan.job.pk
    assert Job.objects.get(pk=publish.job.pk).last_error["kind"] == "dependency"
    # The operator fixes the cause and retries the dead job: the workflow resumes.
    Job.objects.filter(pk=scan.job.pk).update(arguments='{"args": [], "kwargs": {"tag": "scan"}}')
    assert ops.retry([scan.job.pk], now_ms=clock.now_ms()).retried == [scan.job.pk]
    assert [status(s) for s in (encode, publish)] == ["blocked", "blocked"]
    assert drain(clock=clock)["finished"] == 3
    assert [status(s) for s in (scan, encode, publish)] == ["finished"] * 3


def test_cancelling_a_waiting_member_cancels_its_dependents_at_once(clock):
    flow = Workflow("cancel me")
    first = flow.add(jobs.step, tag="a", hold=0)
    second = flow.add(jobs.step, tag="b", after=[first])
    flow.enqueue()
    ops.cancel([first.job.pk], now_ms=clock.now_ms())
    assert [status(s) for s in (first, second)] == ["cancelled", "cancelled"]


def test_a_whole_workflow_commits_or_rolls_back_as_one(clock):
    flow = Workflow("all or nothing")
    flow.add(jobs.step, tag="a")
    with pytest.raises(RuntimeError), transaction.atomic():
        flow.enqueue()
        raise RuntimeError("the view failed")
    assert not Job.objects.exists() and not Dependency.objects.exists()


def test_a_dependency_on_a_job_that_does_not_exist_is_refused_and_queues_nothing(clock):
    flow = Workflow("dangling")
    flow.add(jobs.step, tag="a")
    flow.add(jobs.step, tag="b", after=[987654])
    with pytest.raises(WorkflowError, match=r"\[987654\] that do not exist"):
        flow.enqueue()
    assert not Job.objects.exists()


def test_a_job_may_wait_for_jobs_queued_before(clock):
    earlier = jobs.step.enqueue(tag="earlier")
    flow = Workflow("after an existing job")
    later = flow.add(jobs.step, tag="later", after=[earlier])
    flow.enqueue()
    assert Job.objects.get(pk=earlier.pk).dependents == 1
    assert drain(clock=clock)["finished"] == 2
    assert Job.objects.get(pk=later.job.pk).status == "finished"
    assert Job.objects.get(pk=earlier.pk).status == "finished"  # kept for its dependents


def test_a_member_deduplicated_onto_an_existing_job_is_waited_for_as_that_job(clock):
    holder = jobs.step.using(unique="scan:42").enqueue(tag="holder")
    flow = Workflow("deduplicated")
    with pytest.raises(WorkflowError, match="dedupe key"):
        flow.add(jobs.step.using(unique="scan:42"), tag="member")
        flow.enqueue()
    assert Job.objects.get(pk=holder.pk).status == "waiting"


def test_an_end_the_worker_did_not_count_is_counted_once_by_the_sweep(clock):
    flow = Workflow("crash between commit and count")
    first = flow.add(jobs.step, tag="a")
    second = flow.add(jobs.step, tag="b", after=[first])
    flow.enqueue()
    # The first job ends, and its worker dies before it counts the end for its dependent.
    Job.objects.filter(pk=first.job.pk).update(status="finished", finished_ms=clock.now_ms())
    assert Job.objects.get(pk=second.job.pk).status == "blocked"
    assert SettleDuty(get_settings()).run_once(clock.now_ms()) == {"edges": 1, "released": 1, "cancelled": 0}
    assert SettleDuty(get_settings()).run_once(clock.now_ms()) == {"edges": 0, "released": 0, "cancelled": 0}
    assert settle(dialect_for(connection), clock.now_ms(), [first.job.pk]).edges == 0  # never counted twice
    row = Job.objects.get(pk=second.job.pk)
    assert (row.status, row.deps_left, row.run_at_ms) == ("waiting", 0, clock.now_ms())


def test_a_workflow_is_pruned_as_a_unit_once_all_of_it_ended(clock, settings):
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 60}
    flow = Workflow("prune")
    first = flow.add(jobs.step, tag="a")
    flow.add(jobs.step, tag="b", after=[first], hold=0)
    flow.enqueue()
    retention = WorkflowRetention(get_settings())
    drain(queue="default", clock=clock, max_jobs=1)
    clock.advance(3_600_000)
    assert retention.run_once(clock.now_ms()) == {"workflows": 0}  # the second job still waits to run
    drain(clock=clock)
    assert retention.run_once(clock.now_ms()) == {"workflows": 0}  # ended less than a minute ago
    clock.advance(61_000)
    assert retention.run_once(clock.now_ms()) == {"workflows": 1}
    assert not Job.objects.exists() and not Dependency.objects.exists()


def test_bad_workflows_are_refused_where_they_are_built():
    with pytest.raises(ValueError, match="1 to 200 characters"):
        Workflow("")
    with pytest.raises(ValueError, match="on_failure is 'ignore'"):
        Workflow("x", on_failure="ignore")  # type: ignore[arg-type]
    flow, other = Workflow("x"), Workflow("y")
    step = other.add(jobs.step, tag="a")
    with pytest.raises(WorkflowError, match="belongs to another workflow"):
        flow.add(jobs.step, tag="b", after=[step])
    with pytest.raises(TypeError, match="tag"):
        flow.add(jobs.step, colour="red")
    with pytest.raises(TypeError, match="after= takes steps, jobs or job ids"):
        flow.add(jobs.step, tag="c", after=["a"])


def three_in_a_row(clock) -> list[int]:
    flow = Workflow("cancelled, then retried")
    first, second, third = flow.chain((jobs.step, {"tag": "a"}), (jobs.step, {"tag": "b"}), (jobs.step, {"tag": "c"}))
    flow.enqueue()
    return [s.job.pk for s in (first, second, third)]


def test_a_retried_member_waits_again_for_what_has_not_ended(clock):
    first, second, third = three_in_a_row(clock)
    ops.cancel([second], now_ms=clock.now_ms())
    assert Job.objects.get(pk=third).cancelled_by == second
    assert ops.retry([second], now_ms=clock.now_ms()).retried == [second]
    assert [job.id for job in claim_all(clock)] == [first]  # the second still waits for the first
    assert [Job.objects.get(pk=i).deps_left for i in (second, third)] == [1, 1]


def test_members_retried_together_wait_for_each_other_again(clock):
    ids = three_in_a_row(clock)
    ops.cancel(ids, now_ms=clock.now_ms())
    assert ops.retry(ids, now_ms=clock.now_ms()).retried == ids
    assert [job.id for job in claim_all(clock)] == ids[:1]
    assert [Job.objects.get(pk=i).deps_left for i in ids[1:]] == [1, 1]
    assert Job.objects.get(pk=ids[2]).status == "blocked"
