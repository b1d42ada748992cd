"""A worker that holds no presence lock (behind a transaction pooler) is judged by its row's beats.

In this process against the real database: a row silent for ``GONE_S`` gives its worker's
running jobs over, a row written in time or one that does not say it beats keeps them, a leader
that has only just started watching judges no row, and the worker's own beat says when its
handlers must stop. The real-process proof, through PgBouncer with ``kill -9``, is
tests/db/test_pgbouncer_takeover.py.
"""

from __future__ import annotations

import json
import time

import pytest

from django_durq.clock import ManualClock
from django_durq.conf import get_settings
from django_durq.models import Job, WorkerProcess
from django_durq.worker import row_presence
from django_durq.worker.maintenance import StaleWorkers
from django_durq.worker.row_presence import RowBeat
from django_durq.worker.runtime import Runtime
from tests.ops.test_ops import NOW, make_job

pytestmark = pytest.mark.django_db(transaction=True)


def beating_worker(worker_id: str, silent_ms: int, beat_ms: int | None = row_presence.BEAT_MS) -> str:
    """The row of a worker that holds no lock, last written ``silent_ms`` before NOW."""
    WorkerProcess.objects.create(
        worker_id=worker_id,
        host="pooled",
        pid=1,
        queues='{"default": 1}',
        started_ms=NOW - 60_000,
        last_seen_ms=NOW - silent_ms,
        holds_lock=False,
        beat_ms=beat_ms,
    )
    return worker_id


def watching_leader(for_s: float = row_presence.GONE_S + 1) -> StaleWorkers:
    """The leader's duty, its passes unbroken for ``for_s``."""
    runtime = Runtime(settings=get_settings(), clock=ManualClock(NOW), worker_id="leader:1:000000")
    duty = StaleWorkers(runtime)
    duty.run_once(NOW - 1_000)  # its first pass: the rows are read
    duty._passes_since = time.monotonic() - for_s
    return duty


def running_of(worker_id: str) -> Job:
    return make_job("running", claimed_by=worker_id, attempts=1, max_attempts=3, lease_expires_ms=NOW + 50_000)


def test_a_worker_whose_row_went_unwritten_past_the_bound_has_its_jobs_taken_over():
    job = running_of(beating_worker("gone:1:aaaaaa", silent_ms=row_presence.GONE_MS + 1))
    assert watching_leader().run_once(NOW)["taken_over"] == 1
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts, row.lease_expires_ms) == ("waiting", 1, None)  # claimable now, not a lease later
    [entry] = row.error_list
    assert entry["kind"] == "worker_lost" and "row went unwritten for 10 s" in entry["message"], entry


@pytest.mark.parametrize(
    ("silent_ms", "beat_ms"),
    [(row_presence.GONE_MS - 1_000, row_presence.BEAT_MS), (600_000, None)],
    ids=["written in time", "a row that does not beat (an older worker)"],
)
def test_a_row_written_in_time_or_one_that_does_not_beat_keeps_its_jobs(silent_ms, beat_ms):
    job = running_of(beating_worker("kept:1:bbbbbb", silent_ms=silent_ms, beat_ms=beat_ms))
    assert watching_leader().run_once(NOW)["taken_over"] == 0
    assert (Job.objects.get(pk=job.pk).status, json.loads(Job.objects.get(pk=job.pk).errors)) == ("running", [])


def test_a_leader_that_has_just_started_watching_judges_no_row():
    """After an outage every row is old: each worker must first have had the time to write its row again."""
    job = running_of(beating_worker("back:1:cccccc", silent_ms=60_000))
    leader = watching_leader(for_s=row_presence.GONE_S - 2)
    assert leader.run_once(NOW)["taken_over"] == 0
    assert Job.objects.get(pk=job.pk).status == "running"
    leader._passes_since -= 3  # watched long enough now
    assert leader.run_once(NOW + 1_000)["taken_over"] == 1


def test_a_row_written_between_the_look_and_the_takeover_keeps_its_jobs(monkeypatch):
    """The row is read again under the job rows' locks: a worker that beat meanwhile keeps its jobs."""
    from django_durq.worker import takeover

    worker_id = beating_worker("late:1:dddddd", silent_ms=row_presence.GONE_MS + 5_000)
    job = running_of(worker_id)
    lock_rows = takeover.lock_orphans

    def beats_first(dialect, leases):
        WorkerProcess.objects.filter(worker_id=worker_id).update(last_seen_ms=NOW)
        return lock_rows(dialect, leases)

    monkeypatch.setattr(takeover, "lock_orphans", beats_first)
    assert watching_leader().run_once(NOW)["taken_over"] == 0
    assert Job.objects.get(pk=job.pk).status == "running"


def test_the_beat_tells_handlers_to_stop_once_silent_and_from_when_it_holds_again():
    worker_id = beating_worker("self:1:eeeeee", silent_ms=0)
    rewritten = []
    beat = RowBeat("default", worker_id, ManualClock(NOW + 5_000), rewritten.append)
    since = beat.held_since()
    assert since is not None and beat.beat()
    assert beat.held_since() == since  # unbroken
    assert WorkerProcess.objects.get(pk=worker_id).last_seen_ms == NOW + 5_000

    beat._heard -= row_presence.SILENT_S + 0.5  # no beat got through for longer than the bound
    assert beat.held_since() is None  # handlers are told to stop: a takeover may come
    assert beat.unbroken_for() == 0.0
    before = time.monotonic()
    assert beat.beat()
    held = beat.held_since()
    assert held is not None and held >= before  # leases confirmed before this are in doubt

    WorkerProcess.objects.filter(pk=worker_id).delete()  # judged gone and removed during a stall
    assert beat.beat() and rewritten == [NOW + 5_000]  # the row is written anew


def test_a_worker_whose_row_went_silent_is_no_longer_live_and_its_job_shows_orphaned():
    """The operator sees what the leader judges: silent past the bound, the worker is gone."""
    from django_durq import ops
    from django_durq.admin.states import StateReader

    quiet = beating_worker("quiet:1:ffffff", silent_ms=row_presence.GONE_MS + 1_000)
    fresh = beating_worker("fresh:1:ffffff", silent_ms=1_000)
    older = beating_worker("older:1:ffffff", silent_ms=row_presence.GONE_MS + 1_000, beat_ms=None)  # judged by heartbeats
    assert {worker.worker_id for worker in ops.live_workers(now_ms=NOW)} == {fresh, older}
    job = running_of(quiet)
    shown = StateReader([job], now_ms=NOW).of(job)
    assert shown.key == "orphaned" and f"{quiet} was last seen" in shown.reason, shown
