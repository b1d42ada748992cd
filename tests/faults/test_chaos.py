"""Timing chaos: real workers stalled at random at every race point, and the invariants still hold.

Workers run with ``DURQ_TEST_CHAOS`` (see ``django_durq.conf.hooks.jitter``): at the claim, the
renewal, the dispatcher, the completion, the hand-back, the bury, the timeout reap, the outcome
and each signal receiver, a thread sleeps up to 150 ms three times in ten, and every job_dead and
job_finished receiver takes 50 ms more. No worker is killed or frozen, so:

- no job runs twice, and no two executions of one job overlap;
- every cancel sticks: a cancelled job never starts again after the cancel;
- no job stays ``running`` past its lease + the poll interval + 1 s;
- every acknowledged job reaches a terminal state.

A short run is part of the suite; ``benchmarks/soak.py --tests`` runs a long one.
"""

from __future__ import annotations

import itertools
import random
import time

import pytest

from django_durq import ops
from django_durq.clock import now_ms
from django_durq.models import Job
from tests.conftest import wait_until
from tests.ledger import checker, jobs
from tests.ledger.models import Effect

from .conftest import POLL_S, one_leg, size

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

CHAOS_ENV = {"DURQ_TEST_CHAOS": "150:0.3", "DURQ_TEST_SLOW_RECEIVERS": "0.05"}


@one_leg
def test_timing_chaos_breaks_no_invariant(faults):
    rng = random.Random(20261201)
    count = size(150, 2_000)
    workers = [faults.spawn_ready("--queue", "default:3", env=CHAOS_ENV) for _ in range(3)]
    specs = [{"sleep": rng.choice([0.0, 0.0, 0.02, 0.3, 1.0]), "fail_first": rng.random() < 0.1} for _ in range(count)]
    acked = [queued.pk for queued in jobs.span.enqueue_many(specs)]

    time.sleep(1.0)
    targets = rng.sample(acked, k=count // 10)
    cancelled_at = now_ms()
    ops.cancel(targets)

    zombies: set[int] = set()

    def drained() -> bool:
        horizon = now_ms() - round((POLL_S + 1.0) * 1000)
        zombies.update(Job.objects.running().filter(lease_expires_ms__lt=horizon).values_list("pk", flat=True))
        return not Job.objects.filter(pk__in=acked).active().exists()

    wait_until(drained, size(120, 900), "every job to reach a terminal state", interval=0.5)
    outputs = "\n".join(worker.output()[-3000:] for worker in workers)
    assert not zombies, f"running past lease + poll + 1 s: {sorted(zombies)}"

    verdict = checker.check(acked, needs_effect=False)
    assert verdict.ok and not verdict.duplicated, f"{verdict}\n{outputs}"
    spans: dict[int, list[tuple[int, int]]] = {}
    for job_id, started, tag in Effect.objects.filter(job_id__in=acked).values_list("job_id", "started_ms", "tag"):
        spans.setdefault(job_id, []).append((started, int(tag.split(":")[1])))
    for job_id, intervals in spans.items():
        intervals.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(intervals)), job_id

    finished = set(Job.objects.filter(pk__in=acked, status="finished").values_list("pk", flat=True))
    assert finished <= set(spans), "a finished job without its execution"
    for job_id in targets:
        assert Job.objects.get(pk=job_id).status in ("cancelled", "finished", "dead")
    started_late = [job_id for job_id in targets if any(started > cancelled_at for started, _ in spans.get(job_id, []))]
    assert not started_late, f"cancelled jobs started after the cancel: {started_late}"
