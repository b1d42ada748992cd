"""Worker presence on PostgreSQL and MariaDB: a session lock of each worker says it is alive.

An idle worker must write nothing (no heartbeat row, no maintenance lease), yet be reported
alive; a killed one must be known dead at once and its maintenance duties taken over at once; a
paused one loses its locks once its session has been silent too long, and holds them again when
it resumes; a session the server ends is opened again. Real worker processes; every "within"
below is the cap of a polling wait, never a timing claim.
"""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection

from django_durq import ops
from django_durq.clock import now_ms
from django_durq.db import session_presence
from django_durq.db.session_locks import PostgreSQLLocks, session_locks
from django_durq.models import WorkerProcess
from tests.conftest import db_vendor, wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect

pytestmark = [
    pytest.mark.skipif(db_vendor() == "sqlite", reason="session locks are a database server's"),
    pytest.mark.processes,
    pytest.mark.own_sessions,
]

LEADS = "this worker now runs the maintenance duties"
NO_LONGER = "this worker no longer runs the maintenance duties"
HELD_AGAIN = "this worker's presence lock is held again"
LEADER_KEY = PostgreSQLLocks.key(None)


def durq_tables() -> dict[str, list[tuple]]:
    """Every row of django-durq's tables: equal before and after only if nothing was written."""
    with connection.cursor() as cursor:
        names = [name for name in connection.introspection.table_names(cursor) if name.startswith("durq_")]
        rows = {}
        for name in names:
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(name)}")
            rows[name] = sorted(map(repr, cursor.fetchall()))
    return rows


