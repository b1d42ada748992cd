"""Retention: finished, cancelled and dead jobs pruned after KEEP_FINISHED / KEEP_DEAD, globally and per
queue, in bounded keyset batches; the table stays flat under steady load; a real worker prunes."""

from __future__ import annotations

import signal

import pytest

from django_durq.clock import ManualClock, use_clock
from django_durq.conf import get_settings
from django_durq.models import Job, Status
from django_durq.testing import drain
from django_durq.worker.duties import RetentionDuty
from tests.conftest import wait_until
from tests.ledger import jobs

NOW = 1_800_000_000_000
MINUTE = 60_000


@pytest.fixture
def durq(settings):
    """Change DURQ settings for one test: ``durq(KEEP_FINISHED=60, QUEUES={...})``."""

    def change(**values: object) -> None:
        settings.DURQ = {**settings.DURQ, **values}

    return change


def make(status: str, finished_ms: int | None, queue: str = "default") -> Job:
    return Job.objects.create(
        name="tests.noop",
        queue=queue,
        status=status,
        arguments='{"args":[],"kwargs":{}}',
        run_at_ms=0,
        created_ms=0,
        lease_ms=1_000,
        finished_ms=finished_ms,
    )


def left() -> set[tuple[str, str, int | None]]:
    return set(Job.objects.values_list("queue", "status", "finished_ms"))


@pytest.mark.django_db
def test_finished_jobs_go_after_keep_finished_and_dead_letters_stay_by_default(durq):
    durq(KEEP_FINISHED=60)
    make(Status.FINISHED, NOW - 2 * MINUTE)
    make(Status.FINISHED, NOW - 30_000)
    make(Status.DEAD, NOW - 10**9)
    make(Status.CANCELLED, NOW - 10**9)
    make(Status.WAITING, None)
    make(Status.RUNNING, None)
    make(Status.WAITING, NOW - 10**9)  # a dead letter an operator retried: its old finish time stays
    assert RetentionDuty(get_settings()).run_once(NOW) == {"finished": 1, "cancelled": 0, "dead": 0}
    assert left() == {
        ("default", "finished", NOW - 30_000),
        ("default", "dead", NOW - 10**9),
        ("default", "cancelled", NOW - 10**9),
        ("default", "waiting", None),
        ("default", "running", None),
        ("default", "waiting", NOW - 10**9),
    }


@pytest.mark.django_db
def test_keep_dead_prunes_dead_and_cancelled_jobs(durq):
    durq(KEEP_DEAD=3600)
    make(Status.DEAD, NOW - 3601_000)
    make(Status.DEAD, NOW - 3599_000)
    make(Status.CANCELLED, NOW - 3601_000)
    make(Status.FINISHED, NOW - 1)  # KEEP_FINISHED is 0: not kept at all
    assert RetentionDuty(get_settings()).run_once(NOW) == {"finished": 1, "cancelled": 1, "dead": 1}
    assert left() == {("default", "dead", NOW - 3599_000)}


@pytest.mark.django_db
def test_a_queue_setting_overrides_the_global_one_for_its_jobs(durq):
    durq(
        KEEP_FINISHED=3600,
        KEEP_DEAD=None,
        QUEUES={"default": {}, "fast": {"keep_finished": 10}, "slow": {"keep_dead": 60}},
    )
    for queue in ("default", "fast", "slow", "unlisted"):
        make(Status.FINISHED, NOW - 2 * MINUTE, queue)
        make(Status.DEAD, NOW - 2 * MINUTE, queue)
    assert RetentionDuty(get_settings()).run_once(NOW) == {"finished": 1, "cancelled": 0, "dead": 1}
    assert ("fast", "finished", NOW - 2 * MINUTE) not in left()
    assert ("slow", "dead", NOW - 2 * MINUTE) not in left()
    assert len(left()) == 6
    assert RetentionDuty(get_settings()).run_once(NOW + 3600_000) == {"finished": 3, "cancelled": 0, "dead": 0}
    assert left() == {(queue, "dead", NOW - 2 * MINUTE) for queue in ("default", "fast", "unlisted")}


@pytest.mark.django_db
def test_a_pass_deletes_in_bounded_batches_and_the_next_pass_goes_on(durq):
    durq(KEEP_FINISHED=60)
    Job.objects.bulk_create(
        Job(
            name="tests.noop",
            status=Status.FINISHED,
            arguments="{}",
            run_at_ms=0,
            created_ms=0,
            lease_ms=1_000,
            finished_ms=NOW - MINUTE - 1 - index % 3,  # ties on finish time: the key goes on by id
        )
        for index in range(1_250)
    )
    make(Status.FINISHED, NOW)
    duty = RetentionDuty(get_settings(), batch_size=500, max_batches=2)
    assert duty.run_once(NOW)["finished"] == 1_000
    assert duty.run_once(NOW)["finished"] == 250
    assert duty.run_once(NOW)["finished"] == 0
    assert left() == {("default", "finished", NOW)}


@pytest.mark.django_db
def test_the_table_stays_flat_under_steady_load(durq):
    durq(KEEP_FINISHED=300)
    clock = ManualClock(start_ms=NOW)
    sizes = []
    with use_clock(clock):
        for _ in range(16):
            jobs.noop.enqueue_many([{"n": n} for n in range(15)])
            assert drain(clock=clock) == {"finished": 15}
            RetentionDuty(get_settings()).run_once(clock.now_ms())
            sizes.append(Job.objects.count())
            clock.advance(MINUTE)
    # Kept five minutes: the jobs of this minute and of the five before it, then no more.
    assert sizes[:6] == [15, 30, 45, 60, 75, 90]
    assert set(sizes[6:]) == {90}


@pytest.mark.processes
def test_a_worker_keeps_finished_jobs_then_prunes_them(spawn_worker):
    jobs.noop.enqueue_many([{"n": n} for n in range(20)])
    worker = spawn_worker("--queue", "default:2", env={"DURQ_TEST_KEEP_FINISHED": "1"})
    wait_until(lambda: Job.objects.filter(status=Status.FINISHED).count() >= 10, timeout=60, message="finished jobs kept")
    wait_until(lambda: not Job.objects.exists(), timeout=60, message="finished jobs pruned")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()


@pytest.mark.django_db
def test_per_minute_counters_older_than_two_days_are_pruned():
    from django_durq.models import QueueStat
    from django_durq.worker.duties import StatsRetention

    now = 1_800_000_000_000
    day = 24 * 3600 * 1000
    for age_days in (0, 1, 3, 5):
        QueueStat.objects.create(queue="default", minute_ms=now - age_days * day, finished=1)
    assert StatsRetention(get_settings()).run_once(now) == {"deleted": 2}
    assert sorted(now - m for m in QueueStat.objects.values_list("minute_ms", flat=True)) == [0, day]
