"""Workflow retention reaches every ended workflow, however many older ones it must keep.

The sweep looks at a batch of workflows per run. Workflows it must keep (still running, waiting
for a later job's count, or kept for good by ``KEEP_DEAD = None``) must not take every place in
that batch run after run, or the workflows queued after them would never be deleted.
"""

from __future__ import annotations

import pytest

from django_durq import Workflow
from django_durq.clock import ManualClock, use_clock
from django_durq.conf import get_settings
from django_durq.models import Job
from django_durq.models import Workflow as WorkflowRow
from django_durq.worker.duties import WorkflowRetention
from tests.ledger import jobs

pytestmark = [pytest.mark.django_db]


def test_retention_is_not_starved_by_more_kept_workflows_than_a_batch(settings):
    settings.DURQ = {**settings.DURQ, "KEEP_FINISHED": 60}
    clock = ManualClock(1_800_000_000_000)
    retention = WorkflowRetention(get_settings())
    with use_clock(clock):
        for index in range(retention.batch_size + 1):
            flow = Workflow(f"long-{index}")
            flow.add(jobs.step, tag="waits")
            flow.enqueue()  # never run here: each stays in flight
        done = Workflow("done")
        done.add(jobs.step, tag="ran")
        done.enqueue()
    ended = WorkflowRow.objects.get(name="done").pk
    Job.objects.filter(workflow_id=ended).update(status="finished", finished_ms=clock.now_ms())
    clock.advance(3_600_000)
    deleted = [retention.run_once(clock.now_ms())["workflows"] for _ in range(3)]
    assert not WorkflowRow.objects.filter(pk=ended).exists(), f"deleted per run: {deleted}"
    assert WorkflowRow.objects.count() == retention.batch_size + 1
