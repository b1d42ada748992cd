"""Operating workflows (``ops.workflows``): listing with states, one workflow's jobs and edges, cancel and retry."""

from __future__ import annotations

import pytest

from django_durq import Workflow, ops
from django_durq.clock import ManualClock, use_clock
from django_durq.db.store import Store
from django_durq.models import Job
from django_durq.testing import drain
from tests.ledger import jobs

pytestmark = pytest.mark.django_db

START = 1_800_000_000_000


@pytest.fixture
def clock():
    manual = ManualClock(start_ms=START)
    with use_clock(manual):
        yield manual


def media(name: str = "video 42", *, fail_scan: bool = False, on_failure: str = "cancel") -> tuple[Workflow, dict]:
    """upload → scan → 3 transcodes → publish, as steps by name."""
    flow = Workflow(name, on_failure=on_failure)  # type: ignore[arg-type]
    upload = flow.add(jobs.step, tag="upload")
    scan = flow.add(jobs.step, tag="scan", fail=fail_scan, after=[upload])
    encodes = [flow.add(jobs.step, tag=p, after=[scan]) for p in ("1080p", "720p", "480p")]
    publish = flow.add(jobs.summary, after=encodes)
    flow.enqueue()
    return flow, {"upload": upload, "scan": scan, "encodes": encodes, "publish": publish}


def statuses(flow: Workflow) -> dict[str, int]:
    return ops.workflow(flow.row.pk).summary.counts


def test_workflows_are_listed_newest_first_with_counts_and_state(clock):
    done, _ = media("done")
    drain(clock=clock)
    failed, _ = media("failed", fail_scan=True)
    drain(clock=clock)
    running, _ = media("running")
    listed = ops.workflows()
    assert [(w.name, w.state, w.total) for w in listed] == [
        ("running", "running", 6),
        ("failed", "failed", 6),
        ("done", "finished", 6),
    ]
    assert listed[1].counts == {"finished": 1, "dead": 1, "cancelled": 4}
    assert listed[2].last_ended_ms == START and listed[0].last_ended_ms is None
    assert ops.workflows(limit=1)[0].id == running.row.pk
    data = listed[1].as_dict()
    assert data["state"] == "failed" and data["counts"]["waiting"] == 0 and data["jobs"] == 6
    assert done.row.pk < failed.row.pk < running.row.pk


def test_one_workflow_shows_its_jobs_edges_and_the_jobs_it_waits_for_outside(clock):
    earlier = jobs.step.enqueue(tag="earlier")
    flow = Workflow("after an earlier job")
    first = flow.add(jobs.step, tag="a", after=[earlier])
    second = flow.add(jobs.step, tag="b", after=[first])
    flow.enqueue()
    detail = ops.workflow(flow.row.pk)
    assert [job.pk for job in detail.jobs] == [first.job.pk, second.job.pk]
    assert [job.pk for job in detail.external] == [earlier.pk]
    assert [(e.job_id, e.depends_on_id, e.settled) for e in detail.edges] == [
        (first.job.pk, earlier.pk, False),
        (second.job.pk, first.job.pk, False),
    ]
    assert detail.upstream(second.job.pk) == [first.job.pk] and detail.downstream(first.job.pk) == [second.job.pk]
    assert detail.summary.state == "running" and detail.summary.counts == {"blocked": 2}


def test_bad_ids_and_limits_are_refused_with_a_clear_error():
    with pytest.raises(ops.NoSuchWorkflow, match="no workflow 424242: it never existed"):
        ops.workflow(424242)
    with pytest.raises(ops.NoSuchWorkflow):
        ops.cancel_workflow(0)
    with pytest.raises(TypeError, match="a workflow id is a whole number, not str"):
        ops.retry_workflow("7")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit is 0"):
        ops.workflows(limit=0)


def test_cancel_cancels_every_waiting_member_and_asks_running_ones_to_stop(clock):
    flow, _ = media(on_failure="run")
    (upload_job,) = Store("default").claim("default", 1, clock.now_ms(), "w1")  # the upload is running
    result = ops.cancel_workflow(flow.row.pk, now_ms=clock.now_ms())
    assert result.stopping == [upload_job.id]
    assert len(result.cancelled) == 5
    # Cancelled together: no member waiting "to run anyway" was released by another's cancel.
    assert statuses(flow) == {"running": 1, "cancelled": 5}
    assert Job.objects.get(pk=upload_job.id).stop_requested
    assert ops.workflow(flow.row.pk).summary.state == "running"
    assert ops.cancel_workflow(flow.row.pk).cancelled == []


def test_retry_brings_back_a_failed_workflow_through_the_job_that_failed(clock):
    flow, steps = media(fail_scan=True)
    drain(clock=clock)
    assert statuses(flow) == {"finished": 1, "dead": 1, "cancelled": 4}
    Job.objects.filter(pk=steps["scan"].job.pk).update(arguments='{"args": [], "kwargs": {"tag": "scan"}}')
    result = ops.retry_workflow(flow.row.pk, now_ms=clock.now_ms())
    assert result.retried == [steps["scan"].job.pk] and result.skipped == {}
    publish = Job.objects.get(pk=steps["publish"].job.pk)
    assert (publish.status, publish.deps_left) == ("blocked", 3)
    drain(clock=clock)
    assert statuses(flow) == {"finished": 6}
    assert Job.objects.get(pk=steps["publish"].job.pk).result == '{"finished":3,"dead":0,"cancelled":0}'


def test_retry_after_a_cancel_resumes_the_workflow_in_its_order(clock):
    flow, steps = media()
    ops.cancel_workflow(flow.row.pk, now_ms=clock.now_ms())
    result = ops.retry_workflow(flow.row.pk, now_ms=clock.now_ms())
    assert len(result.retried) == 6
    # Only the upload is due: every other member waits again for what it waited for.
    due = Store("default").claim("default", 100, clock.now_ms(), "w1")
    assert [job.id for job in due] == [steps["upload"].job.pk]
    assert Job.objects.get(pk=steps["publish"].job.pk).deps_left == 3
    for job in due:
        Job.objects.filter(pk=job.id).update(status="waiting", attempts=0)  # hand it back
    drain(clock=clock)
    assert statuses(flow) == {"finished": 6}


def test_retry_of_a_workflow_retries_the_earlier_job_outside_it_that_failed(clock):
    earlier = jobs.step.using(max_attempts=1).enqueue(tag="earlier", fail=True)
    drain(clock=clock)
    flow = Workflow("after a failed job")
    later = flow.add(jobs.step, tag="later", after=[earlier])
    flow.enqueue()
    assert Job.objects.get(pk=later.job.pk).cancelled_by == earlier.pk
    assert ops.workflow(flow.row.pk).summary.state == "cancelled"
    Job.objects.filter(pk=earlier.pk).update(arguments='{"args": [], "kwargs": {"tag": "earlier"}}')
    assert ops.retry_workflow(flow.row.pk, now_ms=clock.now_ms()).retried == [earlier.pk]
    drain(clock=clock)
    assert Job.objects.get(pk=later.job.pk).status == "finished"


def test_a_member_whose_failed_upstream_is_gone_is_reported_as_left_cancelled(clock):
    flow, steps = media(fail_scan=True)
    drain(clock=clock)
    ops.purge([steps["scan"].job.pk])
    result = ops.retry_workflow(flow.row.pk, now_ms=clock.now_ms())
    assert result.retried == []
    assert result.skipped[steps["encodes"][0].job.pk] == (
        f"it stays cancelled: job {steps['scan'].job.pk}, which it waited for, was not retried"
    )
