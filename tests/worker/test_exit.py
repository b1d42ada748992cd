"""How a worker process ends, as a process manager sees it: its exit status, and how soon.

A worker that stops because a part of it failed exits non-zero, so that ``Restart=on-failure``
(systemd), ``restart: on-failure`` (Compose) or a Kubernetes restart policy starts it again; a
stop it was asked for exits 0 (docs/reference/commands.md lists each status). A burst run exits
once its queues are empty, and an idle worker stops at once on SIGTERM: neither waits out a
poll interval.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from django.db import connection

from django_durq.models import WorkerProcess
from tests.conftest import ROOT, db_vendor, wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# A poll interval far longer than any wait below: a worker that waited one out would time out.
LONG_POLL = {"DURQ_TEST_POLL": "30"}


@pytest.fixture
def claims_refused() -> Iterator[None]:
    """The database rejects every claim with an error no retry can cure (a trigger on the job table).

    As a statement prepared on another server connection, a revoked privilege or a dropped
    column would: the dispatcher stops on it.
    """
    vendor = db_vendor()
    with connection.cursor() as cursor:
        if vendor == "postgres":
            cursor.execute(
                "CREATE FUNCTION durq_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'claims refused by a test trigger'; END $$"
            )
            cursor.execute(
                "CREATE TRIGGER durq_test_refuse BEFORE UPDATE ON durq_job FOR EACH ROW "
                "WHEN (NEW.status = 'running') EXECUTE FUNCTION durq_test_refuse()"
            )
        elif vendor == "mysql":
            # A duplicate-key errno: the driver raises IntegrityError, which no retry cures.
            cursor.execute(
                "CREATE TRIGGER durq_test_refuse BEFORE UPDATE ON durq_job FOR EACH ROW "
                "BEGIN IF NEW.status = 'running' THEN "
                "SIGNAL SQLSTATE '23000' SET MESSAGE_TEXT = 'claims refused by a test trigger', MYSQL_ERRNO = 1062; "
                "END IF; END"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER durq_test_refuse BEFORE UPDATE ON durq_job FOR EACH ROW "
                "WHEN NEW.status = 'running' BEGIN SELECT RAISE(ABORT, 'claims refused by a test trigger'); END"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER durq_test_refuse" + (" ON durq_job" if vendor == "postgres" else ""))
            if vendor == "postgres":
                cursor.execute("DROP FUNCTION durq_test_refuse()")


def test_a_dispatcher_that_fails_stops_the_worker_with_status_3(spawn_worker, claims_refused):
    jobs.effect.enqueue(tag="refused")
    worker = spawn_worker("--queue", "default:1")
    try:
        status = worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker did not stop:\n{worker.output()}")
    output = worker.output()
    assert status == 3, output
    assert "the dispatcher of queue 'default' stopped on an unexpected error" in output
    assert "exits with status 3" in output, output
    assert not WorkerProcess.objects.exists()  # a failed worker still removes its row


def test_a_burst_run_exits_as_soon_as_its_queue_is_empty(worker_env):
    """The last claim comes back with fewer jobs than asked for: the run ends then, not a poll later."""
    jobs.effect.enqueue_many([{"tag": "burst"} for _ in range(3)])
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "django", "durq_worker", "--burst", "--queue", "default:4"],
            cwd=ROOT,
            env={**worker_env, **LONG_POLL},
            capture_output=True,
            text=True,
            timeout=20,  # a liveness cap: a run that waits out the 30 s poll interval fails here
        )
    except subprocess.TimeoutExpired as late:
        pytest.fail(f"--burst still ran {time.monotonic() - started:.1f} s after start: {late.stderr!r}")
    assert result.returncode == 0, result.stderr
    assert "durq_worker --burst: 3 jobs" in result.stdout
    assert Effect.objects.filter(tag="burst").count() == 3


def test_an_idle_worker_stops_within_half_a_second_of_sigterm(spawn_worker):
    worker = spawn_worker("--queue", "default:2", "--queue", "fast:1", env=LONG_POLL)
    wait_until(lambda: "maintenance duties" in worker.output(), 60, "the worker to start its maintenance")
    time.sleep(1.5)  # idle: every thread has gone to sleep (the watcher listens, the maintenance pass is done)
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    try:
        status = worker.wait(timeout=0.5)  # the liveness cap docs/workers.md states
    except subprocess.TimeoutExpired:
        status = worker.wait(timeout=30)
        pytest.fail(f"the idle worker took {time.monotonic() - signalled:.2f} s to stop (status {status}):\n{worker.output()}")
    assert status == 0, worker.output()
