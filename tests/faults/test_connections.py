"""Lost connections and the connection budget on the servers (T23-lite, T24, T25, T04 on PostgreSQL).

``pg_terminate_backend`` and MariaDB's ``KILL`` stand in for a server restart, a failover or a
firewall that drops idle connections. The full restart of T23 (``pg_ctl restart`` mid-drain,
repeated) runs against a throwaway cluster in ``benchmarks/soak.py --pg-restart``.
"""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection

from django_durq.models import Job
from tests.conftest import wait_until
from tests.ledger import checker, jobs
from tests.ledger.models import Effect

from .conftest import cut_connections, one_leg, only_on, problems_in, server_connections, size

pytestmark = [pytest.mark.processes, only_on("postgres", "mysql")]


@pytest.mark.parametrize("finished", ["kept", "deleted"])
def test_t23_connections_cut_twice_mid_drain(faults, finished):
    total = size(300, 10_000)
    queued = jobs.effect.enqueue_many([{"tag": "drain", "sleep": 0.01} for _ in range(total)])
    env = {"DURQ_TEST_KEEP_FINISHED": ""} if finished == "deleted" else {}  # deleted: the default, batched
    workers = [faults.spawn("--queue", "default:4", env=env) for _ in range(2)]
    for fraction in (0.3, 0.6):
        wait_until(lambda f=fraction: Effect.objects.count() >= f * total, 120, f"{fraction:.0%} progress")
        assert cut_connections() >= 2
        cut_at = Effect.objects.count()
        # New claims resume well inside the catalogue's 10 s.
        wait_until(lambda c=cut_at: Effect.objects.count() > c + 10, 10, "claims to resume after the cut")
    wait_until(lambda: not Job.objects.active().exists(), 180, "the drain")

    verdict = checker.check({row.pk for row in queued}, history_deleted=finished == "deleted")
    assert verdict.ok, verdict
    # A duplicate needs a job in flight at a cut: at most 8 slots, twice.
    assert len(verdict.duplicated) <= 2 * 8, verdict
    for worker in workers:
        assert worker.popen.poll() is None, worker.output()
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        assert problems_in(worker.output()) == []


def test_t24_idle_connections_dropped_then_work_arrives(faults):
    workers = [faults.spawn_ready("--queue", "default:2") for _ in range(2)]
    # Warm every slot: each slot thread opens its own connection and keeps it between jobs.
    jobs.effect.enqueue_many([{"tag": "warm-up", "sleep": 0.3} for _ in range(8)])
    wait_until(lambda: not Job.objects.active().exists(), 30, "the warm-up jobs")
    Job.objects.all().delete()
    Effect.objects.all().delete()
    time.sleep(1.0)
    assert cut_connections() >= 2
    queued = jobs.effect.enqueue_many([{"tag": "after-cut"} for _ in range(10)])
    wait_until(lambda: Effect.objects.count() == 10, 20, "the ten jobs")
    wait_until(lambda: not Job.objects.active().exists(), 10, "completion")

    verdict = checker.check({row.pk for row in queued})
    assert verdict.exact, verdict
    # No handler saw the dead connection: every job succeeded on its first attempt.
    assert set(Job.objects.values_list("attempts", "errors")) == {(1, "[]")}
    for worker in workers:
        assert worker.popen.poll() is None, worker.output()
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        assert problems_in(worker.output()) == []


@one_leg
@only_on("postgres")
@pytest.mark.own_sessions  # counts the worker's own backends, which a pooler keeps for others
def test_t25_connection_budget_and_no_leftover_backends(faults):
    # One worker with three pools: slots 4 + 2 + 1.
    worker = faults.spawn("--queue", "default:4", "--queue", "fast:2", "--queue", "slow:1")
    # A connection per slot and per pool dispatcher; monitor, lease keeper, maintenance, events, watcher.
    budget = (4 + 2 + 1) + 3 + 5
    jobs.effect.enqueue_many([{"tag": "budget"} for _ in range(size(150, 1000))])
    jobs.effect_fast.enqueue_many([{"tag": "budget"} for _ in range(size(60, 500))])
    jobs.slow.enqueue_many([{"seconds": 0, "tag": "budget"} for _ in range(size(40, 250))])
    peak = 0
    deadline = time.monotonic() + 120
    while Job.objects.active().exists():
        assert time.monotonic() < deadline, "drain"
        peak = max(peak, len(server_connections()))
        time.sleep(0.05)
    assert 0 < peak <= budget, (peak, budget)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    wait_until(lambda: not server_connections(), 5, "every worker backend to close")
    output = worker.output()
    for symptom in ("lost synchronization", "SSL error", "message contents do not agree"):
        assert symptom not in output


@one_leg
@only_on("postgres")
def test_t04_no_transaction_is_held_across_a_handler(faults):
    # Handlers that sleep 3 s on 4 slots; a transaction held across one would be idle in
    # transaction for seconds. Brief moments inside the queue's own statements are not counted.
    jobs.effect.enqueue_many([{"tag": "held", "sleep": 3.0} for _ in range(4)])
    workers = [faults.spawn("--queue", "default:2") for _ in range(2)]
    wait_until(lambda: Job.objects.running().count() == 4, 60, "four sleeping handlers")
    samples = []
    while Job.objects.active().exists():
        samples.append(idle_in_transaction())
        time.sleep(0.1)
    assert len(samples) > 10 and max(samples) == 0, samples
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0


def idle_in_transaction() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND state LIKE 'idle in transaction%%' AND state_change < clock_timestamp() - interval '1 second'"
        )
        return int(cursor.fetchone()[0])
