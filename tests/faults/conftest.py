"""Fixtures of the fault suite: short timings, race-point gates, faults on the database side.

Process tests run with the catalogue's short settings: lease ``L`` = 2 s, heartbeat ``H`` =
0.5 s, poll ``P`` = 0.25 s, and finished jobs kept so that their error history can explain a
duplicate. Every "within X" of the catalogue is the cap of a polling wait, never a timing
assertion.

Tests marked ``heavy`` run only with ``DURQ_TEST_HEAVY=1`` (``benchmarks/soak.py --tests``
sets it); :func:`size` picks the CI or the full size of a test that runs in both. Which CI leg
runs what (``one_leg``) is decided in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import HEAVY, ROOT, WorkerProcess, db_vendor, wait_until

LEASE_S = 2.0
HEARTBEAT_S = 0.5
POLL_S = 0.25
SHORT_ENV = {
    "DURQ_TEST_LEASE": str(LEASE_S),
    "DURQ_TEST_HEARTBEAT": str(HEARTBEAT_S),
    "DURQ_TEST_POLL": str(POLL_S),
    "DURQ_TEST_KEEP_FINISHED": "3600",
}


def size(ci: int, heavy: int) -> int:
    return heavy if HEAVY else ci


one_leg = pytest.mark.one_leg


def only_on(*vendors: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(db_vendor() not in vendors, reason=f"applies to {', '.join(vendors)}")


# --- race points and fault points ------------------------------------------------------------------


class Gates:
    """The files of ``django_durq.conf.hooks``: close a gate to hold workers there, open it to let them go."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(exist_ok=True)

    def close(self, point: str) -> None:
        (self.folder / point).touch()

    def open(self, point: str) -> None:
        (self.folder / point).unlink(missing_ok=True)

    def reached(self, point: str) -> dict[int, int]:
        """{job id: pid} of the workers that reached ``point``."""
        found = {}
        for marker in self.folder.glob(f"{point}.reached.*"):
            text = marker.read_text().strip()
            if text:
                found[int(marker.name.rsplit(".", 1)[1])] = int(text)
        return found

    def wait(self, point: str, job_id: int, timeout: float = 30) -> int:
        """The pid of the worker holding ``job_id`` at ``point``, once it is there."""
        return int(wait_until(lambda: self.reached(point).get(job_id), timeout, f"job {job_id} at {point}"))  # type: ignore[arg-type]

    def fail(self, operation: str, times: int) -> None:
        (self.folder / f"fail.{operation}").write_text(str(times))


class Faults:
    """Starts workers with the short settings and does things to them and to their database."""

    def __init__(self, spawn: Callable[..., WorkerProcess], gates: Gates, env: dict[str, str]) -> None:
        self._spawn = spawn
        self.gates = gates
        self.env = env
        self.helpers: list[subprocess.Popen[bytes]] = []

    def spawn(self, *args: str, hooks: bool = False, env: dict[str, str] | None = None) -> WorkerProcess:
        extra = dict(SHORT_ENV)
        if hooks:
            extra["DURQ_TEST_HOOKS_DIR"] = str(self.gates.folder)
        return self._spawn(*args, env={**extra, **(env or {})})

    def spawn_ready(self, *args: str, **kwargs: Any) -> WorkerProcess:
        """A worker that has registered and started its pools."""
        from django_durq.models import WorkerProcess as Row

        worker = self.spawn(*args, **kwargs)
        wait_until(lambda: worker.popen.poll() is not None or Row.objects.filter(pid=worker.pid).exists(), 60, "registration")
        assert worker.popen.poll() is None, worker.output()
        time.sleep(0.2)  # registration comes just before the pools start
        return worker

    def helper(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """A Python helper process (an outside lock holder, a web app) in this test's environment."""
        popen = subprocess.Popen([sys.executable, *args], cwd=ROOT, env={**self.env, **(env or {})}, stdout=subprocess.PIPE)
        self.helpers.append(popen)
        return popen

    def stop_helpers(self) -> None:
        for popen in self.helpers:
            if popen.poll() is None:
                popen.kill()
            popen.wait()
            if popen.stdout is not None:
                popen.stdout.close()


@pytest.fixture
def gates(tmp_path: Path) -> Gates:
    return Gates(tmp_path / "hooks")


@pytest.fixture
def short(settings: Any) -> None:
    """This process enqueues with the same short lease the workers use."""
    settings.DURQ = {
        **settings.DURQ,
        "LEASE": LEASE_S,
        "HEARTBEAT_INTERVAL": HEARTBEAT_S,
        "POLL_INTERVAL": POLL_S,
        "KEEP_FINISHED": 3600,
    }


@pytest.fixture
def faults(spawn_worker: Callable[..., WorkerProcess], gates: Gates, worker_env: dict[str, str], short: None) -> Iterator[Faults]:
    chaos = Faults(spawn_worker, gates, worker_env)
    yield chaos
    for name in os.listdir(gates.folder):
        if "reached" not in name:
            (gates.folder / name).unlink(missing_ok=True)  # let held workers go before they are killed
    chaos.stop_helpers()


# --- the worker side ---------------------------------------------------------------------------------


def problems_in(output: str, allowed: tuple[str, ...] = ()) -> list[str]:
    """Lines logged at ERROR or CRITICAL, and tracebacks, except those naming an allowed fragment.

    A job's failure is logged with its traceback (for error trackers): those lines belong to
    that record, which counts once, and are not tracebacks of the worker's own.
    """
    found = []
    in_job_failure = False
    for line in output.splitlines():
        if line[:1].isdigit():  # a new log record starts with its timestamp
            in_job_failure = "durq: job " in line and " failed: " in line
        elif in_job_failure:
            continue
        bad = " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")
        if bad and not any(fragment in line for fragment in allowed):
            found.append(line)
    return found


def is_gone(worker: WorkerProcess) -> bool:
    """True when neither the worker nor any process of its group is left."""
    if worker.popen.poll() is None:
        return False
    try:
        os.killpg(worker.pid, 0)
    except ProcessLookupError:
        return True
    return False


def rss_mb(pid: int) -> tuple[float, float] | None:
    """(current, peak) resident set size of a live process, or None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    try:
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    except (KeyError, ValueError):
        return None


# --- the database side --------------------------------------------------------------------------------


def server_connections() -> list[int]:
    """Backends (PostgreSQL) or connection ids (MariaDB) on the test database, except this process's."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
            )
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()"
                " AND command <> 'Daemon'"
            )
        else:
            return []
        return [row[0] for row in cursor.fetchall()]


def cut_connections() -> int:
    """Drop every other connection to the test database, as a restart or a firewall would."""
    from django.db import connection

    ids = server_connections()
    with connection.cursor() as cursor:
        for backend in ids:
            try:
                if connection.vendor == "postgresql":
                    cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
                else:
                    cursor.execute(f"KILL {int(backend)}")
            except Exception:  # noqa: BLE001 - it went away by itself
                pass
    return len(ids)


def sqlite_path() -> str:
    from django.db import connection

    return str(connection.settings_dict["NAME"])


def sqlite_probe(timeout: float) -> bool:
    """True when ``BEGIN IMMEDIATE`` gets the write lock within ``timeout`` seconds."""
    probe = sqlite3.connect(sqlite_path(), timeout=timeout, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()
