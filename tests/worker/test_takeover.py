"""The maintenance leader's look for ended workers, in this process against the real database.

Its cost while no worker ends (no table read, no write: SQLite's lock stays free), and what a
takeover writes: a failed attempt named ``worker lost``, the job due at once; a dead letter on a
last attempt; a cancel that stays final. The real-process proof is tests/faults/test_orphans.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_durq.clock import ManualClock
from django_durq.conf import get_settings
from django_durq.db import presence, session_presence
from django_durq.db.session_locks import session_locks
from django_durq.models import Job, WorkerProcess
from django_durq.worker.maintenance import StaleWorkers
from django_durq.worker.runtime import Runtime
from tests.conftest import db_vendor
from tests.ops.test_ops import NOW, ended_worker, make_job

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def live_worker(worker_id: str) -> Iterator[str]:
    """A worker's row and its presence lock, held by this process as a live worker holds it."""
    WorkerProcess.objects.create(
        worker_id=worker_id, host="here", pid=1, queues='{"default": 1}', started_ms=NOW, last_seen_ms=NOW, holds_lock=True
    )
    if db_vendor() == "sqlite":
        held = presence.Presence.announce("default", worker_id)
        assert held is not None
        try:
            yield worker_id
        finally:
            held.withdraw()
        return
    locks = session_locks("default")
    assert locks is not None
    session = locks.connect(session_presence.SESSION_IDLE_S)
    try:
        assert locks.take(session, worker_id, 2)
        yield worker_id
    finally:
        session.close()


def duty() -> StaleWorkers:
    runtime = Runtime(settings=get_settings(), clock=ManualClock(NOW), worker_id="leader:1:000000")
    return StaleWorkers(runtime)


def test_while_no_worker_ends_the_look_reads_no_table_and_writes_nothing():
    with live_worker("live:1:aaaaaa") as worker_id:
        make_job("running", claimed_by=worker_id, lease_expires_ms=NOW + 30_000)
        stale = duty()
        stale.run_once(NOW)  # reads the rows, and sweeps lock files that killed workers left
        with CaptureQueriesContext(connection) as queries:
            for second in range(1, 4):
                assert stale.run_once(NOW + 1_000 * second) == {"removed": 0, "taken_over": 0, "ended": 0}
    statements = [query["sql"] for query in queries.captured_queries]
    assert not [sql for sql in statements if "durq_" in sql], statements  # no table of the queue
    if db_vendor() == "sqlite":
        assert statements == []  # the kernel answers
    else:
        assert len(statements) == 3  # pg_locks, or IS_USED_LOCK: one a look


def test_an_ended_workers_running_jobs_are_taken_over_as_failed_attempts():
    gone = ended_worker("gone:1:bbbbbb")
    retried = make_job("running", claimed_by=gone, attempts=1, max_attempts=3, lease_expires_ms=NOW + 60_000)
    last = make_job("running", claimed_by=gone, attempts=3, max_attempts=3, lease_expires_ms=NOW + 60_000)
    cancelled = make_job("running", claimed_by=gone, attempts=1, stop_requested=True, lease_expires_ms=NOW + 60_000)
    with live_worker("live:2:cccccc") as alive:
        kept = make_job("running", claimed_by=alive, attempts=1, lease_expires_ms=NOW + 60_000)
        assert duty().run_once(NOW) == {"removed": 1, "taken_over": 3, "ended": 2}

    row = Job.objects.get(pk=retried.pk)
    assert (row.status, row.attempts, row.lease_expires_ms, row.run_at_ms) == ("waiting", 1, None, retried.run_at_ms)
    [entry] = row.error_list
    assert (entry["attempt"], entry["kind"], entry["worker"], entry["at_ms"]) == (1, "worker_lost", gone, NOW)
    assert entry["message"].startswith("worker lost: its process")
    row = Job.objects.get(pk=last.pk)
    assert (row.status, row.finished_ms, [e["kind"] for e in row.error_list]) == ("dead", NOW, ["worker_lost"])
    assert Job.objects.get(pk=cancelled.pk).status == "cancelled"
    assert (Job.objects.get(pk=kept.pk).status, Job.objects.get(pk=kept.pk).errors) == ("running", "[]")
    assert list(WorkerProcess.objects.values_list("worker_id", flat=True)) == ["live:2:cccccc"]


def test_a_worker_that_holds_its_lock_again_keeps_its_jobs(monkeypatch):
    """The lock is looked at again under the rows' locks: a worker that took it back meanwhile keeps its jobs."""
    from django_durq.worker import takeover

    worker_id = ended_worker("back:1:dddddd")
    job = make_job("running", claimed_by=worker_id, attempts=1, lease_expires_ms=NOW + 60_000)
    lock_rows = takeover.lock_orphans
    comeback = take_lock(worker_id)

    def comes_back_first(dialect, leases):
        next(comeback)  # between the first look and the second, the worker takes its lock again
        return lock_rows(dialect, leases)

    monkeypatch.setattr(takeover, "lock_orphans", comes_back_first)
    try:
        assert duty().run_once(NOW)["taken_over"] == 0
    finally:
        comeback.close()
    row = Job.objects.get(pk=job.pk)
    assert (row.status, json.loads(row.errors)) == ("running", [])


def take_lock(worker_id: str) -> Iterator[None]:
    """Takes ``worker_id``'s presence lock at the first ``next()`` and holds it until closed."""
    if db_vendor() == "sqlite":
        held = presence.Presence.announce("default", worker_id)
        assert held is not None
        try:
            yield
            yield
        finally:
            held.withdraw()
        return
    locks = session_locks("default")
    assert locks is not None
    session = locks.connect(session_presence.SESSION_IDLE_S)
    try:
        assert locks.take(session, worker_id, 2)
        yield
        yield
    finally:
        session.close()
