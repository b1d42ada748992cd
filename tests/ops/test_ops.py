"""django_durq.ops against the real database: retry, purge, cancel, stats, health."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.contrib.auth.models import User
from django.test import Client

from django_durq import ops
from django_durq.clock import ManualClock, now_ms, use_clock
from django_durq.conf import get_settings
from django_durq.db.store import Store
from django_durq.handlers.context import JobContext
from django_durq.models import Job, QueueStat, WorkerProcess
from django_durq.testing import drain
from tests.conftest import db_vendor, wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect

pytestmark = pytest.mark.django_db

NOW = 1_800_000_000_000
POLL_S = 120  # a spawned worker's poll interval where a test proves a wake-up
DAY = 86_400_000


def make_job(status: str = "dead", *, queue: str = "default", name: str = "tests.effect", **fields: object) -> Job:
    values: dict[str, object] = {
        "name": name,
        "queue": queue,
        "status": status,
        "arguments": json.dumps({"args": [], "kwargs": {}}),
        "run_at_ms": NOW - 60_000,
        "created_ms": NOW - 60_000,
        "lease_ms": 30_000,
        "attempts": 3 if status == "dead" else 0,
        "max_attempts": 3,
        "finished_ms": NOW - 1_000 if status in ("dead", "finished", "cancelled") else None,
        "errors": json.dumps([{"attempt": 1, "kind": "exception", "message": "boom"}] if status == "dead" else []),
    }
    values.update(fields)
    return Job.objects.create(**values)


def ended_worker(worker_id: str) -> str:
    """The row of a worker that held a presence lock and has ended: its lock is released.

    On SQLite a lock file that no process holds; on PostgreSQL and MariaDB no session holds its lock.
    """
    from django_durq.db import presence

    WorkerProcess.objects.create(
        worker_id=worker_id, host="gone", pid=1, queues='{"default": 1}', started_ms=NOW, last_seen_ms=NOW, holds_lock=True
    )
    root = presence.directory("default")
    if root is not None:
        root.mkdir(exist_ok=True)
        (root / (worker_id + presence.SUFFIX)).touch()
    return worker_id


def test_running_jobs_whose_worker_ended_are_orphaned_with_their_worker_and_lease():
    gone = ended_worker("gone:1:aaaaaa")
    orphan = make_job("running", claimed_by=gone, lease_expires_ms=NOW + 30_000)
    # A worker writes its row before its first claim and its row goes only once it ended: no row, no worker.
    rowless = make_job("running", claimed_by="removed:1:1", lease_expires_ms=NOW + 40_000)
    WorkerProcess.objects.create(  # alive by its heartbeats: its job is not orphaned
        worker_id="beating:1:1", host="h", pid=1, queues='{"default": 1}', started_ms=now_ms(), last_seen_ms=now_ms()
    )
    make_job("running", claimed_by="beating:1:1", lease_expires_ms=NOW + 30_000)
    assert [(o.id, o.worker, o.lease_expires_ms) for o in ops.orphaned()] == [
        (orphan.pk, gone, NOW + 30_000),
        (rowless.pk, "removed:1:1", NOW + 40_000),
    ]
    report = ops.health(now_ms=now_ms())
    assert [(o["id"], o["worker"]) for o in report["orphaned_jobs"]] == [(orphan.pk, gone), (rowless.pk, "removed:1:1")]
    assert report["orphaned_jobs"][0]["lease_expires_at"].startswith("2027-01-15T08:00:30")


def wait_for(predicate, what: str, worker) -> None:
    try:
        wait_until(predicate, 30, what)
    except AssertionError as error:
        raise AssertionError(f"{error}\n--- worker output ---\n{worker.output()}") from None


def make_dead_letter(clock: ManualClock) -> Job:
    """A real dead letter: tests.fail run through its three attempts with backoff."""
    job = jobs.fail.enqueue(message="it broke")
    for _ in range(3):
        drain(clock=clock)
        clock.advance(120_000)
    job.refresh_from_db()
    assert job.status == "dead"
    return job


def claim(queue: str = "default", clock: ManualClock | None = None) -> list:
    now = (clock or ManualClock(NOW)).now_ms()
    return Store(get_settings().database).claim(queue, 10, now, "test-worker")


# --- retry --------------------------------------------------------------------------------------


def test_retry_dead_letter_runs_again_with_its_history_kept():
    clock = ManualClock(NOW)
    with use_clock(clock):
        job = make_dead_letter(clock)
        token = job.claim_token
        result = ops.retry([job.pk], now_ms=clock.now_ms())
        assert result.retried == [job.pk] and result.skipped == {}
        job.refresh_from_db()
        assert (job.status, job.attempts, job.run_at_ms, job.finished_ms) == ("waiting", 0, clock.now_ms(), None)
        assert len(job.error_list) == 3, "the error history is kept"
        assert job.claim_token == token, "the fencing token only ever grows"
        assert drain(clock=clock) == {"retrying": 1}
    job.refresh_from_db()
    assert job.attempts == 1 and len(job.error_list) == 4
    assert Effect.objects.filter(job_id=job.pk).count() == 4


def test_retry_touches_only_dead_and_cancelled_jobs():
    dead = make_job("dead")
    cancelled = make_job("cancelled")
    waiting = make_job("waiting", run_at_ms=NOW + DAY)
    finished = make_job("finished")
    running = make_job("waiting", queue="fast")
    [claimed] = claim("fast")
    before = Job.objects.get(pk=running.pk)

    result = ops.retry([dead.pk, cancelled.pk, waiting.pk, finished.pk, running.pk, 999_999_999], now_ms=NOW)

    assert sorted(result.retried) == sorted([dead.pk, cancelled.pk])
    assert result.skipped == {
        waiting.pk: "is waiting, so it is not retried",
        finished.pk: "is finished, so it is not retried",
        running.pk: "is running, so it is not retried",
        999_999_999: "no such job",
    }
    after = Job.objects.get(pk=running.pk)
    assert (after.status, after.claim_token, after.attempts, after.lease_expires_ms) == (
        "running",
        claimed.claim_token,
        1,
        before.lease_expires_ms,
    )
    assert Job.objects.get(pk=waiting.pk).run_at_ms == NOW + DAY


def test_retry_skips_a_job_whose_dedupe_key_is_held_and_retries_the_rest():
    first = make_job("dead", unique_key="report:7")
    holder = make_job("waiting", unique_key="report:7")
    other = make_job("dead", unique_key="report:8")
    plain = make_job("dead")

    result = ops.retry([first.pk, other.pk, plain.pk], now_ms=NOW)

    assert sorted(result.retried) == sorted([other.pk, plain.pk])
    assert result.skipped == {first.pk: f"its dedupe key 'report:7' is held by active job {holder.pk}"}
    assert Job.objects.get(pk=first.pk).status == "dead"
    assert Job.objects.get(pk=other.pk).status == "waiting"


def test_retry_failed_walks_a_large_selection_in_batches():
    Job.objects.bulk_create(
        [
            Job(
                name="tests.noop",
                queue="fast" if i % 3 == 0 else "default",
                status="dead",
                arguments='{"args":[],"kwargs":{}}',
                run_at_ms=NOW,
                created_ms=NOW,
                lease_ms=1000,
                attempts=5,
                finished_ms=NOW,
            )
            for i in range(1_200)
        ]
    )
    result = ops.retry_failed(queue="default", now_ms=NOW)
    assert len(result.retried) == 800 and not result.skipped
    assert Job.objects.filter(status="waiting", queue="default", attempts=0).count() == 800
    assert Job.objects.filter(status="dead").count() == 400
    assert len(ops.retry_failed(now_ms=NOW).retried) == 400


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("tests.admin.test_admin")
def test_a_retry_from_the_admin_or_ops_wakes_an_idle_worker(spawn_worker):
    if db_vendor() == "mysql":
        pytest.skip("MariaDB has no cross-process wake-up; workers find retried jobs at their next poll")
    now = now_ms()
    stranded = {
        status: make_job(
            status,
            name="tests.effect",
            arguments=json.dumps({"args": [], "kwargs": {"tag": f"{status}-woken"}}),
            run_at_ms=now - 60_000,
            finished_ms=now - 1_000,
        )
        for status in ("dead", "cancelled")
    }
    admin = Client()
    admin.force_login(User.objects.create_superuser("root"))
    retries = {
        "dead": lambda: admin.post(f"/admin/django_durq/deadletter/{stranded['dead'].pk}/retry/").status_code == 302,
        "cancelled": lambda: ops.retry([stranded["cancelled"].pk]).retried == [stranded["cancelled"].pk],
    }
    worker = spawn_worker("--queue", "default:1", env={"DURQ_TEST_POLL": str(POLL_S)})
    wait_for(lambda: WorkerProcess.objects.exists(), "the worker to register", worker)
    time.sleep(1)  # let it finish its first probe and go idle
    for status, retry in retries.items():
        started = time.monotonic()
        assert retry()
        # The poll interval is 120 s: running well before that means the retry woke the worker.
        wait_for(lambda status=status: Effect.objects.filter(tag=f"{status}-woken").exists(), f"the {status} job", worker)
        assert time.monotonic() - started < POLL_S / 4


# --- purge --------------------------------------------------------------------------------------


def test_purge_bound_is_inclusive_and_only_dead_letters_go():
    week = 7 * DAY
    older = make_job("dead", finished_ms=NOW - week - 1)
    exactly = make_job("dead", finished_ms=NOW - week)
    younger = make_job("dead", finished_ms=NOW - week + 1)
    other_queue = make_job("dead", queue="fast", finished_ms=NOW - 2 * week)
    kept = [make_job(status, finished_ms=NOW - 2 * week) for status in ("finished", "cancelled")]

    assert ops.purge(older_than_ms=week, queue="default", now_ms=NOW, dry_run=True) == 2
    assert Job.objects.count() == 6, "a dry run deletes nothing"
    assert ops.purge(older_than_ms=week, queue="default", now_ms=NOW) == 2
    assert not Job.objects.filter(pk__in=[older.pk, exactly.pk]).exists()
    assert Job.objects.filter(pk__in=[younger.pk, other_queue.pk, *(job.pk for job in kept)]).count() == 4
    assert ops.purge(older_than_ms=week, now_ms=NOW) == 1


def test_purge_in_batches_and_selection_deletes_dead_only():
    Job.objects.bulk_create(
        [
            Job(
                name="tests.noop",
                status="dead",
                arguments="{}",
                run_at_ms=NOW,
                created_ms=NOW,
                lease_ms=1000,
                finished_ms=NOW - i,
            )
            for i in range(1_100)
        ]
    )
    assert ops.purge(older_than_ms=0, now_ms=NOW) == 1_100
    waiting, dead = make_job("waiting"), make_job("dead")
    assert ops.purge([waiting.pk, dead.pk], dry_run=True) == 1
    assert ops.purge([waiting.pk, dead.pk]) == 1
    assert list(Job.objects.values_list("pk", flat=True)) == [waiting.pk]
    assert ops.purge(Job.objects.all()) == 0


# --- cancel -------------------------------------------------------------------------------------


def test_cancel_waiting_jobs_and_ask_running_ones_to_stop():
    waiting = make_job("waiting", run_at_ms=NOW + DAY, unique_key="nightly")
    running = make_job("waiting", queue="fast")
    [claimed] = claim("fast")
    done = make_job("finished")

    result = ops.cancel([waiting.pk, running.pk, done.pk], now_ms=NOW)

    assert result.cancelled == [waiting.pk] and result.stopping == [running.pk]
    assert result.skipped == {done.pk: "is finished, so it is not cancelled"}
    waiting.refresh_from_db()
    assert (waiting.status, waiting.finished_ms, waiting.unique_active) == ("cancelled", NOW, None)
    running.refresh_from_db()
    assert (running.status, running.stop_requested) == ("running", True)
    # The worker learns it at its next lease renewal, and the handler through should_stop().
    store = Store(get_settings().database)
    ctx = JobContext(claimed, worker_id="test-worker", store=store, clock=ManualClock(NOW), shutdown=threading.Event())
    assert not ctx.should_stop()
    assert ctx.heartbeat()
    assert ctx.should_stop()


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_cancel_stops_a_running_handler_in_a_real_worker(spawn_worker):
    job = jobs.until_stopped.enqueue(seconds=60)
    worker = spawn_worker("--queue", "default:1", env={"DURQ_TEST_HEARTBEAT": "0.5"})
    wait_for(lambda: Job.objects.filter(pk=job.pk, status="running").exists(), "the job to start", worker)
    assert ops.cancel([job.pk]).stopping == [job.pk]
    wait_for(lambda: Job.objects.filter(pk=job.pk, status="cancelled").exists(), "the cancel", worker)
    assert Effect.objects.get(job_id=job.pk).tag == "stopper:stopped"
    assert Job.objects.get(pk=job.pk).last_error["kind"] == "cancelled"


# --- stats --------------------------------------------------------------------------------------


def test_stats_per_queue():
    heartbeat = get_settings().heartbeat_interval_ms
    make_job("waiting", run_at_ms=NOW - 5_000)
    make_job("waiting", run_at_ms=NOW - 1_000)
    make_job("waiting", run_at_ms=NOW + 60_000)
    make_job("waiting", run_at_ms=NOW - 1_000, queue="fast")
    claim("fast")
    for _ in range(3):
        make_job("dead", queue="fast")
    make_job("dead", queue="misc")
    make_job("finished")
    minute = NOW // 60_000 * 60_000
    QueueStat.objects.bulk_create(
        [
            QueueStat(queue="default", minute_ms=minute, finished=5, failed=1),
            QueueStat(queue="default", minute_ms=minute - 60_000, finished=7, failed=0),
            QueueStat(queue="default", minute_ms=minute - 30 * 60_000, finished=10, failed=2),
            QueueStat(queue="default", minute_ms=minute - 120 * 60_000, finished=100, failed=100),
            QueueStat(queue="fast", minute_ms=minute - 59 * 60_000, finished=3, failed=0),
        ]
    )
    live = {"queues": json.dumps({"default": 4, "fast": 2}), "started_ms": NOW - DAY, "pid": 1, "host": "a"}
    WorkerProcess.objects.create(worker_id="a:1:x", last_seen_ms=NOW - heartbeat, **live)
    WorkerProcess.objects.create(worker_id="b:1:x", last_seen_ms=NOW - 3 * heartbeat, **{**live, "host": "b"})
    WorkerProcess.objects.create(worker_id="c:1:x", last_seen_ms=NOW - 3 * heartbeat - 1, **{**live, "host": "c"})

    rows = {row.queue: row for row in ops.stats(now_ms=NOW)}

    assert set(rows) >= {"default", "fast", "slow", "misc"}
    default, fast = rows["default"], rows["fast"]
    assert (default.waiting, default.delayed, default.running, default.dead, default.oldest_wait_ms) == (2, 1, 0, 0, 5_000)
    assert (default.finished_last_minute, default.failed_last_minute) == (5 + 7, 1)
    assert (default.finished_last_hour, default.failed_last_hour) == (22, 3)
    assert (default.workers, default.slots) == (2, 8)
    assert (fast.waiting, fast.running, fast.dead, fast.oldest_wait_ms, fast.finished_last_hour) == (0, 1, 3, None, 3)
    assert (rows["slow"].workers, rows["misc"].dead) == (0, 1)
    assert rows["default"].as_dict()["queue"] == "default"
    capped = {row.queue: row for row in ops.stats(now_ms=NOW, count_cap=2)}
    assert (capped["default"].waiting, capped["fast"].dead, capped["misc"].dead) == (2, 3, 1), "stops at cap + 1"


def test_throughput_buckets_cover_the_last_hour():
    minute = NOW // 60_000 * 60_000
    QueueStat.objects.bulk_create(
        [
            QueueStat(queue="default", minute_ms=minute, finished=5, failed=1),
            QueueStat(queue="fast", minute_ms=minute, finished=2, failed=0),
            QueueStat(queue="default", minute_ms=minute - 59 * 60_000, finished=4, failed=4),
            QueueStat(queue="default", minute_ms=minute - 60 * 60_000, finished=9, failed=9),
        ]
    )
    buckets = ops.throughput(now_ms=NOW)
    assert len(buckets) == 60 and buckets[-1].minute_ms == minute
    assert (buckets[-1].finished, buckets[-1].failed) == (7, 1)
    assert (buckets[0].finished, buckets[0].failed) == (4, 4)
    assert sum(bucket.finished for bucket in buckets[1:-1]) == 0
    assert ops.throughput(now_ms=NOW, queue="fast")[-1].finished == 2


def test_health():
    report = ops.health(now_ms=NOW)
    assert report["healthy"] is False and report["problems"] == ["0 live workers, fewer than 1"]
    WorkerProcess.objects.create(worker_id="a", host="a", pid=1, queues='{"default": 1}', started_ms=NOW, last_seen_ms=NOW)
    assert ops.health(now_ms=NOW) == {
        "healthy": True,
        "database": "ok",
        "workers": 1,
        "oldest_wait_seconds": None,
        "unserved_queues": {},
        "paused_queues": [],
        "orphaned_jobs": [],
        "unknown_type_last_hour": {},
        "problems": [],
    }
    make_job("waiting", run_at_ms=NOW - 400_000)
    report = ops.health(now_ms=NOW, max_wait_ms=300_000)
    assert report["healthy"] is False and report["oldest_wait_seconds"] == 400
    assert ops.health(now_ms=NOW, max_wait_ms=500_000)["healthy"] is True


def test_due_jobs_in_a_queue_no_live_worker_serves_are_reported():
    serving = {"host": "a", "pid": 1, "started_ms": NOW - DAY}
    WorkerProcess.objects.create(worker_id="a:1:x", queues='{"default": 2}', last_seen_ms=NOW, **serving)
    WorkerProcess.objects.create(worker_id="b:1:x", queues='{"video": 1}', last_seen_ms=NOW - DAY, **serving)
    make_job("waiting", queue="default")
    make_job("waiting", queue="video")
    make_job("waiting", queue="video")
    make_job("waiting", queue="vidoe", run_at_ms=NOW - 1)
    make_job("waiting", queue="later", run_at_ms=NOW + 60_000)
    make_job("dead", queue="reports")
    assert ops.unserved(now_ms=NOW) == {"video": 2, "vidoe": 1}, "the worker serving video is no longer live"
    assert ops.unserved(now_ms=NOW, count_cap=1) == {"video": 2, "vidoe": 1}, "a count stops at cap + 1"
    report = ops.health(now_ms=NOW, max_wait_ms=DAY)
    assert report["healthy"] is False and report["unserved_queues"] == {"video": 2, "vidoe": 1}
    assert report["problems"] == [
        "2 due jobs in queue 'video', which no live worker serves",
        "1 due job in queue 'vidoe', which no live worker serves",
    ]


def test_failed_lists_dead_letters_newest_first():
    old = make_job("dead", finished_ms=NOW - 10)
    new = make_job("dead", finished_ms=NOW)
    other = make_job("dead", queue="fast", finished_ms=NOW - 5)
    make_job("waiting")
    assert [job.pk for job in ops.failed()] == [new.pk, other.pk, old.pk]
    assert [job.pk for job in ops.failed(queue="default", limit=1)] == [new.pk]


def test_queue_names_come_from_settings_registry_and_rows_of_every_status():
    make_job("waiting", queue="adhoc-waiting")
    make_job("running", queue="adhoc-running", lease_expires_ms=1, claim_token=1)
    make_job("dead", queue="adhoc-dead")
    make_job("finished", queue="adhoc-finished")
    make_job("cancelled", queue="adhoc-cancelled")
    names = ops.queue_names()
    assert {"adhoc-waiting", "adhoc-running", "adhoc-dead", "adhoc-finished", "adhoc-cancelled"} <= set(names)
    assert set(get_settings().queues) <= set(names) and names == sorted(names)
