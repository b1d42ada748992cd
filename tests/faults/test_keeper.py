"""The lease keeper's invariants, each against the way it was once broken.

- A renewal (and every fenced write of a batch) matches each attempt by its own (job id, claim
  token), so a process that holds two attempts of one job renews the one the database holds.
- A worker never takes back a job whose lease it still holds: while a lease it holds is
  unconfirmed for three quarters of its length, the worker claims nothing at all.
- A renewal that one row lock holds up neither hangs nor holds up the other leases' renewals.
- MariaDB's clock is read in UTC, whatever the session's time zone.

Process tests use the fault suite's short settings (lease 2 s, heartbeat 0.5 s, poll 0.25 s).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection, connections, transaction

from django_durq.clock import ManualClock, now_ms, use_clock
from django_durq.db.checks import database_now_ms
from django_durq.db.store import Store
from django_durq.models import Job
from tests.conftest import wait_until
from tests.faults.conftest import LEASE_S, one_leg, only_on, sqlite_path
from tests.ledger import jobs
from tests.ledger.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True)]


def row(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


def status(job_id: int) -> str:
    return row(job_id).status


# --- (id, claim token) pairs -----------------------------------------------------------------------


def test_a_renewal_matches_each_attempt_by_its_own_claim_token(short):
    """Two attempts of one job in one batch, the stale one first: only the held one's lease is renewed."""
    clock = ManualClock(1_800_000_000_000)
    with use_clock(clock):
        queued = jobs.effect.enqueue()
        store = Store("default")
        (first,) = store.claim("default", 1, clock.now_ms(), "worker-a")
        clock.advance(2_500)  # the 2 s lease lapsed: the job is claimed again
        (second,) = store.claim("default", 1, clock.now_ms(), "worker-a")
        stale, held = (first.id, first.claim_token), (second.id, second.claim_token)
        assert held[1] == stale[1] + 1

        clock.advance(1_000)
        store.dialect.renew([stale, held], clock.now_ms())
        assert row(queued.pk).lease_expires_ms == clock.now_ms() + 2_000, "the held attempt's lease was not renewed"

        assert store.dialect.release([stale, held], started=False, now_ms=clock.now_ms()) == 1
        (third,) = store.claim("default", 1, clock.now_ms(), "worker-a")
        latest = (third.id, third.claim_token)
        assert store.dialect.complete([held, latest]) == {latest}
        assert not Job.objects.filter(pk=queued.pk).exists()


@pytest.mark.processes
@one_leg
def test_a_job_taken_back_after_a_takeover_keeps_its_new_lease_while_its_old_handler_still_runs(faults):
    """The keeper of worker A stalls past the lease; B takes the job over and dies; A claims it again.

    A's book then holds the job's first attempt (lost, its handler still sleeping) and its third:
    every renewal must renew the third, which runs past two leases and finishes, claimed no more.
    """
    queued = jobs.overstay.enqueue(first=20.0, later=4.0)
    holder = faults.spawn_ready("--queue", "default:2", hooks=True)
    wait_until(lambda: status(queued.pk) == "running", 30, "the job to start")
    faults.gates.close("in_heartbeat")
    faults.gates.wait("in_heartbeat", queued.pk)
    taker = faults.spawn_ready("--queue", "default:1")
    wait_until(lambda: row(queued.pk).claim_token == 2, 30, "the job to be taken over")
    taker.kill()
    expires = row(queued.pk).lease_expires_ms
    wait_until(lambda: now_ms() > expires + 300, 10, "the dead taker's lease to run out")
    faults.gates.open("in_heartbeat")
    wait_until(lambda: status(queued.pk) in ("finished", "dead"), 40, "the job to end")
    job = row(queued.pk)
    assert (job.status, job.claim_token) == ("finished", 3), f"{job.status} after {job.claim_token} claims\n{holder.output()}"
    assert list(Effect.objects.filter(job_id=queued.pk, token=3).values_list("pid", flat=True)) == [holder.pid]


# --- no claim while a lease is unconfirmed ---------------------------------------------------------