def leader_lock_held() -> bool:
    with connection.cursor() as cursor:
        if db_vendor() == "postgres":
            # This database's leader only: other test databases on a shared server have theirs.
            leaders = (
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            cursor.execute(leaders, [LEADER_KEY[0]])
            return cursor.fetchone()[0] == 1
        cursor.execute("SELECT IS_USED_LOCK(%s)", [session_locks("default").name(None)])
        return cursor.fetchone()[0] is not None


def leader(workers: list) -> list:
    return [worker for worker in workers if worker.output().count(LEADS) > worker.output().count(NO_LONGER)]


def test_idle_workers_write_nothing_are_seen_alive_and_a_killed_leader_is_replaced_at_once(spawn_worker):
    env = {"DURQ_TEST_HEARTBEAT": "0.5"}  # heartbeat rows every half second, if they were written
    workers = [spawn_worker("--queue", "default:2", env=env) for _ in range(2)]
    wait_until(lambda: WorkerProcess.objects.count() == 2, 60, "both workers to register")
    wait_until(lambda: len(leader(workers)) == 1, 30, "one worker to lead")
    time.sleep(2)  # start-up is done: registered, first probes made, the first passes run
    before = durq_tables()
    time.sleep(6)  # twelve heartbeat intervals, six maintenance passes, one removal of ended workers
    assert durq_tables() == before, "an idle worker wrote to the database"
    assert WorkerProcess.objects.filter(holds_lock=True).count() == 2

    # Alive by their locks, long after any heartbeat they could have written.
    later = now_ms() + 3_600_000
    alive = ops.live_workers(now_ms=later)
    assert len(alive) == 2 and all(worker.last_seen_ms == later for worker in alive)

    [victim] = leader(workers)
    survivor = next(worker for worker in workers if worker is not victim)
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    # The server ends the killed process's session, and with it its locks: no lease to run out.
    wait_until(lambda: [worker.pid for worker in ops.live_workers()] == [survivor.pid], 5, "the killed worker to be seen gone")
    wait_until(lambda: LEADS in survivor.output(), 5, "the survivor to take the duties over")
    wait_until(lambda: WorkerProcess.objects.count() == 1, 10, "the dead worker's row to be removed")

    job = jobs.effect.enqueue(tag="after")
    wait_until(lambda: Effect.objects.filter(job_id=job.pk).exists(), 30, "the survivor to run a job")
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0, survivor.output()
    assert not WorkerProcess.objects.exists()


def test_a_paused_leader_loses_its_locks_and_holds_them_again_when_it_resumes(spawn_worker):
    first = spawn_worker("--queue", "default:1")
    wait_until(lambda: LEADS in first.output(), 30, "the first worker to lead")
    second = spawn_worker("--queue", "default:1")
    wait_until(lambda: WorkerProcess.objects.count() == 2, 60, "both workers to register")

    first.signal(signal.SIGSTOP)  # a VM pause, a stop-the-world swap storm, a debugger
    try:
        # Its session falls silent; the server ends it, and the waiting worker gets the lock.
        wait_until(lambda: LEADS in second.output(), session_presence.SESSION_IDLE_S + 15, "the second worker to lead")
        wait_until(lambda: [worker.pid for worker in ops.live_workers()] == [second.pid], 10, "the paused worker to be seen gone")
    finally:
        first.signal(signal.SIGCONT)
    wait_until(lambda: HELD_AGAIN in first.output(), 30, "the resumed worker to hold its lock again")
    wait_until(lambda: NO_LONGER in first.output(), 10, "the resumed worker to know it no longer leads")
    # Its row may have been removed while it was paused: it writes it again, and is listed.
    wait_until(lambda: sorted(worker.pid for worker in ops.live_workers()) == sorted([first.pid, second.pid]), 30, "both listed")
    assert second.output().count(LEADS) == 1 and NO_LONGER not in second.output()

    job = jobs.effect.enqueue(tag="after")
    wait_until(lambda: Effect.objects.filter(job_id=job.pk).exists(), 30, "a job to run")
    for worker in (first, second):
        worker.signal(signal.SIGTERM)
    for worker in (first, second):
        assert worker.wait(timeout=30) == 0, worker.output()


def test_a_presence_session_the_server_ends_is_opened_again(spawn_worker):
    worker = spawn_worker("--queue", "default:1")
    wait_until(lambda: LEADS in worker.output(), 30, "the worker to lead")
    with connection.cursor() as cursor:
        if db_vendor() == "postgres":
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        else:
            cursor.execute("SELECT IS_USED_LOCK(%s)", [session_locks("default").name(None)])
            cursor.execute(f"KILL CONNECTION {int(cursor.fetchone()[0])}")
    wait_until(lambda: HELD_AGAIN in worker.output(), 30, "the worker to open its session again")
    wait_until(leader_lock_held, 10, "the worker to take the leader's lock again")
    wait_until(lambda: [w.pid for w in ops.live_workers()] == [worker.pid], 10, "the worker to be listed")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()


def snapshot_holders() -> list[tuple[int, object]]:
    """(pid, start of its statement) of the other sessions of this database that hold a snapshot now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, query_start FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL"
        )
        return cursor.fetchall()


@pytest.mark.skipif(db_vendor() != "postgres", reason="PostgreSQL's horizon of removable row versions")
def test_a_worker_waiting_to_lead_holds_back_no_snapshot(spawn_worker):
    """A statement holds a snapshot for as long as it runs, and the server keeps every row version
    it might see: a claimed job's old version stays in the claim index, and every claim walks it.
    A worker that is not the leader must therefore not wait for the leader's lock inside a statement.
    """
    workers = [spawn_worker("--queue", "default:2") for _ in range(2)]
    wait_until(lambda: WorkerProcess.objects.count() == 2, 60, "both workers to register")
    wait_until(lambda: len(leader(workers)) == 1, 30, "one worker to lead")
    time.sleep(1)  # start-up is done
    first_seen: dict[tuple[int, object], float] = {}
    longest_s = 0.0
    deadline = time.monotonic() + 6  # three of the leader's turns, and of the waits for its lock
    while time.monotonic() < deadline:
        seen_at = time.monotonic()
        for statement in snapshot_holders():
            longest_s = max(longest_s, seen_at - first_seen.setdefault(statement, seen_at))
        time.sleep(0.05)
    assert longest_s < 1.0, f"an idle worker's statement held a snapshot for {longest_s:.1f} s"
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=30) == 0, worker.output()
