"""``manage.py durq_worker`` as users run it: real processes against the test database."""

from __future__ import annotations

import re
import signal
import time
from collections import Counter

import pytest
from django.db import transaction

from django_durq.models import Job, Status, WorkerProcess
from django_durq.worker import exit_status
from tests.conftest import db_vendor, run_command, wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect

pytestmark = pytest.mark.processes


def effects_per_job() -> Counter[int]:
    return Counter(Effect.objects.values_list("job_id", flat=True))


# --- exclusivity under load ---------------------------------------------------------------------


def test_six_workers_drain_five_thousand_jobs_exactly_once(spawn_worker):
    workers = [spawn_worker("--queue", "default:2") for _ in range(6)]
    # Queued once all six are up and idle: a worker started alone could drain them all first.
    wait_until(lambda: WorkerProcess.objects.count() == 6, 60, "every worker to register")
    time.sleep(0.5)
    queued = jobs.effect.enqueue_many([{"tag": "load"} for _ in range(5000)])
    ids = {row.pk for row in queued}
    wait_until(lambda: Effect.objects.count() >= 5000, 240, "the drain")
    wait_until(lambda: not Job.objects.exists(), 30, "the last completions")
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=30) == 0, worker.output()
    counts = effects_per_job()
    assert set(counts) == ids, "every job ran"
    assert max(counts.values()) == 1, "no job ran twice"
    assert Job.objects.count() == 0
    pids = set(Effect.objects.values_list("pid", flat=True))
    assert len(pids) >= 2, "the work was shared between processes"
    for worker in workers:
        assert "database is locked" not in worker.output()
        assert " ERROR " not in worker.output()