@pytest.mark.processes
@one_leg
def test_a_worker_whose_lease_keeper_stalls_past_a_lease_neither_takes_its_job_back_nor_claims(faults):
    queued = jobs.sleeper.enqueue(seconds=6.0)
    worker = faults.spawn_ready("--queue", "default:3", hooks=True)
    wait_until(lambda: status(queued.pk) == "running", 30, "the job to start")
    faults.gates.close("in_heartbeat")  # the keeper hangs, as in a renewal that never returns
    faults.gates.wait("in_heartbeat", queued.pk)
    expires = row(queued.pk).lease_expires_ms
    wait_until(lambda: now_ms() > expires + 1_000, 10, "the unrenewed lease to run out")
    later = jobs.stamp.enqueue(tag="later")
    time.sleep(1.0)  # four polls of an idle slot
    assert (row(queued.pk).claim_token, status(later.pk)) == (1, "waiting"), worker.output()
    faults.gates.open("in_heartbeat")
    wait_until(lambda: status(queued.pk) == "finished" and status(later.pk) == "finished", 30, "both jobs to finish")
    assert row(queued.pk).claim_token == 1
    assert list(Effect.objects.filter(job_id=queued.pk).values_list("token", flat=True)) == [1]


@pytest.mark.processes
@one_leg
def test_a_worker_whose_lease_keeper_stalls_does_not_bury_its_own_last_attempt(faults):
    """The monitor buries last attempts whose worker died: never one whose handler runs here."""
    queued = jobs.sleeper.using(max_attempts=1).enqueue(seconds=5.0)
    worker = faults.spawn_ready("--queue", "default:1", hooks=True)
    wait_until(lambda: status(queued.pk) == "running", 30, "the job to start")
    faults.gates.close("in_heartbeat")
    faults.gates.wait("in_heartbeat", queued.pk)
    expires = row(queued.pk).lease_expires_ms
    wait_until(lambda: now_ms() > expires + 1_500, 10, "the unrenewed lease to run out")  # six of the monitor's looks
    faults.gates.open("in_heartbeat")
    wait_until(lambda: status(queued.pk) in ("finished", "dead"), 30, "the job to end")
    assert (status(queued.pk), row(queued.pk).claim_token) == ("finished", 1), worker.output()


@pytest.mark.processes
@one_leg
@only_on("postgres", "mysql")  # SQLite has no row locks: a writer holds the whole file
def test_a_row_lock_on_one_leased_job_stops_claims_but_not_the_other_renewals(faults):
    """Another transaction holds one running job's row for longer than its lease.

    That job's lease cannot be renewed meanwhile, so the worker claims nothing (it could take
    the job back) and its handler hears "lease at risk"; the worker's other leases are renewed
    as usual, and once the lock is gone the job goes on under its first claim.
    """
    locked = jobs.lease_watch.enqueue(seconds=8.0)
    other = jobs.lease_watch.enqueue(seconds=8.0)
    worker = faults.spawn_ready("--queue", "default:4")
    wait_until(lambda: Job.objects.filter(pk__in=[locked.pk, other.pk], status="running").count() == 2, 30, "both to start")
    taken, release = threading.Event(), threading.Event()

    def hold_the_row() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=locked.pk)
                taken.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert taken.wait(10)
        time.sleep(LEASE_S)  # past three quarters of the locked job's lease since its last renewal
        late = jobs.stamp.enqueue(tag="late")
        time.sleep(1.0)
        assert status(late.pk) == "waiting", worker.output()
    finally:
        release.set()
        holder.join()
    wait_until(lambda: Effect.objects.filter(job_id__in=[locked.pk, other.pk, late.pk]).count() == 3, 30, "every job to end")
    assert [row(job_id).claim_token for job_id in (locked.pk, other.pk)] == [1, 1], worker.output()
    assert Effect.objects.get(job_id=locked.pk).tag == "reasons:lease at risk"
    assert Effect.objects.get(job_id=other.pk).tag == "reasons:", "a renewal held up by another job's row"


