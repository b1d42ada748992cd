"""The queue behind PgBouncer in transaction mode (docs/postgresql.md, "Behind PgBouncer").

This module starts a PgBouncer of its own (Debian's ``pgbouncer``) on a free port, with
fewer server connections than the workers open, so that transactions really do move between
server connections. Workers reach the queue through it (``DURQ_TEST_PGBOUNCER_PORT`` in
tests/settings.py); ``LISTEN`` goes to the ``direct`` alias, which reaches PostgreSQL itself.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection, connections
from django.db.utils import load_backend

from django_durq.models import Job
from django_durq.models import WorkerProcess as Row
from tests.conftest import WorkerProcess, db_vendor, wait_until
from tests.ledger import jobs
from tests.ledger.checker import check
from tests.ledger.models import Effect

pytestmark = [
    pytest.mark.skipif(db_vendor() != "postgres", reason="PgBouncer pools PostgreSQL connections"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
]

SERVER_CONNECTIONS = 5  # PgBouncer's pool: fewer than one worker with four slots holds (4 + 1 + 4)
POOLED = "pooled"  # this test process's connection through PgBouncer


@dataclass
class Bouncer:
    port: int

    def transactions(self, database: str) -> int:
        """Transactions PgBouncer has passed to ``database`` so far (its admin console's SHOW STATS)."""
        import psycopg  # here, not at the top: the MariaDB leg collects this module without psycopg

        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=_server()["user"],
            dbname="pgbouncer",
            autocommit=True,
            cursor_factory=psycopg.ClientCursor,  # the console speaks the simple protocol only
        ) as admin:
            cursor = admin.execute("SHOW STATS")
            columns = [column.name for column in cursor.description or ()]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
        return sum(int(row["total_xact_count"]) for row in rows if row["database"] == database)


def _server() -> dict[str, str]:
    return {
        "host": os.environ.get("DURQ_PG_HOST", "127.0.0.1"),
        "port": os.environ.get("DURQ_PG_PORT", "5432"),
        "user": os.environ.get("DURQ_PG_USER", "postgres"),
        "password": os.environ.get("DURQ_PG_PASSWORD", ""),
    }


def _pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        message = "pgbouncer is not installed (scripts/system-deps installs Debian's package)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; with CI=true this test must run")
        pytest.skip(message)
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def bouncer() -> Iterator[Bouncer]:
    binary = _pgbouncer_binary()
    server = _server()
    port = _free_port()
    # PgBouncer refuses to run as root: then it runs as the postgres user, who must read its files.
    run_as = ["-u", "postgres"] if os.geteuid() == 0 else []
    try:
        if run_as:
            pwd.getpwnam("postgres")
    except KeyError:
        pytest.fail("PgBouncer refuses to run as root, and there is no postgres user to run it as")
    folder = Path(tempfile.mkdtemp(prefix="durq-pgbouncer-"))
    folder.chmod(0o755)
    (folder / "userlist.txt").write_text(f'"{server["user"]}" "{server["password"]}"\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server['host']} port={server['port']}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {folder / 'userlist.txt'}\n"
        f"admin_users = {server['user']}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {SERVER_CONNECTIONS}\n"
        "max_client_conn = 500\n"
    )
    for path in folder.iterdir():
        path.chmod(0o644)
    log = folder / "pgbouncer.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([binary, *run_as, str(folder / "pgbouncer.ini")], stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: process.poll() is not None or _accepts(port), 10, "PgBouncer to listen")
        assert process.poll() is None, log.read_text()
        yield Bouncer(port)
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(folder)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture
def pooled(bouncer: Bouncer, settings) -> Iterator[str]:
    """This process enqueues through PgBouncer: DURQ["DATABASE"] is a connection to the test database behind it.

    The connection is this thread's own, not in DATABASES: Django's test case lets a test use
    such a connection, and creates no test database for it.
    """
    behind = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": str(bouncer.port)}
    behind.update(OPTIONS={"application_name": "durq-tests"}, DISABLE_SERVER_SIDE_CURSORS=True)
    connections[POOLED] = load_backend(behind["ENGINE"]).DatabaseWrapper(behind, POOLED)
    settings.DURQ = {**settings.DURQ, "DATABASE": POOLED}
    try:
        yield POOLED
    finally:
        connections[POOLED].close()
        del connections[POOLED]


def _through(bouncer: Bouncer, listen: str, poll: float) -> dict[str, str]:
    """Worker environment: the queue through PgBouncer, LISTEN on ``listen`` ("" for none)."""
    return {
        "DURQ_TEST_PGBOUNCER_PORT": str(bouncer.port),
        "DURQ_TEST_LISTEN_DATABASE": listen,
        "DURQ_TEST_POLL": str(poll),
    }


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
