"""Worker presence on SQLite: the operating system's locks say which workers are alive.

An idle worker on SQLite must commit nothing (no heartbeat row, no maintenance lease), yet be
reported alive, and a killed one must be known dead at once. Elsewhere heartbeat rows decide.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import time

import pytest

from django_durq import ops
from django_durq.clock import now_ms
from django_durq.db import presence
from django_durq.db.presence import Liveness, Presence
from django_durq.models import Job, WorkerProcess
from tests.conftest import db_vendor, wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect

pytestmark = pytest.mark.skipif(db_vendor() != "sqlite", reason="presence locks are used on SQLite only")


@pytest.mark.django_db(transaction=True)
def test_a_held_lock_is_alive_a_released_one_has_ended_and_no_file_is_unknown():
    first = Presence.announce("default", "host:1:aaaaaa")
    second = Presence.announce("default", "host:2:bbbbbb")
    assert first is not None and second is not None
    try:
        assert presence.liveness("default", "host:1:aaaaaa") is Liveness.HELD
        assert presence.liveness("default", "host:9:never") is Liveness.UNKNOWN
        # One leader at a time; the second takes over once the first lets go.
        assert first.lead() and first.lead() and not second.lead()
        first.withdraw()
        assert presence.liveness("default", "host:1:aaaaaa") is Liveness.UNKNOWN  # a clean stop removes the file
        assert second.lead()
    finally:
        first.withdraw()
        second.withdraw()


@pytest.mark.django_db(transaction=True)
def test_sweep_removes_only_the_files_of_ended_workers():
    presence.sweep("default")  # workers killed by earlier tests left their files
    alive = Presence.announce("default", "host:1:alive0")
    assert alive is not None
    try:
        # A worker that ended without a clean stop leaves its file behind, unlocked.
        ended = presence.directory("default") / ("host:2:ended0" + presence.SUFFIX)
        ended.touch()
        assert presence.liveness("default", "host:2:ended0") is Liveness.RELEASED
        assert presence.sweep("default") == ["host:2:ended0"]
        assert not ended.exists() and presence.liveness("default", "host:1:alive0") is Liveness.HELD
    finally:
        alive.withdraw()


def test_idle_workers_commit_nothing_are_seen_alive_and_a_killed_one_is_gone_at_once(spawn_worker):
    from django.db import connection

    path = str(connection.settings_dict["NAME"])
    env = {"DURQ_TEST_HEARTBEAT": "0.5"}  # heartbeat rows every half second, if they were written
    workers = [spawn_worker("--queue", "default:2", env=env) for _ in range(2)]
    wait_until(lambda: WorkerProcess.objects.count() == 2, 60, "both workers to register")
    time.sleep(2)  # start-up is done: registered, first probes made, a leader chosen
    observer = sqlite3.connect(path)
    try:
        # data_version changes whenever another connection commits to the file.
        before = observer.execute("PRAGMA data_version").fetchone()[0]
        time.sleep(6)  # twelve heartbeat intervals, six maintenance passes
        after = observer.execute("PRAGMA data_version").fetchone()[0]
    finally:
        observer.close()
    assert after == before, "an idle worker committed to the database"

    # Alive by their locks, long after any heartbeat they could have written.
    later = now_ms() + 3_600_000
    alive = ops.live_workers(now_ms=later)
    assert len(alive) == 2 and all(worker.last_seen_ms == later for worker in alive)

    victim, survivor = workers
    victim_id = next(worker.worker_id for worker in alive if worker.pid == victim.pid)
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert [worker.pid for worker in ops.live_workers()] == [survivor.pid]
    # Whichever of them led maintenance, the survivor leads now and removes the dead row and file,
    # without waiting for a lease or ten missed heartbeats to run out.
    wait_until(lambda: WorkerProcess.objects.count() == 1, 10, "the dead worker's row to be removed")
    # The lock file goes just after the row (the released lock is what marked the row as ended).
    wait_until(lambda: presence.liveness("default", victim_id) is Liveness.UNKNOWN, 5, "the dead worker's lock file")

    job = jobs.effect.enqueue(tag="after")
    wait_until(lambda: Effect.objects.filter(job_id=job.pk).exists(), 30, "the survivor to run a job")
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0, survivor.output()
    assert not WorkerProcess.objects.exists() and not Job.objects.filter(status="running").exists()
    assert list(presence.directory("default").glob(f"*{presence.SUFFIX}")) == []


@pytest.mark.django_db(transaction=True)
def test_a_web_process_running_as_another_user_can_read_the_lock_files():
    old_umask = os.umask(0o077)  # a worker started with a private umask
    try:
        held = Presence.announce("default", "host:1:umask0")
    finally:
        os.umask(old_umask)
    assert held is not None
    try:
        mode = (presence.directory("default") / ("host:1:umask0" + presence.SUFFIX)).stat().st_mode
        assert stat.S_IMODE(mode) & 0o444 == 0o444
    finally:
        held.withdraw()
