"""Flow control under races: each promise of docs/flow-control.md against the way it was once broken.

- A limit holds its place for as long as a handler runs: a timed-out (abandoned) handler, and a
  holder paused with SIGSTOP, keep their key's place until the thread ends or the process is gone.
- One limit key is one scope across queues and job types.
- A rate's start log is kept as long as the longest window counted on its key; a job held back
  by its own rate does not hold back other job types of its key.
- A job held back by a rate starts when its window opens, not at the next poll.
- After a pause commits, no job of the queue starts past the stated latency; jobs claimed ahead
  are handed back, their attempts not spent.
- A debounce ``replace`` that changes a waiting job's key between a limited claim's count and its
  claim does not slip the job past the limit of its new key.

Overlap checks read a ledger of start and end times that the handlers write (tests.ledger.jobs).
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import pytest
from django.db import connection, connections

from django_durq import ops
from django_durq.clock import ManualClock, use_clock
from django_durq.conf import get_settings, hooks
from django_durq.db import dialect_for, places
from django_durq.db.flow import claim_limited
from django_durq.db.store import Store
from django_durq.models import Job, LimitPlace, WorkerProcess
from django_durq.testing import drain
from tests.conftest import db_vendor, wait_until
from tests.ledger import jobs
from tests.worker.test_limits import Run, runs, wait_for_runs

START = 1_800_000_000_000


@pytest.fixture
def clock():
    manual = ManualClock(start_ms=START)
    with use_clock(manual):
        yield manual


def claim(clock: ManualClock, queue: str = "default", limit: int = 10, worker: str = "w1"):
    limits = get_settings().queue(queue).limits
    return claim_limited(dialect_for(connection), queue, limit, clock.now_ms(), worker, limits)


def finish(claimed: list) -> None:
    """What a worker does when handlers return: complete their jobs and free their places."""
    dialect = dialect_for(connection)
    leases = [(job.id, job.claim_token) for job in claimed]
    assert dialect.complete(leases)
    places.free(dialect, leases)


def overlaps(ran: list[Run]) -> list[str]:
    """Pairs of runs of one key whose handlers ran at the same time."""
    found = []
    for key in {run.key for run in ran}:
        key_runs = sorted((run for run in ran if run.key == key), key=lambda run: run.started)
        for before, after in itertools.pairwise(key_runs):
            if after.started < before.ended:
                found.append(
                    f"{key}: job {after.job_id} (attempt {after.attempt}, pid {after.pid}) started"
                    f" {before.ended - after.started} ms before job {before.job_id} (attempt {before.attempt},"
                    f" pid {before.pid}) ended"
                )
    return found


def workers_registered(count: int) -> None:
    wait_until(lambda: WorkerProcess.objects.count() >= count, 60, f"{count} worker(s) to register")


# --- places, and one key as one scope (claims in this process) ------------------------------------


@pytest.mark.django_db
def test_only_jobs_counted_against_a_running_limit_are_placed_and_none_writes_a_place(clock):
    jobs.noop.enqueue()
    assert len(Store("default").claim("default", 10, clock.now_ms(), "fast")) == 1  # the fast claim
    jobs.metered.enqueue(log="/dev/null")  # a queue with a rate only
    jobs.noop.enqueue()  # no limit, claimed by a limited claim
    (metered,) = claim(clock, "webhooks")
    (plain,) = claim(clock, "default")
    assert not metered.placed and not plain.placed
    jobs.capped.enqueue(log="/dev/null")  # a queue with a max_running
    jobs.rated_per_key.enqueue(key="k", log="/dev/null")  # a key, a rate only
    (video,) = claim(clock, "video")
    (default,) = claim(clock, "default")
    assert video.placed and default.placed
    assert not LimitPlace.objects.exists()  # their running rows are their places


@pytest.mark.django_db
def test_what_a_limit_counts_is_each_running_row_by_its_key_in_every_queue_and_by_its_queue(clock):
    jobs.one_per_key.enqueue(key="k1", log="/dev/null")
    jobs.one_per_key.enqueue(key="k2", log="/dev/null")
    jobs.capped.enqueue(log="/dev/null")
    assert len(claim(clock, "default")) == 2 and len(claim(clock, "video")) == 1
    dialect = dialect_for(connection)
    now = clock.now_ms()
    assert places.counts(dialect, "default", now) == (2, {"k1": 1, "k2": 1})
    assert places.counts(dialect, "video", now) == (1, {"k1": 1, "k2": 1})
    assert sorted(places.held(dialect, now), key=str) == sorted(
        [("default", "k1", 1), ("default", "k2", 1), ("video", None, None)], key=str
    )


@pytest.mark.django_db
def test_a_key_at_its_limit_in_one_queue_holds_back_its_jobs_in_another_queue(clock):
    jobs.one_per_key.enqueue(key="video-7", log="/dev/null")
    (held,) = claim(clock, "default")
    mate = jobs.key_mate.enqueue(key="video-7", log="/dev/null")
    same_type = jobs.one_per_key.using(queue="fast").enqueue(key="video-7", log="/dev/null")
    other_key = jobs.key_mate.enqueue(key="video-8", log="/dev/null")
    assert [job.id for job in claim(clock, "fast")] == [other_key.id]
    assert set(Job.objects.filter(pk__in=[mate.pk, same_type.pk]).values_list("status", flat=True)) == {"waiting"}
    assert held.id


@pytest.mark.django_db
def test_a_job_held_by_its_own_rate_does_not_hold_back_another_job_type_of_its_key(clock):
    # More rate-limited jobs than one round of candidates reads: the claim must read past them.
    for _ in range(60):
        jobs.rated_per_key.enqueue(key="shop-1", log="/dev/null")
    one = jobs.one_per_key.enqueue(key="shop-1", log="/dev/null")
    outcomes = drain(queue="default", clock=clock)
    assert outcomes["finished"] == 5, "four of the rate (4/s) and the job whose limit is one running"
    assert not Job.objects.filter(pk=one.pk).exists()


@pytest.mark.django_db
def test_an_hourly_rate_keeps_its_starts_when_a_faster_rate_shares_its_key(clock):
    hourly = [jobs.hourly_per_key.enqueue(key="api", log="/dev/null") for _ in range(2)]
    claimed = claim(clock)
    assert sorted(job.id for job in claimed) == sorted(job.id for job in hourly)
    finish(claimed)
    clock.advance(71_000)  # past the faster rate's window and the minute starts are kept beyond it
    fast = jobs.rated_per_key.enqueue(key="api", log="/dev/null")  # 4/s on the same key
    claimed = claim(clock)
    assert [job.id for job in claimed] == [fast.id]
    finish(claimed)
    third = jobs.hourly_per_key.enqueue(key="api", log="/dev/null")
    clock.advance(1_000)
    assert claim(clock) == [], "a third start of the key within the hour of the 2/h limit"
    assert Job.objects.get(pk=third.pk).status == "waiting"
    clock.set(START + 3_600_000 + 1)
    assert [job.id for job in claim(clock)] == [third.id]


@pytest.mark.django_db(transaction=True)
def test_a_replace_that_changes_the_key_between_count_and_claim_does_not_pass_the_new_keys_limit(clock, monkeypatch):
    if db_vendor() == "sqlite":
        pytest.skip("SQLite has one writer: no enqueue commits between a limited claim's count and its claim")
    debounced = jobs.one_per_key.using(unique="debounce", on_duplicate="replace")
    full = jobs.one_per_key.enqueue(key="busy", log="/dev/null")
    assert [job.id for job in claim(clock, worker="holder")] == [full.id]  # "busy" is at its limit
    waiting = debounced.enqueue(key="free", log="/dev/null")

    counted, go_on = threading.Event(), threading.Event()
    real_jitter = hooks.jitter

    def hold_after_counting(point: str) -> None:
        if point == "admit" and threading.current_thread().name == "claimer":
            counted.set()
            go_on.wait(30)
        real_jitter(point)

    monkeypatch.setattr(hooks, "jitter", hold_after_counting)
    claimed: list[int] = []

    def claimer() -> None:
        try:
            claimed.extend(job.id for job in claim(clock, worker="racer"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=claimer, name="claimer")
    thread.start()
    try:
        assert counted.wait(30), "the claim admitted the debounced job under its old key"
        replaced = debounced.enqueue(key="busy", log="/dev/null")  # commits while the claimer holds its turn
        assert replaced.pk == waiting.pk and replaced.replaced
    finally:
        go_on.set()
        thread.join(30)
    assert claimed == [], "the job was claimed under a key whose limit it was never counted against"
    row = Job.objects.get(pk=waiting.pk)
    assert (row.status, row.limit_key, row.attempts) == ("waiting", "busy", 0)


@pytest.mark.django_db(transaction=True)
def test_a_claimer_counting_a_key_holds_back_claimers_of_the_key_in_other_queues(clock, monkeypatch):
    if db_vendor() == "sqlite":
        pytest.skip("SQLite has one writer: a second claimer waits for the first one's commit whatever it counts")
    first = jobs.one_per_key.enqueue(key="k", log="/dev/null")
    mate = jobs.key_mate.enqueue(key="k", log="/dev/null")  # the same key, another type, another queue

    counted, go_on = threading.Event(), threading.Event()
    real_jitter = hooks.jitter

    def hold_after_counting(point: str) -> None:
        if point == "admit" and threading.current_thread().name == "default":
            counted.set()
            go_on.wait(30)
        real_jitter(point)

    monkeypatch.setattr(hooks, "jitter", hold_after_counting)
    claimed: dict[str, list[int]] = {}

    def claimer(queue: str) -> None:
        try:
            claimed[queue] = [job.id for job in claim(clock, queue, worker=queue)]
        finally:
            connections.close_all()

    holder = threading.Thread(target=claimer, args=("default",), name="default")
    holder.start()
    other = threading.Thread(target=claimer, args=("fast",), name="fast")
    try:
        assert counted.wait(30), "the first claimer did not admit the key's job"
        other.start()
        other.join(1.0)  # it counts the key only once the first claimer has claimed
        assert "fast" not in claimed, "a claimer of another queue counted the key while the first one held its count"
    finally:
        go_on.set()
        holder.join(30)
        other.join(30)
    assert claimed == {"default": [first.id], "fast": []}
    assert Job.objects.get(pk=mate.pk).status == "waiting"


# --- real workers --------------------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.one_leg
@pytest.mark.django_db(transaction=True)
def test_one_key_in_two_queues_and_two_job_types_never_runs_twice_at_once(spawn_worker, tmp_path):
    log = tmp_path / "runs.log"
    workers = [spawn_worker("--queue", "default:2"), spawn_worker("--queue", "fast:2")]
    workers_registered(2)
    for _ in range(8):
        jobs.one_per_key.enqueue(key="k", log=str(log), hold=0.1)
        jobs.key_mate.enqueue(key="k", log=str(log), hold=0.1)
        jobs.one_per_key.using(queue="fast").enqueue(key="k", log=str(log), hold=0.1)
    ran = wait_for_runs(log, 24, 120, workers)
    assert len({run.job_id for run in ran}) == 24
    assert overlaps(ran) == []


@pytest.mark.processes
@pytest.mark.one_leg
@pytest.mark.django_db(transaction=True)
def test_a_timed_out_handler_keeps_its_keys_place_until_its_thread_ends(spawn_worker, tmp_path):
    log = tmp_path / "runs.log"
    # The first ignores its 1 s timeout and runs 4 s: the worker abandons its thread after the
    # timeout and its grace (the job becomes a dead letter), and the thread runs on.
    overrun = jobs.keyed_overrun.enqueue(key="k", log=str(log), hold=4.0)
    after = jobs.keyed_overrun.enqueue(key="k", log=str(log), hold=0.2)
    worker = spawn_worker("--queue", "default:2")
    ran = {run.job_id: run for run in wait_for_runs(log, 2, 60, [worker])}
    assert Job.objects.get(pk=overrun.pk).error_list[-1]["kind"] == "timeout"
    assert ran[after.pk].started >= ran[overrun.pk].ended, overlaps(list(ran.values()))


@pytest.mark.processes
@pytest.mark.one_leg
@pytest.mark.django_db(transaction=True)
def test_a_holder_paused_past_its_lease_keeps_its_keys_place_until_it_resumes(spawn_worker, tmp_path):
    log = tmp_path / "runs.log"
    env = {"DURQ_TEST_LEASE": "2", "DURQ_TEST_HEARTBEAT": "0.5", "DURQ_TEST_POLL": "0.25"}
    holder = spawn_worker("--queue", "default:1", env=env)
    workers_registered(1)
    first = jobs.one_per_key.using(lease=2).enqueue(key="k", log=str(log), hold_first=4.0)
    wait_until(lambda: Job.objects.filter(pk=first.pk, status="running").exists(), 30, "the holder to start")
    second = jobs.one_per_key.using(lease=2).enqueue(key="k", log=str(log), hold=0.1)
    other = spawn_worker("--queue", "default:2", env=env)
    workers_registered(2)
    time.sleep(0.5)
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        # Past the 2 s lease, within the time a database session may stay silent (10 s).
        time.sleep(5)
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    wait_until(lambda: not Job.objects.filter(pk__in=[first.pk, second.pk]).active().exists(), 60, "both jobs to end")
    time.sleep(0.5)  # a run of the first job's first attempt, still under way, writes its line
    ran = runs(log)
    assert overlaps(ran) == [], "\n".join([holder.output()[-2000:], other.output()[-2000:]])


@pytest.mark.processes
@pytest.mark.one_leg
@pytest.mark.django_db(transaction=True)
def test_a_job_held_by_a_rate_starts_when_its_window_opens_not_at_the_next_poll(spawn_worker, tmp_path):
    log = tmp_path / "runs.log"
    worker = spawn_worker("--queue", "webhooks:4", env={"DURQ_TEST_POLL": "60"})
    workers_registered(1)
    jobs.metered.enqueue_many([{"log": str(log)} for _ in range(35)])  # the queue's rate is 10/s
    # Four windows' worth; the cap is far below the poll interval, which would explain nothing.
    ran = wait_for_runs(log, 35, 20, [worker])
    claims = sorted(run.claimed for run in ran)
    for n in range(len(claims) - 10):
        assert claims[n + 10] - claims[n] >= 1_000, f"11 starts within {claims[n + 10] - claims[n]} ms"


# A job a worker claimed before a pause may start up to this long after it commits (the stated
# 10 ms, plus a margin for the time from the worker's decision to the handler's first line).
PAUSE_SLACK_MS = 100


@pytest.mark.processes
@pytest.mark.one_leg
@pytest.mark.django_db(transaction=True)
def test_after_a_pause_commits_no_job_claimed_ahead_starts_past_the_stated_latency(spawn_worker, tmp_path):
    log = tmp_path / "runs.log"
    queued = jobs.paced.enqueue_many([{"log": str(log), "hold": 0.15} for _ in range(40)])
    # One slot, and a horizon that makes it claim about ten of these 150 ms jobs ahead.
    worker = spawn_worker("--queue", "default:1", env={"DURQ_TEST_PREFETCH": "1.5"})
    wait_for_runs(log, 2, 60, [worker])
    wait_until(lambda: Job.objects.filter(status="running").count() >= 4, 30, "jobs to be claimed ahead")
    assert ops.pause("default")
    paused_at = time.time_ns() // 1_000_000
    time.sleep(2.5)  # the buffer would have run out by now
    late = [run for run in runs(log) if run.started > paused_at + PAUSE_SLACK_MS]
    assert late == [], f"{len(late)} job(s) started after the pause, the last {late[-1].started - paused_at} ms after"
    waiting = Job.objects.filter(pk__in=[job.pk for job in queued], status="waiting")
    assert waiting.count() >= 30
    assert not waiting.filter(attempts__gt=0).exists(), "a job claimed ahead spent an attempt"
    assert not Job.objects.filter(status="running").exists(), worker.output()[-3000:]