@contextlib.contextmanager
def writes_locked_out() -> Iterator[None]:
    """Another connection keeps every other from writing to the job table for the block.

    PostgreSQL and MariaDB: a table lock that lets reads through; SQLite: the database's write lock.
    """
    if connection.vendor == "sqlite":
        holder = sqlite3.connect(sqlite_path(), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                if connection.vendor == "postgresql":
                    cursor.execute("LOCK TABLE durq_job IN SHARE MODE")
                else:
                    cursor.execute("LOCK TABLES durq_job READ")
                taken.set()
                release.wait(30)
                if connection.vendor == "mysql":
                    cursor.execute("UNLOCK TABLES")
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert taken.wait(10)
        yield
    finally:
        release.set()
        thread.join()


@pytest.mark.processes
@one_leg
def test_a_renewal_that_a_lock_holds_up_fails_within_its_bound_instead_of_hanging(faults):
    running = jobs.lease_watch.enqueue(seconds=6.0)
    worker = faults.spawn_ready("--queue", "default:1")
    wait_until(lambda: status(running.pk) == "running", 30, "the job to start")
    with writes_locked_out():
        # The keeper's bound is its tick (0.5 s here): well within the lease the lock outlasts.
        wait_until(lambda: "could not renew" in worker.output(), LEASE_S, "the held-up renewal to give up")
    wait_until(lambda: Effect.objects.filter(job_id=running.pk).exists(), 30, "the job to finish")
    assert row(running.pk).claim_token == 1


# --- the server's clock ----------------------------------------------------------------------------

# 01:00:00.25 UTC on 27 October 2024: 02:00:00.25 in Paris, an hour after its clocks went back
# from 03:00 to 02:00, so that local time is ambiguous.
FALL_BACK_MS = 1_729_990_800_250


@only_on("mysql")
def test_the_mariadb_clock_is_read_in_utc_whatever_the_session_time_zone():
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM mysql.time_zone_name WHERE name = 'Europe/Paris'")
        if not cursor.fetchone()[0]:
            pytest.skip("the server has no time zone tables (load one with mariadb-tzinfo-to-sql)")
        cursor.execute("SET time_zone = 'Europe/Paris'")
        cursor.execute("SET timestamp = %s", [FALL_BACK_MS / 1000])
    try:
        assert database_now_ms(connection) == FALL_BACK_MS
    finally:
        connection.close()


@pytest.mark.processes
@one_leg
def test_the_keeper_renews_again_after_a_renewal_that_timed_out(faults):
    """The renewal that gave up on its bound (a lock or statement timeout) leaves no broken connection behind.

    The next renewals get through on the keeper's connection (reopened if the error closed it):
    the lease moves on past the lock, claims resume and the job ends under its first claim.
    """
    running = jobs.lease_watch.enqueue(seconds=10.0)
    worker = faults.spawn_ready("--queue", "default:2")
    wait_until(lambda: status(running.pk) == "running", 30, "the job to start")
    with writes_locked_out():
        wait_until(lambda: "could not renew" in worker.output(), LEASE_S, "the held-up renewal to give up")
    released = now_ms()
    wait_until(
        lambda: (row(running.pk).lease_expires_ms or 0) > released + LEASE_S * 1000, 3, "a renewal after the timed-out one"
    )
    later = jobs.stamp.enqueue(tag="later")
    wait_until(lambda: Effect.objects.filter(job_id=later.pk).exists(), 10, "claims to resume")
    wait_until(lambda: Effect.objects.filter(job_id=running.pk).exists(), 30, "the job to finish")
    assert row(running.pk).claim_token == 1, worker.output()


# --- a job claimed ahead starts only on a confirmed lease ----------------------------------------


def test_a_job_claimed_ahead_starts_only_once_a_renewal_confirms_its_lease(short):
    """A job that waited in a buffer while no renewal got through (a locked database) may be another worker's by now.

    Its slot waits for the next renewal: one that finds the job taken over ends the attempt unstarted, one that
    confirms the lease starts it. Before, the slot started it at once: a model-based chaos run saw both workers
    run one job to completion (SQLite, seed 1016: a writer stopped with the write lock held).
    """
    from django_durq.conf import get_settings
    from django_durq.execution.executor import Executor
    from django_durq.execution.outcomes import LOST
    from django_durq.handlers.context import JobContext

    clock = ManualClock(1_800_000_000_000)
    with use_clock(clock):
        jobs.effect.enqueue(tag="ahead")
        jobs.effect.enqueue(tag="ahead")
        store = Store("default")
        claimed = store.claim("default", 2, clock.now_ms(), "worker-a")
        stale = time.monotonic() - LEASE_S  # no renewal since the claim, a whole lease ago
        shutdown = threading.Event()
        contexts = {
            job.id: JobContext(job, worker_id="worker-a", store=store, clock=clock, shutdown=shutdown, claimed_mono=stale)
            for job in claimed
        }
        executor = Executor(store, get_settings(), clock, "worker-a")
        outcomes: dict[int, str] = {}

        def run(job) -> None:
            outcomes[job.id] = executor.run(job, contexts[job.id])
            connections.close_all()

        slots = [threading.Thread(target=run, args=(job,)) for job in claimed]
        for slot in slots:
            slot.start()
        time.sleep(0.5)
        assert not Effect.objects.exists() and not outcomes  # neither started: their leases are at risk

        clock.advance(LEASE_S * 1000 + 1)  # the database's leases ran out
        (taken,) = store.claim("default", 1, clock.now_ms(), "worker-b")  # another worker takes one over
        asked = time.monotonic()
        renewal = store.renew([ctx.lease for ctx in contexts.values()], clock)
        for ctx in contexts.values():
            ctx.apply_renewal(renewal, asked)
        for slot in slots:
            slot.join(10)
        kept = next(job.id for job in claimed if job.id != taken.id)
        assert outcomes[taken.id] == LOST
        assert list(Effect.objects.values_list("job_id", "token")) == [(kept, 1)]  # the confirmed one ran, once


def test_a_job_waiting_for_its_lease_cannot_time_out_and_its_slot_returns_when_another_settles_it(short):
    """A job with a timeout claimed ahead waits for a renewal to confirm its lease before it starts.

    Its timeout counts from its handler's start, so the pool's reaper leaves it alone meanwhile; and
    should anything else settle the attempt while it waits, its slot returns at once instead of
    waiting for a renewal the keeper will never send for it. Before, the reaper failed the job
    ("timed out; the handler did not return") though it never started, and its slot waited for
    ever with the job's place under its limit held: a model-based chaos run saw every job of that
    key stay waiting (SQLite, seed 1013: renewals failing on a locked database).
    """
    from django_durq.conf import get_settings
    from django_durq.execution.executor import Executor
    from django_durq.execution.outcomes import ABANDONED
    from django_durq.handlers.context import JobContext

    clock = ManualClock(1_800_000_000_000)
    with use_clock(clock):
        jobs.effect.using(timeout=1).enqueue(tag="ahead")
        store = Store("default")
        (job,) = store.claim("default", 1, clock.now_ms(), "worker-a")
        stale = time.monotonic() - LEASE_S  # no renewal since the claim, a whole lease ago
        shutdown = threading.Event()
        ctx = JobContext(job, worker_id="worker-a", store=store, clock=clock, shutdown=shutdown, claimed_mono=stale)
        executor = Executor(store, get_settings(), clock, "worker-a")
        outcomes: list[str] = []

        def run() -> None:
            outcomes.append(executor.run(job, ctx))
            connections.close_all()

        slot = threading.Thread(target=run, daemon=True)
        slot.start()
        try:
            time.sleep(1.2)  # past the job's 1 s timeout, counted from the claim
            assert ctx.overdue_by_s() is None, "a job that has not started was judged overdue"
            assert ctx.settle()  # another recorder settles it (a hand-back, a reaper)
            slot.join(5)
            assert not slot.is_alive(), "the slot went on waiting for a renewal after the attempt was settled"
        finally:
            shutdown.set()  # a slot still waiting (the failure above) ends
            slot.join(5)
        assert outcomes == [ABANDONED]
        assert not Effect.objects.exists()
