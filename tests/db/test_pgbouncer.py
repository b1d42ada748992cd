"""The queue behind PgBouncer in transaction mode (docs/postgresql.md, "Behind PgBouncer").

This module starts a PgBouncer of its own (``tests/pgbouncer.py``) on a free port, with fewer
server connections than the workers open, so that transactions really do move between server
connections. Workers reach the queue through it (``DURQ_TEST_PGBOUNCER_PORT`` in
tests/settings.py); ``LISTEN`` goes to the ``direct`` alias, which reaches PostgreSQL itself.
"""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection, connections
from django.db.utils import load_backend

from django_durq.models import Job
from django_durq.models import WorkerProcess as Row
from tests.conftest import WorkerProcess, db_vendor, run_command, wait_until
from tests.ledger import jobs
from tests.ledger.checker import check
from tests.ledger.models import Effect
from tests.pgbouncer import Bouncer, transaction_pooler

pytestmark = [
    pytest.mark.skipif(db_vendor() != "postgres", reason="PgBouncer pools PostgreSQL connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
]


def _through(bouncer: Bouncer, listen: str | None, poll: float) -> dict[str, str]:
    """Worker environment: the queue through PgBouncer, LISTEN on ``listen`` ("" for none, None: not set)."""
    env = {"DURQ_TEST_PGBOUNCER_PORT": str(bouncer.port), "DURQ_TEST_POLL": str(poll)}
    if listen is not None:
        env["DURQ_TEST_LISTEN_DATABASE"] = listen
    return env


def _spawn_ready(spawn_worker, env: dict[str, str], *args: str) -> WorkerProcess:
    worker = spawn_worker(*args, env=env)
    wait_until(lambda: worker.popen.poll() is not None or Row.objects.filter(pid=worker.pid).exists(), 60, "registration")
    assert worker.popen.poll() is None, worker.output()
    return worker


def _wake_up_times(rounds: int) -> list[float]:
    """Seconds from each enqueue to its job's effect; each enqueue comes shortly after the last job ended.

    A pool that has just recorded a job's completion (and claimed again in the same transaction)
    sleeps a whole poll interval unless something wakes it, so these times are close to the
    interval when nothing does. A first job, not timed, sets that rhythm: before it the pool has
    been idle for any part of an interval.
    """
    times = []
    for turn in range(rounds + 1):
        start = time.monotonic()
        job_id = jobs.effect.enqueue(tag=f"wake{turn}").pk
        wait_until(lambda job_id=job_id: Effect.objects.filter(job_id=job_id).exists(), 30, "the job to run", interval=0.01)
        times.append(time.monotonic() - start)
        wait_until(lambda job_id=job_id: not Job.objects.filter(pk=job_id).active().exists(), 30, "its completion")
        time.sleep(0.2)  # the dispatcher's claim after the completion, if it came apart
    return times[1:]


def test_workers_through_pgbouncer_run_every_job_once(bouncer, pooled, spawn_worker):
    env = _through(bouncer, "direct", poll=1.0)
    workers = [_spawn_ready(spawn_worker, env, "--queue", "default:4") for _ in range(3)]
    before = bouncer.transactions(connection.settings_dict["NAME"])

    acked = [jobs.effect.enqueue(tag="one").pk for _ in range(50)]
    acked += [queued.pk for queued in jobs.effect.enqueue_many([{"tag": "many"} for _ in range(250)])]
    wait_until(lambda: not Job.objects.filter(pk__in=acked).active().exists(), 45, "300 jobs to reach a terminal state")

    verdict = check(acked)
    assert verdict.exact, str(verdict)
    # Through PgBouncer: the enqueues, every handler's write (300 transactions), claims and completions.
    assert bouncer.transactions(connection.settings_dict["NAME"]) - before > len(acked)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()
    logs = "".join(worker.output() for worker in workers)
    assert "Traceback" not in logs and "durq.W004" not in logs, logs  # the direct alias heard the pooled NOTIFY


def test_an_idle_worker_listening_on_the_direct_alias_wakes_at_once(bouncer, pooled, spawn_worker):
    _spawn_ready(spawn_worker, _through(bouncer, "direct", poll=5.0), "--queue", "default:1")
    time.sleep(0.5)  # the watcher's LISTEN
    times = _wake_up_times(3)
    assert max(times) < 1.0, f"wake-up took {times} s with a 5 s poll interval"


def test_without_listen_an_idle_worker_finds_jobs_at_its_poll_interval(bouncer, pooled, spawn_worker):
    worker = _spawn_ready(spawn_worker, _through(bouncer, "", poll=2.0), "--queue", "default:1")
    time.sleep(0.5)
    times = _wake_up_times(3)
    assert all(1.0 < took < 3.0 for took in times), f"wake-up took {times} s with a 2 s poll interval"
    assert 'DURQ["LISTEN_DATABASE"] is None' in worker.output()


LEADS = "this worker now runs the maintenance duties"


def test_with_nothing_configured_workers_behind_the_pooler_run_every_job_with_one_leader(bouncer, pooled, spawn_worker):
    """One DATABASES entry through PgBouncer, DURQ["LISTEN_DATABASE"] not set: the likeliest set-up.

    The worker finds out that the pooler hands its sessions to others, and keeps no session state
    there: no maintenance lock taken through the pooler (two workers would both hold it), no
    prepared claim (missing on the next server connection).
    """
    env = _through(bouncer, None, poll=0.25)
    workers = [_spawn_ready(spawn_worker, env, "--queue", "default:2") for _ in range(2)]
    wait_until(lambda: any(LEADS in worker.output() for worker in workers), 15, "a worker to lead")
    time.sleep(2)  # a second leader would say so within a maintenance pass
    assert sum(worker.output().count(LEADS) for worker in workers) == 1, _logs(workers)

    acked = [queued.pk for queued in jobs.effect.enqueue_many([{"tag": "pooled"} for _ in range(100)])]
    try:
        wait_until(lambda: not Job.objects.filter(pk__in=acked).active().exists(), 45, "100 jobs to reach a terminal state")
    except AssertionError as late:
        raise AssertionError(f"{late}: {[worker.popen.poll() for worker in workers]}\n{_logs(workers)}") from None
    verdict = check(acked)
    assert verdict.exact, str(verdict)
    assert sum(worker.output().count(LEADS) for worker in workers) == 1, _logs(workers)
    for worker in workers:
        assert "transaction pooler" in worker.output(), worker.output()
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()
        assert "Traceback" not in worker.output(), worker.output()


def _logs(workers: list[WorkerProcess]) -> str:
    return "\n".join(f"--- worker {worker.pid}:\n{worker.output()}" for worker in workers)


def test_the_database_check_says_the_queue_goes_through_a_transaction_pooler(bouncer, worker_env):
    env = {**worker_env, **_through(bouncer, None, poll=0.25)}
    result = run_command("check", "--database", "default", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "durq.W006" in result.stderr and "transaction pooler" in result.stderr, result.stdout + result.stderr
    assert 'DURQ["LISTEN_DATABASE"]' in result.stderr, result.stderr  # the one-line fix for prompt wake-ups

    straight = {key: value for key, value in worker_env.items() if key != "DURQ_TEST_PGBOUNCER_PORT"}  # the PgBouncer leg's
    direct = run_command("check", "--database", "default", env=straight)
    assert direct.returncode == 0 and "durq.W006" not in direct.stderr, direct.stdout + direct.stderr


def test_the_probe_tells_a_transaction_pooler_from_the_server_and_from_a_session_pooler(bouncer, pooled):
    """Six one-statement transactions over two connections: the pooler's server sessions move, the server's never do."""
    from django_durq.db.pooler import lends_sessions

    assert lends_sessions(connections[pooled]) is True
    assert lends_sessions(connection) is False
    with transaction_pooler(pool_size=1) as single:  # every transaction on one server session
        assert lends_sessions(_wrapper(single.port)) is True
    with transaction_pooler(pool_mode="session") as sessions:  # each client keeps its server session
        assert lends_sessions(_wrapper(sessions.port)) is False


def _wrapper(port: int):
    behind = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": str(port)}
    return load_backend(behind["ENGINE"]).DatabaseWrapper(behind, f"port{port}")
