"""``durq_worker`` as a newcomer meets it: start-up mistakes end in one line, signals are obeyed, ``--reload`` reloads."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import db_vendor, run_command, wait_until

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def settings_module(tmp_path: Path, name: str, body: str) -> dict[str, str]:
    """A settings module in ``tmp_path`` that starts from the tests' settings; the env that selects it."""
    (tmp_path / f"{name}.py").write_text(f"from tests.settings import *  # noqa: F403\n\n{body}\n")
    return {"DJANGO_SETTINGS_MODULE": name, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


def one_line_refusal(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_unapplied_migrations_stop_the_worker_with_one_line(worker_env, tmp_path):
    env = {**worker_env, "DURQ_TEST_DB": "sqlite", "DURQ_TEST_DB_IN_USE": str(tmp_path / "never-migrated.sqlite3")}
    line = one_line_refusal(run_command("durq_worker", "--burst", env=env, timeout=60))
    assert "run manage.py migrate" in line and "django_durq" in line


def test_an_unknown_database_alias_stops_the_worker_with_one_line(worker_env, tmp_path):
    env = {**worker_env, **settings_module(tmp_path, "queue_elsewhere", 'DURQ = {**DURQ, "DATABASE": "queue"}')}
    line = one_line_refusal(run_command("durq_worker", "--burst", env=env, timeout=60))
    assert "'queue'" in line and "DATABASES" in line


def unreachable_database() -> dict[str, str]:
    vendor = db_vendor()
    if vendor == "sqlite":
        return {"DURQ_TEST_DB_IN_USE": "/nonexistent-directory/queue.sqlite3"}
    if vendor == "postgres":
        return {"DURQ_PG_PORT": "1", "DURQ_TEST_PGBOUNCER_PORT": ""}  # not through the PgBouncer leg's pooler either
    return {"DURQ_MYSQL_PORT": "1"}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_first_signal_during_start_up_stops_the_worker(spawn_worker, signum):
    worker = spawn_worker(env=unreachable_database())
    wait_until(lambda: "retry" in worker.output(), 60, "the worker to retry its database")
    worker.signal(signum)
    assert worker.wait(timeout=30) == 0, worker.output()
    assert "Traceback" not in worker.output()
    assert "stopped during start-up" in worker.output()


def test_reload_restarts_the_worker_when_a_module_changes(spawn_worker, worker_env, tmp_path):
    env = settings_module(tmp_path, "reloading", "")
    watched = tmp_path / "reloading.py"
    worker = spawn_worker("--reload", "--queue", "default", env=env)
    wait_until(lambda: "started;" in worker.output(), 60, "the worker to start")

    touches = iter(range(1, 1000))

    def touched_and_restarted() -> bool:
        # The reloader compares modification times once a second: keep moving it on until it notices.
        moved = time.time() + next(touches)
        os.utime(watched, (moved, moved))
        return worker.output().count("started;") >= 2

    wait_until(touched_and_restarted, 60, "the worker to restart", interval=1)
    output = worker.output()
    assert "reloading.py changed; restarting the worker" in output
    assert "Traceback" not in output
    worker.signal(signal.SIGINT)  # like Ctrl-C, even for a worker started with SIGINT ignored
    assert worker.wait(timeout=30) == 0, worker.output()


def test_reload_and_burst_do_not_go_together(worker_env):
    result = run_command("durq_worker", "--reload", "--burst", env=worker_env, timeout=60)
    assert "--reload" in one_line_refusal(result)
