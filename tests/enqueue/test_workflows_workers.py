"""Workflows across real worker processes killed with SIGKILL at random: every fan-in callback is
queued once and finishes, nothing starts before what it waits for has finished, nothing is stuck.

Each step appends a line per run that got as far as logging (see ``tests.ledger.jobs.step``):
tag, job id, attempt, start and end (epoch ms), pid. A worker killed mid-run leaves its job to
be run again once its lease expires (at-least-once), so a step may log more than once; its
dependents must start after the run that finished it.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from django_durq import Workflow
from django_durq.models import Dependency, Job
from tests.conftest import wait_until
from tests.ledger import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

HEAVY = os.environ.get("DURQ_TEST_HEAVY") == "1"
WORKFLOWS = 40 if HEAVY else 12
KILLS = 60 if HEAVY else 8
WORKERS = 3
MAX_ATTEMPTS = 50
# Short leases, renewed often: a killed worker's jobs run again within seconds. Every kill can
# cost the jobs it lands on an attempt, and at the heavy size a step is hit five times in about
# one run in four (measured: attempts 1-5 seen 150/35/10/2/1 times in 200 jobs), so steps get
# attempts enough that only a lost or repeated outcome, never the attempt budget, fails the test. Finished
# workflows are kept an hour (the suite's default deletes them, as a unit, once they end).
# Threads stall up to 100 ms where they meet (DURQ_TEST_CHAOS), between a commit and its count too.
WORKER_ENV = {
    "DURQ_TEST_HEARTBEAT": "0.5",
    "DURQ_TEST_POLL": "0.2",
    "DURQ_TEST_KEEP_FINISHED": "3600",
    "DURQ_TEST_CHAOS": "100:0.2",
}


def build(n: int, log: Path) -> Workflow:
    """upload → scan → three transcodes in parallel → publish (a fan-in of three)."""
    step = jobs.step.using(lease=2, max_attempts=MAX_ATTEMPTS)
    flow = Workflow(f"video {n}")
    scan = flow.add(step, tag=f"w{n}-scan", log=str(log), hold=random.uniform(0.1, 0.5))
    encodes = [
        flow.add(step, tag=f"w{n}-{p}", log=str(log), hold=random.uniform(0.2, 0.6), after=[scan])
        for p in ("1080p", "720p", "480p")
    ]
    flow.add(jobs.summary.using(lease=2, max_attempts=MAX_ATTEMPTS), log=str(log), after=encodes)
    return flow


def test_killed_workers_never_lose_or_repeat_a_callback_nor_start_a_step_early(spawn_worker, tmp_path):
    log = tmp_path / "runs.log"
    flows = [build(n, log) for n in range(WORKFLOWS)]
    for flow in flows:
        flow.enqueue()
    ids = [flow.row.pk for flow in flows]
    workers = [spawn_worker("--queue", "default:3", env=WORKER_ENV) for _ in range(WORKERS)]
    # The kills start once steps run: on a loaded machine the first workers may still be starting.
    wait_until(lambda: Job.objects.filter(workflow_id__in=ids, status="running").exists(), 60, "a step to run")
    rng = random.Random(os.getpid())
    for _ in range(KILLS):
        time.sleep(rng.uniform(0.3, 0.8))
        victim = workers.pop(rng.randrange(len(workers)))
        os.killpg(victim.pid, signal.SIGKILL)
        victim.popen.wait()
        workers.append(spawn_worker("--queue", "default:3", env=WORKER_ENV))

    members = Job.objects.filter(workflow_id__in=ids)
    assert members.count() == 5 * WORKFLOWS

    def done() -> bool:
        return not members.active().exists()

    try:
        wait_until(done, 240, "every workflow to end")
    except AssertionError as error:
        stuck = list(members.active().values("pk", "name", "status", "deps_left"))
        raise AssertionError(f"{error}: {stuck}\n{workers[-1].output()[-3000:]}") from None

    rows = {row.pk: row for row in members}
    assert len(rows) == 5 * WORKFLOWS
    unfinished = [(row.pk, row.name, row.status, row.attempts, row.errors) for row in rows.values() if row.status != "finished"]
    assert not unfinished, f"a step died or was cancelled: {unfinished}"
    assert any(row.attempts > 1 for row in rows.values()), "no kill landed on a running job: the test proved nothing"
    callbacks = [row for row in rows.values() if row.name == "tests.summary"]
    assert len(callbacks) == WORKFLOWS and all(row.result == '{"finished":3,"dead":0,"cancelled":0}' for row in callbacks)
    assert not Dependency.objects.filter(settled=False).exists()
    # Nothing started before every job it waited for had finished: its finishing run ended first.
    runs: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # job id -> (attempt, start, end)
    for line in log.read_text().splitlines():
        parts = line.split()
        if parts[0] == "summary":
            continue
        runs[int(parts[1])].append((int(parts[2]), int(parts[3]), int(parts[4])))
    finished_at = {}
    for job_id, row in rows.items():
        if row.name == "tests.step":
            final = [end for attempt, _, end in runs[job_id] if attempt == row.attempts]
            assert final, f"job {job_id} finished on attempt {row.attempts}, which never logged"
            finished_at[job_id] = final[0]
    for edge in Dependency.objects.filter(job_id__in=rows):
        dependent = rows[edge.job_id]
        if dependent.name == "tests.step":
            first_start = min(start for _, start, _ in runs[edge.job_id])
            assert first_start >= finished_at[edge.depends_on_id], f"job {edge.job_id} started before {edge.depends_on_id} ended"
        else:  # the callback logs no start; its row has its last claim's time (the database's clock, to a ms or two)
            assert dependent.started_ms >= finished_at[edge.depends_on_id] - 2, f"callback {edge.job_id} started early"
