"""Workflow promises against real ``durq_worker`` processes: what an operator does to a workflow, no worker sees half-done.

The in-process versions of these races, made deterministic, are in tests/enqueue/test_workflow_races.py.
"""

from __future__ import annotations

import pytest

from django_durq import Workflow, ops
from django_durq.models import Job
from tests.conftest import wait_until
from tests.ledger import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.one_leg]

# Finished workflows are kept an hour: the suite's default deletes them, as a unit, once they end.
WORKER_ENV = {"DURQ_TEST_HEARTBEAT": "0.5", "DURQ_TEST_POLL": "0.2", "DURQ_TEST_KEEP_FINISHED": "3600"}


def test_workers_never_start_a_run_anyway_callback_of_a_workflow_being_cancelled(spawn_worker):
    """Issue #29, item 4: idle workers woken by each batch's commit claimed the callback it released."""
    flows = []
    for n in range(3):
        flow = Workflow(f"import {n}", on_failure="run")
        # Members wait in a queue no worker serves; the callbacks in the one the workers serve.
        members = [flow.add(jobs.step.using(queue="parked"), tag=f"{n}-{m}") for m in range(600)]
        flow.add(jobs.summary, after=members[:10])
        flow.enqueue()
        flows.append(flow)
    workers = [spawn_worker("--queue", "default:2", env=WORKER_ENV) for _ in range(2)]
    probe = jobs.noop.enqueue()
    wait_until(lambda: not Job.objects.filter(pk=probe.pk, status="waiting").exists(), 60, "the workers to start")
    for flow in flows:
        result = ops.cancel_workflow(flow.row.pk)
        assert len(result.cancelled) == 601 and result.stopping == []
    # A job queued after the cancels ran: the workers claimed after every commit of them.
    after = jobs.noop.enqueue()
    wait_until(lambda: not Job.objects.filter(pk=after.pk, status="waiting").exists(), 60, "a job queued after the cancels")
    callbacks = Job.objects.filter(workflow_id__in=[flow.row.pk for flow in flows], name="tests.summary")
    assert sorted(callbacks.values_list("status", "attempts")) == [("cancelled", 0)] * 3, workers[0].output()[-2000:]


def test_workers_never_start_a_member_before_its_upstream_while_enqueues_replace_it(spawn_worker, tmp_path):
    """Issue #29, item 2: a replace or reschedule wrote a due time, and that released the member."""
    workers = [spawn_worker("--queue", "default:4", env=WORKER_ENV) for _ in range(2)]
    probe = jobs.noop.enqueue()
    wait_until(lambda: not Job.objects.filter(pk=probe.pk, status="waiting").exists(), 60, "the workers to start")
    log = tmp_path / "runs.log"
    scans, members = [], []
    for n in range(4):
        flow = Workflow(f"debounced {n}")
        scans.append(flow.add(jobs.step, tag=f"scan-{n}", log=str(log), hold=1.0))
        members.append(flow.add(jobs.step.using(unique=f"member-{n}"), tag=f"member-{n}", log=str(log), after=[scans[-1]]))
        flow.enqueue()
    scan_ids = [scan.job.pk for scan in scans]
    wait_until(lambda: Job.objects.filter(pk__in=scan_ids, status="running").count() == 4, 60, "every scan to run")
    # While the scans run (a second each), enqueues with the members' keys change them.
    for n, mode in enumerate(["replace", "reschedule"] * 2):
        assert jobs.step.using(unique=f"member-{n}", on_duplicate=mode).enqueue(tag=f"member-{n}", log=str(log)).replaced
    ids = [member.job.pk for member in members] + scan_ids
    try:
        wait_until(lambda: Job.objects.filter(pk__in=ids, status="finished").count() == len(ids), 60, "every job to run")
    except AssertionError as error:
        rows = list(Job.objects.values_list("pk", "name", "status", "deps_left", "run_at_ms", "unique_key"))
        raise AssertionError(f"{error}: {rows}\n{workers[0].output()[-2000:]}") from None
    ended, started = {}, {}
    for line in log.read_text().splitlines():
        tag, _, _, start, end, *_ = line.split()
        kind, n = tag.split("-")
        if kind == "scan":
            ended[n] = int(end)
        else:
            started[n] = int(start)
    assert len(started) == len(ended) == 4
    early = {n: ended[n] - started[n] for n in started if started[n] < ended[n]}
    assert early == {}, f"members started this many ms before their upstream ended: {early}"
