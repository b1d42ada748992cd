"""The runtime's invariants, each against the way it was once broken.

- An attempt is (job id, claim token): a stale attempt of a job never disturbs a newer one.
- Leases are kept by a thread that runs nothing else; user code (signal receivers) cannot stall it.
- A lease never moves backwards; a dead letter is never made under a lease that was just renewed.
- A pause holds up to the handler's call: a thread that stalls before it asks anew.
- A cancel is final: across failure, retry and hand-back.
- A job whose worker died on its last attempt is buried while the other workers are busy.
- Jobs claimed ahead never wait behind a long job while another worker is idle.
- Every stop the worker decides itself reaches ``should_stop()``; hand-backs are bounded.
- Recording an outcome cannot be lost to a bad ``Retry`` or to a transaction a handler left open.
- A finished job's completion waits at most the hold plus the write in progress, under load too.

Process tests use the fault suite's short settings (lease 2 s, heartbeat 0.5 s, poll 0.25 s).
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from types import SimpleNamespace

import pytest
from django.db import connection

from django_durq import ops
from django_durq.clock import ManualClock, use_clock
from django_durq.conf import get_settings
from django_durq.db.store import Store
from django_durq.execution import executor as executor_module
from django_durq.execution.executor import Executor
from django_durq.handlers.context import JobContext
from django_durq.models import Job, QueueStat
from django_durq.testing import drain
from django_durq.worker.pause_guard import PAUSE_SEEN_WITHIN_S, PauseGuard
from tests.conftest import wait_until
from tests.faults.conftest import POLL_S, one_leg, only_on, sqlite_path
from tests.ledger import checker, jobs
from tests.ledger.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True)]


def status(job_id: int) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job_id)


def effects(job_id: int, tag: str | None = None) -> list[Effect]:
    found = Effect.objects.filter(job_id=job_id)
    return list(found.filter(tag=tag) if tag is not None else found)


# --- attempt identity and the lease keeper ---------------------------------------------------------


@pytest.mark.processes
@one_leg
def test_a_stale_attempt_returning_late_does_not_evict_the_new_attempt_of_its_job(faults):
    """Attempt 1 outlives its timeout and returns while attempt 2 of the same job runs past a lease."""
    queued = jobs.outlive_timeout.enqueue(first=8.0, second=4.0)
    # Two slots: one free to take the job over should the new attempt's lease lapse.
    worker = faults.spawn_ready("--queue", "default:2")
    wait_until(lambda: status(queued.pk) in ("finished", "dead"), 60, "the job to end")
    row = Job.objects.get(pk=queued.pk)
    kinds = [entry["kind"] for entry in row.error_list]
    assert (row.status, row.attempts, kinds) == ("finished", 2, ["timeout"]), worker.output()
    assert [effect.token for effect in effects(queued.pk)] == [2]


@pytest.mark.processes
@one_leg
def test_a_slow_signal_receiver_does_not_stop_lease_renewals(faults):
    """A job_dead receiver taking 4 s (twice the lease) runs while a healthy 5 s job must keep its lease."""
    healthy = jobs.effect.enqueue(tag="healthy", sleep=5.0)
    hung = jobs.hang.using(max_attempts=1).enqueue(seconds=30.0)
    worker = faults.spawn_ready("--queue", "default:4", env={"DURQ_TEST_SLOW_RECEIVERS": "4"})
    wait_until(lambda: status(hung.pk) == "dead", 30, "the hung job to become a dead letter")
    wait_until(lambda: status(healthy.pk) == "finished", 60, "the healthy job to finish")
    row = Job.objects.get(pk=healthy.pk)
    assert len(effects(healthy.pk, "healthy")) == 1, worker.output()
    assert (row.attempts, row.error_list) == (1, [])


def test_a_late_renewal_never_moves_a_lease_backwards(short):
    clock = ManualClock(1_800_000_000_000)
    with use_clock(clock):
        jobs.effect.enqueue()
        store = Store("default")
        (claimed,) = store.claim("default", 1, clock.now_ms(), "worker-a")
        clock.advance(1_000)
        store.dialect.renew([(claimed.id, claimed.claim_token)], clock.now_ms())
        renewed = Job.objects.get(pk=claimed.id).lease_expires_ms
        # A renewal whose "now" was read before a stall arrives after the one above.
        store.dialect.renew([(claimed.id, claimed.claim_token)], clock.now_ms() - 900)
        assert Job.objects.get(pk=claimed.id).lease_expires_ms == renewed


def test_a_dead_letter_is_never_made_under_a_lease_renewed_since_the_scan(short):
    clock = ManualClock(1_800_000_000_000)
    with use_clock(clock):
        queued = jobs.effect.using(max_attempts=1).enqueue()
        store = Store("default")
        (claimed,) = store.claim("default", 1, clock.now_ms(), "worker-a")
        clock.advance(2_500)
        (expired,) = store.dialect.expired_final_attempts("default", clock.now_ms())
        # The holder was only slow: its renewal lands between the scan and the bury.
        store.dialect.renew([(claimed.id, claimed.claim_token)], clock.now_ms())
        executor = Executor(store, get_settings(), clock, "worker-b")
        job_id, token, name, attempts, errors, holder = expired
        assert executor.bury_lost("default", (job_id, token), name, attempts, errors, holder) == "lost"
        assert status(queued.pk) == "running"


# --- a pause holds up to the handler's call -----------------------------------------------------------


def test_a_thread_stalled_after_its_pause_check_asks_again_before_the_handler(short, monkeypatch):
    """Model chaos, SQLite seed 5406: a job of a paused queue started 1.3 s after the pause.

    Its worker had been stopped (``SIGSTOP``) after its slot found the queue not paused and before
    the handler ran; it resumed after the pause and ran the handler at once. The slot asks as the
    last step before the handler's run: a stall in any step before it (here the arguments'
    decoding) is followed by the ask, which reads the queue's state anew.
    """
    queued = jobs.effect.enqueue(tag="stalled")
    store = Store("default")
    clock = ManualClock(1_800_000_000_000)
    (claimed,) = store.claim("default", 1, clock.now_ms(), "worker-a")
    ctx = JobContext(claimed, worker_id="worker-a", store=store, clock=clock, shutdown=threading.Event())
    guard = PauseGuard("default", SimpleNamespace(store=store))
    assert guard.may_start()  # the slot's check: not paused
    real_decode = executor_module.decode_arguments

    def stalled_decode(arguments):
        assert ops.pause("default", reason="paused while the slot's thread stalled")
        time.sleep(2 * PAUSE_SEEN_WITHIN_S)  # the thread stalls past the bound of its last check
        return real_decode(arguments)

    monkeypatch.setattr(executor_module, "decode_arguments", stalled_decode)
    assert Executor(store, get_settings(), clock, "worker-a").run(claimed, ctx, may_start=guard.may_start) == "paused"
    assert not Effect.objects.filter(tag="stalled").exists()
    assert status(queued.pk) == "running"  # for the slot to hand back, its attempt not counted


# --- cancel is final --------------------------------------------------------------------------------


def test_a_cancel_that_arrives_while_the_attempt_fails_is_not_lost_to_the_retry(short):
    clock = ManualClock(1_800_000_000_000)
    with use_clock(clock):
        queued = jobs.fail.enqueue()
        store = Store("default")
        (claimed,) = store.claim("default", 1, clock.now_ms(), "worker-a")
        ctx = JobContext(claimed, worker_id="worker-a", store=store, clock=clock, shutdown=threading.Event())
        assert ops.cancel([queued.pk]).stopping == [queued.pk]  # the worker has not heard of it yet
        Executor(store, get_settings(), clock, "worker-a").run(claimed, ctx)
        assert status(queued.pk) == "cancelled"
        assert drain(clock=clock) == {}


@pytest.mark.processes
def test_a_cancel_of_a_job_handed_back_at_shutdown_sticks(faults):
    queued = jobs.stubborn.enqueue(seconds=30.0)
    worker = faults.spawn_ready("--queue", "default:1", env={"DURQ_TEST_GRACE": "0.3"})
    wait_until(lambda: status(queued.pk) == "running", 30, "the job to start")
    assert ops.cancel([queued.pk]).stopping == [queued.pk]
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    assert status(queued.pk) == "cancelled"
    assert effects(queued.pk) == []


# --- lost last attempts, buffers, stops and hand-backs ------------------------------------------------


@pytest.mark.processes
@one_leg
def test_a_last_attempt_whose_worker_died_is_buried_while_the_other_workers_are_busy(faults):
    busy = jobs.effect.enqueue(tag="busy", sleep=12.0)
    survivor = faults.spawn_ready("--queue", "default:1")
    wait_until(lambda: status(busy.pk) == "running", 30, "the survivor to be busy")
    doomed = jobs.crash.using(max_attempts=1).enqueue(mode="sigkill")
    victim = faults.spawn("--queue", "default:1")
    victim.wait(60)
    # Its lock is released at once, or the lease (2 s) runs out, then a poll interval; the survivor's
    # slot stays busy throughout.
    wait_until(lambda: status(doomed.pk) == "dead", 2.0 + POLL_S + 6.0, "the lost last attempt to be buried")
    assert status(busy.pk) == "running" and not effects(busy.pk), survivor.output()
    # Taken over once the victim's lock was released, or buried once its lease expired.
    assert Job.objects.get(pk=doomed.pk).error_list[-1]["kind"] in checker.WORKER_LOST_KINDS


@pytest.mark.processes
@one_leg
def test_jobs_claimed_ahead_do_not_wait_behind_a_long_job_while_another_worker_is_idle(faults):
    first = faults.spawn_ready("--queue", "default:1")
    warmup = jobs.noop.enqueue_many([{} for _ in range(2_000)])
    wait_until(lambda: not Job.objects.filter(pk__in=[j.pk for j in warmup]).active().exists(), 120, "the warm-up")
    long = jobs.effect.using(priority=10).enqueue(tag="long", sleep=6.0)
    short = jobs.stamp.enqueue_many([{"tag": "short"} for _ in range(200)])
    wait_until(lambda: status(long.pk) == "running", 30, "the long job to start")
    faults.spawn_ready("--queue", "default:1")
    wait_until(lambda: Effect.objects.filter(tag="short").count() == len(short), 60, "the short jobs")
    assert not effects(long.pk), first.output()  # all ran while the long job still ran
    assert not Job.objects.filter(pk__in=[j.pk for j in short], attempts__gt=1).exists()


@pytest.mark.processes
@only_on("sqlite")
@pytest.mark.parametrize("finished", ["kept", "deleted"])
def test_finished_jobs_held_behind_a_long_write_are_recorded_at_once_when_it_ends(faults, tmp_path, finished):
    """The completion window holds under load: hold plus the write in progress, never a lock-sharing gap.

    Another connection writes every 20 ms (a web app), so the worker shares SQLite's write lock.
    The test then holds that lock for 2 s: the worker's write in progress waits, its slot runs the
    buffered jobs meanwhile, and their completions pile up in memory. Once the lock is free they
    are overdue, so they are written at once rather than after a pause as long as the blocked write.
    """
    log = tmp_path / "ended.log"
    jobs.nap.enqueue_many([{"log": str(log)} for _ in range(5_000)])  # 2 ms each: about 10 s for one slot
    env = {"DURQ_TEST_LEASE": "30", "DURQ_TEST_HEARTBEAT": "5"}
    if finished == "deleted":
        env["DURQ_TEST_KEEP_FINISHED"] = ""  # the suite's 0
    worker = faults.spawn_ready("--queue", "default:1", env=env)
    wait_until(lambda: log.exists() and log.read_text().count("\n") >= 300, 60, "the drain to be under way")
    stop_writing = threading.Event()

    def web_app() -> None:
        try:
            while not stop_writing.wait(0.02):
                QueueStat.objects.create(queue="web", minute_ms=time.time_ns())
        finally:
            connection.close()

    writer = threading.Thread(target=web_app)
    writer.start()
    try:
        time.sleep(0.5)
        lock = sqlite3.connect(sqlite_path(), isolation_level=None, timeout=30)
        lock.execute("BEGIN IMMEDIATE")
        held_ms = time.time_ns() // 1_000_000
        time.sleep(2.0)
        lock.execute("INSERT INTO durq_queue_stat (queue, minute_ms, finished, failed, dead) VALUES ('lock', 0, 0, 0, 0)")
        lock.execute("COMMIT")
        released_ms = time.time_ns() // 1_000_000
        lock.close()
        time.sleep(0.5)
        unrecorded = set(Job.objects.filter(status="running").values_list("id", flat=True))
        ended = dict(tuple(map(int, line.split())) for line in log.read_text().splitlines())
    finally:
        stop_writing.set()
        writer.join()
    during_hold = [job_id for job_id, at in ended.items() if held_ms < at <= released_ms]
    held = [job_id for job_id, at in ended.items() if at <= released_ms and job_id in unrecorded]
    assert len(during_hold) >= 2, worker.output()  # jobs did finish while no completion could be written
    assert not held, f"{len(held)} jobs that returned before the lock was freed were still unrecorded 0.5 s later"


@pytest.mark.processes
def test_a_stop_the_worker_decides_itself_reaches_should_stop_before_the_grace(faults):
    queued = jobs.until_stopped.enqueue(seconds=30.0)
    worker = faults.spawn("--queue", "default:1", "--max-memory", "1")
    assert worker.wait(60) == 0, worker.output()
    assert [e.tag for e in effects(queued.pk)] == ["stopper:stopped"], worker.output()
    assert status(queued.pk) == "waiting"


@pytest.mark.processes
def test_a_job_that_always_outlives_the_grace_becomes_a_dead_letter_after_max_handbacks(faults):
    queued = jobs.sleeper.enqueue(seconds=60.0)
    env = {"DURQ_TEST_GRACE": "0.2", "DURQ_TEST_MAX_HANDBACKS": "2"}
    for _ in range(2):
        worker = faults.spawn_ready("--queue", "default:1", env=env)
        wait_until(lambda: status(queued.pk) == "running", 30, "the job to start")
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()
    row = Job.objects.get(pk=queued.pk)
    assert row.status == "dead", worker.output()
    assert "handed back 2 times" in row.error_list[-1]["message"]


# --- outcomes are always recorded -------------------------------------------------------------------


def test_a_retry_with_a_naive_datetime_is_a_failed_attempt_not_an_escape(short):
    clock = ManualClock(1_800_000_000_000)
    queued = jobs.retry_naive.enqueue()
    assert drain(clock=clock) == {"retrying": 1}
    error = Job.objects.get(pk=queued.pk).error_list[0]
    assert "Retry(after=" in error["message"] and "aware" in error["message"]


@pytest.mark.processes
def test_a_handler_that_leaves_autocommit_off_cannot_swallow_its_outcome(faults):
    left_open = jobs.autocommit_off.enqueue()
    after = jobs.effect.enqueue(tag="after")
    worker = faults.spawn_ready("--queue", "default:1")
    wait_until(lambda: status(left_open.pk) == "finished" and status(after.pk) == "finished", 30, "both jobs")
    assert "turned autocommit off" in worker.output()


# --- signals -----------------------------------------------------------------------------------------


@pytest.mark.processes
def test_job_dead_receivers_see_the_failing_exception_in_exc_info(faults):
    queued = jobs.fail.using(max_attempts=1).enqueue()
    faults.spawn_ready("--queue", "default:1", env={"DURQ_TEST_RECORD_EXC_INFO": "1"})
    wait_until(lambda: effects(queued.pk, "dead-exc:ValueError"), 30, "the job_dead receiver")


@pytest.mark.processes
def test_task_finished_for_a_success_is_sent_by_a_real_worker_when_nothing_is_kept(faults):
    tasks = pytest.importorskip("tests.ledger.tasks")
    result = tasks.record.enqueue("signalled")
    faults.spawn_ready("--queue", "default:1", env={"DURQ_TEST_RECORD_TASK_SIGNALS": "1", "DURQ_TEST_KEEP_FINISHED": "0"})
    wait_until(lambda: effects(int(result.id.split("-")[0]), "finished:SUCCESSFUL"), 30, "task_finished from the worker")


@pytest.mark.processes
def test_task_finished_for_a_failure_is_sent_inside_the_except(faults):
    tasks = pytest.importorskip("tests.ledger.tasks")
    result = tasks.fail.using(max_attempts=1).enqueue("broken")
    faults.spawn_ready("--queue", "default:1", env={"DURQ_TEST_RECORD_TASK_SIGNALS": "1"})
    job_id = int(result.id.split("-")[0])
    wait_until(lambda: effects(job_id, "finished:FAILED"), 30, "task_finished for the failure")
    assert effects(job_id, "finished-exc:ValueError"), [e.tag for e in effects(job_id)]
