"""The cron duty survives ``kill -9`` of the worker running it: with the default settings another
worker takes it over within a few seconds, and every due time is still enqueued exactly once.

Real worker processes; every "within" below is the cap of a polling wait, never a timing claim.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from django_durq.clock import now_ms
from django_durq.db import presence
from tests.conftest import db_vendor, wait_until
from tests.schedules.helpers import scheduled_jobs

# The schedule of tests/ledger/jobs.py under DURQ_TEST_CRON=every-second; heartbeats at the
# default interval, which the duty's takeover used to wait on.
ENV = {"DURQ_TEST_CRON": "every-second", "DURQ_TEST_KEEP_FINISHED": "300", "DURQ_TEST_HEARTBEAT": "10"}
TAKEOVER_CAP_S = 12
LEADS = "this worker now runs the maintenance duties"
NO_LONGER = "this worker no longer runs the maintenance duties"


def duty_holder_pid(workers: dict) -> int | None:
    """The pid of the worker running the maintenance duties, or None while nobody holds them."""
    if db_vendor() == "sqlite":
        # The leader holds a flock on maintenance.lock; the kernel lists it with its pid.
        root = presence.directory("default")
        assert root is not None
        inode = os.stat(root / presence.LEADER_FILE).st_ino
        for line in Path("/proc/locks").read_text().splitlines():
            parts = line.split()
            if parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode):
                return int(parts[4])
        return None
    # A server's session lock names no process: each worker says when it takes the duties on.
    leaders = [pid for pid, worker in workers.items() if worker.output().count(LEADS) > worker.output().count(NO_LONGER)]
    return leaders[0] if len(leaders) == 1 else None


@pytest.mark.processes
@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="reads the holder of the leader lock from /proc/locks")
def test_killing_the_duty_holder_hands_cron_to_another_worker_within_seconds(spawn_worker):
    workers = {worker.pid: worker for worker in (spawn_worker("--queue", "default:2", env=ENV) for _ in range(2))}
    wait_until(lambda: len(scheduled_jobs()) >= 3, timeout=60, message="three scheduled runs")
    holder = wait_until(lambda: duty_holder_pid(workers), timeout=30, message="a duty holder")
    assert holder in workers, (holder, list(workers))

    workers[holder].signal(signal.SIGKILL)
    assert workers[holder].wait(timeout=30) == -signal.SIGKILL
    killed_ms = now_ms()
    # The survivor takes the duty over and enqueues what came due meanwhile, then keeps going.
    wait_until(lambda: scheduled_jobs()[-1] >= killed_ms + 1_000, timeout=TAKEOVER_CAP_S, message="a run due after the kill")
    survivor = next(worker for pid, worker in workers.items() if pid != holder)
    wait_until(lambda: scheduled_jobs()[-1] >= killed_ms + 5_000, timeout=30, message="runs five seconds after the kill")
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0, survivor.output()

    dues = scheduled_jobs()
    assert dues == list(range(dues[0], dues[-1] + 1, 1000)), "a due time was dropped or enqueued twice"


@pytest.mark.django_db
def test_the_duty_lease_is_held_by_one_worker_until_it_runs_out_or_is_handed_back():
    from django_durq.worker.maintenance import LEASE_TTL_MS, acquire_duty_lease, release_duty_lease

    start = 1_700_000_000_000
    assert acquire_duty_lease("default", "a", start, LEASE_TTL_MS)
    assert not acquire_duty_lease("default", "b", start + LEASE_TTL_MS, LEASE_TTL_MS)  # held to the end
    assert acquire_duty_lease("default", "b", start + LEASE_TTL_MS + 1, LEASE_TTL_MS)  # then taken over
    assert not acquire_duty_lease("default", "a", start + LEASE_TTL_MS + 2, LEASE_TTL_MS)
    release_duty_lease("default", "a")  # not the holder any more: changes nothing
    assert not acquire_duty_lease("default", "c", start + LEASE_TTL_MS + 3, LEASE_TTL_MS)
    release_duty_lease("default", "b")  # a graceful stop hands it over at once
    assert acquire_duty_lease("default", "c", start + LEASE_TTL_MS + 4, LEASE_TTL_MS)