# --- command line -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--queue", "default:0"], "pool size must be at least 1"),
        (["--queue", "default:abc"], "pool size 'abc' is not a whole number"),
        (["--queue", "default:-1"], "pool size must be at least 1"),
        (["--queue", "nosuchqueue"], "no setting or job names this queue"),
        (["--max-jobs", "0"], "--max-jobs must be greater than 0"),
        (["--max-memory", "lots"], "--max-memory 'lots' is not a number"),
        (["--grace", "-3"], "--grace must be 0 or more seconds"),
    ],
)
def test_bad_command_line_exits_2_with_one_line(worker_env, args, message):
    before = Job.objects.count()
    result = run_command("durq_worker", "--burst", *args, env=worker_env, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert Job.objects.count() == before and WorkerProcess.objects.count() == 0


@pytest.mark.skipif(db_vendor() != "sqlite", reason="an in-memory database exists only on SQLite")
def test_in_memory_sqlite_is_refused(worker_env):
    env = {**worker_env, "DURQ_TEST_DB_IN_USE": ":memory:"}
    result = run_command("durq_worker", "--burst", env=env, timeout=60)
    assert result.returncode == 2
    assert "in-memory SQLite database" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_burst_prints_a_summary_and_exits_0(worker_env):
    jobs.effect.enqueue_many([{"tag": "b"} for _ in range(20)])
    jobs.fail.enqueue()
    result = run_command("durq_worker", "--burst", env=worker_env)
    assert result.returncode == 0, result.stderr
    assert "durq_worker --burst: 21 jobs" in result.stdout
    assert "finished" in result.stdout and "retrying" in result.stdout
    assert Effect.objects.filter(tag="b").count() == 20


# --- pools and queues ---------------------------------------------------------------------------


def test_a_slow_queue_does_not_delay_a_fast_one(spawn_worker):
    jobs.slow.enqueue(seconds=8)
    worker = spawn_worker("--queue", "slow:1", "--queue", "fast:2")
    wait_until(lambda: Job.objects.running().filter(queue="slow").exists(), 30, "the slow job to start")
    jobs.effect_fast.enqueue_many([{"tag": "quick"} for _ in range(10)])
    wait_until(lambda: Effect.objects.filter(tag="quick").count() == 10, 6, "the fast queue's jobs")
    assert Job.objects.get(queue="slow").status == Status.RUNNING  # still busy, not blocking anyone
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_pool_claims_no_more_than_its_slots(spawn_worker):
    jobs.slow.using(queue="default").enqueue_many([{"seconds": 3, "tag": "s"} for _ in range(6)])
    worker = spawn_worker("--queue", "default:2")
    wait_until(lambda: Job.objects.running().count() == 2, 30, "two running jobs")
    for _ in range(10):
        assert Job.objects.running().count() <= 2
        time.sleep(0.1)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_short_jobs_are_claimed_ahead_and_handed_back_unstarted_on_sigterm(spawn_worker):
    # Quick jobs first (highest priority) teach the pool its jobs are short; it then claims the
    # rest ahead. One blocker runs; the others wait in the buffer, leased, until the SIGTERM.
    jobs.effect_fast.using(queue="default", priority=10).enqueue_many([{"tag": "quick"} for _ in range(5)])
    blockers = jobs.until_stopped.enqueue_many([{"seconds": 60, "tag": f"b{n}"} for n in range(30)])
    worker = spawn_worker("--queue", "default:1", env={"DURQ_TEST_PREFETCH": "30"})
    wait_until(lambda: Effect.objects.filter(tag="quick").count() == 5, 30, "the quick jobs")
    wait_until(lambda: Job.objects.running().count() == 30, 10, "the blockers claimed ahead")
    assert Effect.objects.filter(tag__startswith="b").count() == 0
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    rows = list(Job.objects.filter(pk__in=[row.pk for row in blockers]))
    assert len(rows) == 30
    for row in rows:
        assert row.status == Status.WAITING and row.attempts == 0 and row.lease_expires_ms is None
    # Exactly one blocker had started; it saw should_stop() and was handed back too.
    assert [tag for tag in Effect.objects.values_list("tag", flat=True) if tag.startswith("b")] == [
        next(tag for tag in Effect.objects.values_list("tag", flat=True) if tag.endswith(":stopped"))
    ]
    assert "handed back 29 buffered job(s)" in worker.output()


def test_a_job_cancelled_while_buffered_never_runs(spawn_worker):
    from django_durq import ops

    jobs.effect_fast.using(queue="default", priority=10).enqueue_many([{"tag": "quick"} for _ in range(5)])
    jobs.effect.using(priority=5).enqueue(tag="blocker", sleep=3.0)
    later = jobs.effect.enqueue_many([{"tag": f"later{n}"} for n in range(5)])
    env = {"DURQ_TEST_PREFETCH": "30", "DURQ_TEST_HEARTBEAT": "0.3", "DURQ_TEST_LEASE": "5"}
    worker = spawn_worker("--queue", "default:1", env=env)
    wait_until(lambda: Effect.objects.filter(tag="quick").count() == 5, 30, "the quick jobs")
    wait_until(lambda: Job.objects.running().count() == 6, 10, "the blocker running, the rest claimed ahead")
    assert ops.cancel([later[2].pk]).stopping == [later[2].pk]
    wait_until(lambda: Effect.objects.filter(tag__startswith="later").count() == 4, 30, "the other buffered jobs")
    wait_until(lambda: Job.objects.filter(pk=later[2].pk, status=Status.CANCELLED).exists(), 10, "the cancellation")
    assert not Effect.objects.filter(tag="later2").exists()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def test_jobs_claimed_behind_a_long_handler_start_on_a_slot_that_slept(spawn_worker, tmp_path):
    """A pool wakes only the slots its buffer needs by its mean job time: after hundreds of no-op
    jobs, one slot for a claim of many. When that slot's next handler runs long, the jobs behind
    it must not wait for it (nor be handed back and claimed again) while the other slot sleeps.

    The worker first drains 500 no-ops and goes idle, so that one claim then takes the long job
    and the 100 behind it with no completion left to record: nothing else makes the dispatcher
    look again before its poll (5 s here), and starting the long handler kicks no one. The jobs
    behind are no-ops too, so the one free slot starts them all within the buffer's wait
    (``BUFFER_MAX_WAIT_S``) however slow the host's commits are.
    """
    warm_up = {row.pk for row in jobs.noop.enqueue_many([{} for _ in range(500)])}
    worker = spawn_worker("--queue", "default:2", env={"DURQ_TEST_PREFETCH": "30", "DURQ_TEST_POLL": "5"})
    wait_until(lambda: not Job.objects.filter(pk__in=warm_up).exists(), 30, "the no-ops that teach the pool")
    began = tmp_path / "long-began"
    with transaction.atomic():  # one commit, one wake-up: one claim takes them all
        long = jobs.until_stopped.using(priority=5).enqueue(seconds=30, tag="long", began=str(began))
        behind = {row.pk for row in jobs.noop.enqueue_many([{} for _ in range(100)])}
    wait_until(began.exists, 30, "the long handler to start")
    # Without a slot woken for them they wait for the dispatcher's next look, then are handed back.
    wait_until(lambda: not Job.objects.filter(pk__in=behind).exists(), 4, "the jobs behind the long one")
    assert Job.objects.get(pk=long.pk).status == Status.RUNNING, worker.output()

    def finished_behind() -> Counter[int]:
        ids = (int(n) for n in re.findall(r"job (\d+) \(tests\.noop\) finished", worker.output()))
        return Counter(n for n in ids if n in behind)

    wait_until(lambda: len(finished_behind()) == len(behind), 5, "their completions logged")
    assert set(finished_behind().values()) == {1}  # each ran once
    assert "handed back" not in worker.output()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_prefetch_0_claims_only_for_free_slots(spawn_worker):
    jobs.effect_fast.using(queue="default", priority=10).enqueue_many([{"tag": "quick"} for _ in range(5)])
    jobs.until_stopped.enqueue_many([{"seconds": 60, "tag": f"b{n}"} for n in range(10)])
    worker = spawn_worker("--queue", "default:2", env={"DURQ_TEST_PREFETCH": "0"})
    # The quick jobs come first (priority 10) and may be the two running at first: wait for the
    # blockers, which then hold both slots, and nothing else may be claimed meanwhile.
    blockers = Job.objects.running().filter(name="tests.until_stopped")
    wait_until(lambda: blockers.count() == 2, 30, "two blockers running")
    for _ in range(10):
        assert Job.objects.running().count() == 2
        time.sleep(0.1)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


# --- wake-up ------------------------------------------------------------------------------------


@pytest.mark.own_sessions  # on PostgreSQL the wake-up is a LISTEN
def test_idle_worker_wakes_on_enqueue_without_waiting_for_the_poll(spawn_worker):
    worker = spawn_worker("--queue", "default:1", env={"DURQ_TEST_POLL": "60"})
    wait_until(lambda: WorkerProcess.objects.exists(), 30, "the worker to register")
    time.sleep(0.5)  # let it finish its first probe and go idle
    for round_number in range(3):
        jobs.stamp.enqueue(tag=f"wake{round_number}")
        # The poll interval is 60 s: finishing well inside it proves the wake-up worked.
        wait_until(lambda n=round_number: Effect.objects.filter(tag=f"wake{n}").exists(), 10, "the woken worker")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_polling_is_the_safety_net(spawn_worker):
    worker = spawn_worker("--queue", "default:1", env={"DURQ_TEST_POLL": "0.5"})
    wait_until(lambda: WorkerProcess.objects.exists(), 30, "the worker to register")
    jobs.effect.using(run_in=1.5).enqueue(tag="delayed")
    wait_until(lambda: Effect.objects.filter(tag="delayed").exists(), 10, "the delayed job")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


# --- registration, shutdown, recycling ----------------------------------------------------------


def test_worker_registers_and_removes_itself(spawn_worker):
    worker = spawn_worker("--queue", "default:3", "--queue", "fast:1", "--worker-id", "box1:pool")
    row = wait_until(lambda: WorkerProcess.objects.filter(worker_id="box1:pool").first(), 30, "registration")
    assert row.pid == worker.pid and '"default": 3' in row.queues
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert not WorkerProcess.objects.exists()


def test_sigterm_lets_short_jobs_finish_and_exits_0(spawn_worker):
    jobs.effect.enqueue_many([{"tag": "short", "sleep": 1.0} for _ in range(4)])
    worker = spawn_worker("--queue", "default:4", "--grace", "10")
    wait_until(lambda: Job.objects.running().count() == 4, 30, "four running jobs")
    time.sleep(0.3)  # claimed is not yet started: let the slots take the jobs (a claimed, unstarted job is handed back)
    jobs.effect.enqueue_many([{"tag": "queued"} for _ in range(20)])
    signalled = time.time() * 1000
    worker.signal(signal.SIGTERM)
    for _ in range(4):
        worker.signal(signal.SIGTERM)  # repeated TERMs change nothing
    assert worker.wait(timeout=20) == 0
    assert Effect.objects.filter(tag="short").count() == 4
    assert not Effect.objects.filter(tag="queued").exists()
    assert all(row.attempts == 0 for row in Job.objects.all())
    assert all(ms < signalled for ms in Effect.objects.values_list("started_ms", flat=True))


def test_sigterm_releases_jobs_that_outlive_the_grace(spawn_worker, tmp_path):
    began = tmp_path / "began"
    stubborn = jobs.slow.using(queue="default").enqueue(seconds=30, tag="stubborn")
    polite = jobs.until_stopped.enqueue(seconds=30, tag="polite", began=str(began))
    worker = spawn_worker("--queue", "default:2", "--grace", "1")
    wait_until(lambda: Job.objects.running().count() == 2, 30, "both jobs running")
    # Claimed is not yet started: the polite handler must be running to see should_stop().
    wait_until(began.exists, 30, "the polite handler to start")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    polite_row = Job.objects.get(pk=polite.pk)
    stubborn_row = Job.objects.get(pk=stubborn.pk)
    # The polite job saw should_stop() and returned in time: handed back, not counted as done.
    assert Effect.objects.filter(tag="polite:stopped").count() == 1
    for row in (polite_row, stubborn_row):
        assert row.status == Status.WAITING and row.attempts == 0 and row.lease_expires_ms is None
    # Another worker takes them at once, not after the 30 s lease.
    successor = spawn_worker("--queue", "default:2")
    wait_until(lambda: Job.objects.running().count() == 2, 10, "the released jobs to be claimed again")
    successor.signal(signal.SIGTERM)
    successor.wait(timeout=20)


def test_second_sigint_exits_at_once(spawn_worker, tmp_path):
    began = tmp_path / "began"
    jobs.slow.using(queue="default").enqueue(seconds=30, began=str(began))
    worker = spawn_worker("--queue", "default:1", "--grace", "30")
    # The handler itself must be running: a job claimed but not yet started is handed back at the
    # first SIGINT, and the worker then stops cleanly (0) before the second one arrives.
    wait_until(began.exists, 30, "the handler to start")
    worker.signal(signal.SIGINT)
    time.sleep(0.3)
    worker.signal(signal.SIGINT)
    assert worker.wait(timeout=5) == exit_status.ABORTED, worker.output()
    row = Job.objects.get()
    assert row.status == Status.RUNNING and row.lease_expires_ms is not None  # left to expire


def test_max_jobs_recycles_cleanly_under_a_supervisor_loop(worker_env):
    queued = jobs.effect.enqueue_many([{"tag": "cycle"} for _ in range(30)])
    runs = 0
    while Job.objects.exists() and runs < 10:
        result = run_command("durq_worker", "--queue", "default:2", "--max-jobs", "10", env=worker_env)
        assert result.returncode == 0, result.stderr
        runs += 1
    assert runs == 3
    counts = effects_per_job()
    assert set(counts) == {row.pk for row in queued} and max(counts.values()) == 1


def test_a_hung_handler_times_out_and_its_slot_is_refilled(spawn_worker):
    hung = jobs.hang.using(max_attempts=1).enqueue(seconds=600)  # timeout 2 s
    jobs.effect.enqueue_many([{"tag": "after"} for _ in range(5)])
    worker = spawn_worker("--queue", "default:1")
    wait_until(lambda: Job.objects.filter(pk=hung.pk, status=Status.DEAD).exists(), 15, "the timeout to be recorded")
    assert Job.objects.get(pk=hung.pk).error_list[0]["kind"] == "timeout"
    wait_until(lambda: Effect.objects.filter(tag="after").count() == 5, 15, "the other jobs on the refilled slot")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def test_kill_9_mid_job_is_recovered_through_the_lease(spawn_worker):
    env = {"DURQ_TEST_LEASE": "2", "DURQ_TEST_HEARTBEAT": "0.5"}
    victim_job = jobs.slow.using(queue="default", lease=2).enqueue(seconds=60, tag="victim")
    victim = spawn_worker("--queue", "default:1", env=env)
    wait_until(lambda: Job.objects.running().exists(), 30, "the job to start")
    victim.kill()
    Job.objects.filter(pk=victim_job.pk).update(arguments='{"args":[],"kwargs":{"seconds":0,"tag":"victim"}}')
    rescuer = spawn_worker("--queue", "default:1", env=env)
    wait_until(lambda: Effect.objects.filter(tag="victim").exists(), 20, "the rescue")
    effect = Effect.objects.get(tag="victim")
    assert effect.pid == rescuer.pid and effect.token == 2
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(timeout=20) == 0


def test_the_first_ctrl_c_says_what_happens_and_the_last_line_counts_hand_backs(spawn_worker, tmp_path):
    began = tmp_path / "began"
    jobs.until_stopped.enqueue(seconds=30.0, began=str(began))
    worker = spawn_worker("--queue", "default:1")
    wait_until(began.exists, 30, "the handler to start")
    worker.signal(signal.SIGINT)
    assert worker.wait(timeout=30) == 0
    output = worker.output()
    assert "stopping: finishing 1 running job(s), up to 5 s; press Ctrl-C again to stop now" in output, output
    assert "0 jobs done, 1 handed back" in output, output
