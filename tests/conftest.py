"""Test fixtures: database reachability, real worker processes, ledger checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _server_problem() -> str | None:
    db = os.environ.get("DURQ_TEST_DB", "sqlite")
    try:
        if db == "postgres":
            import psycopg

            psycopg.connect(
                host=os.environ.get("DURQ_PG_HOST", "127.0.0.1"),
                port=os.environ.get("DURQ_PG_PORT", "5432"),
                user=os.environ.get("DURQ_PG_USER", "postgres"),
                password=os.environ.get("DURQ_PG_PASSWORD", ""),
                dbname="test",
                connect_timeout=5,
            ).close()
        elif db == "mysql":
            import MySQLdb

            MySQLdb.connect(
                host=os.environ.get("DURQ_MYSQL_HOST", "127.0.0.1"),
                port=int(os.environ.get("DURQ_MYSQL_PORT", "3306")),
                user=os.environ.get("DURQ_MYSQL_USER", "root"),
                password=os.environ.get("DURQ_MYSQL_PASSWORD", ""),
                connect_timeout=5,
            ).close()
    except Exception as error:  # noqa: BLE001
        return f"{db} server unreachable ({type(error).__name__}: {error})"
    return None


def pytest_configure(config: pytest.Config) -> None:
    problem = _server_problem()
    if problem is None:
        return
    hint = "set DURQ_PG_HOST/PORT/USER or DURQ_MYSQL_HOST/PORT/USER/PASSWORD to point the leg at a server"
    if os.environ.get("CI") == "true":
        pytest.exit(f"FAILED: {problem}; with CI=true every database leg must run ({hint})", returncode=1)
    sys.stderr.write(f"\n{'!' * 78}\nSKIPPING THIS LEG: {problem}\n{hint}\n{'!' * 78}\n")
    pytest.exit(f"skipped: {problem}", returncode=0)


def db_vendor() -> str:
    return os.environ.get("DURQ_TEST_DB", "sqlite")


# Which tests run on which CI leg. SQLite runs on three legs (Python 3.11, 3.12, 3.13) and
# PostgreSQL on two: tests marked ``one_leg`` (the fault catalogue and a few process-heavy tests),
# and every other test that starts real worker processes (``processes``) apart from the worker's
# own lifecycle (``OLDER_LEG_WORKER_TESTS``: start, signals, exit statuses), run on the
# newest-Python leg only, so each database runs them once per CI run, and the older legs prove
# the package, its API and a real worker on the older supported versions.
# ``DURQ_TEST_FAULTS=all`` runs them on any interpreter. Tests marked ``heavy`` run only with
# ``DURQ_TEST_HEAVY=1`` (``benchmarks/soak.py --tests``).
HEAVY = os.environ.get("DURQ_TEST_HEAVY") == "1"
EVERY_LEG = HEAVY or os.environ.get("DURQ_TEST_FAULTS") == "all"
OLDER_LEG = sys.version_info < (3, 13) and db_vendor() in ("sqlite", "postgres")
OLDER_LEG_WORKER_TESTS = ("tests/worker/test_worker.py", "tests/worker/test_exit.py")

# The PgBouncer leg (tox env py313-dj61-pgbouncer): every worker the tests start reaches the queue
# through a PgBouncer in transaction mode, with DURQ["LISTEN_DATABASE"] not set, as a site with one
# DATABASES entry behind the pooler runs them. The test process itself connects directly, so a test
# that starts no worker (every worker is started with the ``worker_env`` fixture, which points it
# at the pooler) sends nothing through the pooler: the PostgreSQL leg runs those.
THROUGH_PGBOUNCER = os.environ.get("DURQ_TEST_THROUGH_PGBOUNCER") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    heavy = pytest.mark.skip(reason="heavy: runs with DURQ_TEST_HEAVY=1 (benchmarks/soak.py --tests)")
    newest = pytest.mark.skip(reason="runs on the newest-Python leg of this database (DURQ_TEST_FAULTS=all: here too)")
    pooled = pytest.mark.skip(reason="behind a transaction pooler the worker keeps no session state (docs/postgresql.md)")
    direct = pytest.mark.skip(reason="starts no worker, so nothing goes through the pooler: the PostgreSQL leg runs it")
    for item in items:
        if "heavy" in item.keywords and not HEAVY:
            item.add_marker(heavy)
        elif OLDER_LEG and not EVERY_LEG and _newest_leg_only(item):
            item.add_marker(newest)
        elif "own_sessions" in item.keywords and THROUGH_PGBOUNCER:
            item.add_marker(pooled)
        elif THROUGH_PGBOUNCER and "worker_env" not in getattr(item, "fixturenames", ()):
            item.add_marker(direct)


def _newest_leg_only(item: pytest.Item) -> bool:
    if "one_leg" in item.keywords:
        return True
    return "processes" in item.keywords and not item.nodeid.startswith(OLDER_LEG_WORKER_TESTS)


class WorkerProcess:
    def __init__(self, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.popen = popen
        self.log = log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="session")
def pooler_port() -> Iterator[str | None]:
    """The port of the session's PgBouncer on the PgBouncer leg; None elsewhere."""
    if not THROUGH_PGBOUNCER:
        yield None
        return
    from tests.pgbouncer import transaction_pooler

    with transaction_pooler() as bouncer:
        yield str(bouncer.port)


@pytest.fixture
def worker_env(transactional_db: None, tmp_path: Path, pooler_port: str | None) -> dict[str, str]:
    from django.db import connection

    env = dict(os.environ)
    if pooler_port is not None:
        env["DURQ_TEST_PGBOUNCER_PORT"] = pooler_port
    env["DURQ_TEST_DB_IN_USE"] = str(connection.settings_dict["NAME"])
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def spawn_worker(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``manage.py durq_worker`` as a real process against the test database."""
    from django.db import connections

    started: list[WorkerProcess] = []
    # Worker processes must see committed data and must not wait on our open connections.
    connections.close_all()

    def spawn(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        log = tmp_path / f"worker-{len(started)}.log"
        with log.open("wb") as sink:
            popen = subprocess.Popen(
                [sys.executable, "-m", "django", "durq_worker", *args],
                cwd=ROOT,
                env={**worker_env, **(env or {})},
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = WorkerProcess(popen, log)
        started.append(process)
        return process

    yield spawn
    for process in started:
        if process.popen.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.popen.wait()


def wait_until(predicate: Callable[[], object], timeout: float, message: str = "condition", interval: float = 0.05) -> object:
    """Poll ``predicate`` until truthy; fail after ``timeout`` seconds (a liveness cap, not a speed claim)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(interval)


def run_command(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@contextmanager
def database_alias(alias: str, settings_dict: dict[str, Any]) -> Iterator[None]:
    """``alias`` in DATABASES for the block, without ``override_settings(DATABASES=…)``, which Django warns against.

    ``connections.settings`` is ``settings.DATABASES`` itself, each entry with every key filled
    in: ``settings_dict`` must be complete too (a changed copy of one of them).
    """
    from django.db import connections

    connections.settings[alias] = settings_dict
    try:
        yield
    finally:
        connections[alias].close()
        del connections[alias]
        del connections.settings[alias]


@pytest.fixture(autouse=True)
def fresh_claim_memory() -> Iterator[None]:
    """Each test starts with no memory of earlier claims: MariaDB's claims remember, per process,
    when each (queue, worker) last looked for expired leases, and tests reuse worker names and
    clock times, so a memory left by one test would skip the look in the next."""
    from django_durq.db import mysql_claims

    mysql_claims.claims.__init__()  # type: ignore[misc]
    yield
