"""The recipes of docs/deploy.md, run as pasted wherever this machine allows.

Each recipe's worker command line is run as its manager runs it, works a job, and is stopped with
the manager's signal inside the manager's stop timeout. The systemd unit also goes through
``systemd-analyze verify``; the Kubernetes liveness probe runs against the health view of a live
server; PgBouncer starts from the pasted ``pgbouncer.ini`` with password authentication, as a
user other than root, and a burst worker runs a job through it. What is not run here (systemd,
Docker, a cluster) the page says.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.urls import include, path

from django_durq.models import WorkerProcess
from tests.conftest import ROOT, db_vendor, wait_until
from tests.ledger import jobs
from tests.ledger.models import Effect
from tests.test_docs import Block, blocks

PAGE = ROOT / "docs" / "deploy.md"
TOKEN = "deploy-recipes-test-token"
urlpatterns = [path("durq/", include("django_durq.urls"))]  # the web app's, for the probe


def recipe(test: Any) -> Any:
    """A recipe test: real worker processes, on one CI leg (the recipes do not depend on the database)."""
    for mark in (
        pytest.mark.processes,
        pytest.mark.one_leg,
        pytest.mark.django_db(transaction=True),
        pytest.mark.skipif(db_vendor() != "sqlite", reason="the recipes do not depend on the database: the SQLite leg runs them"),
    ):
        test = mark(test)
    return test


def block(first_line: str) -> Block:
    found = [candidate for candidate in blocks(PAGE) if candidate.first_line == first_line]
    assert len(found) == 1, f"docs/deploy.md has {len(found)} blocks starting {first_line!r}"
    return found[0]


def block_with(text: str) -> Block:
    found = [candidate for candidate in blocks(PAGE) if text in candidate.code]
    assert len(found) == 1, f"docs/deploy.md has {len(found)} blocks with {text!r}"
    return found[0]


def yaml_block(first_line: str) -> Any:
    yaml = pytest.importorskip("yaml")  # PyYAML: in the tox environments' deps
    return yaml.safe_load(block(first_line).code)


def grace_of(argv: list[str]) -> float:
    return float(argv[argv.index("--grace") + 1])


def run_and_stop(argv: list[str], env: dict[str, str], stop_signal: int, stop_timeout: float) -> str:
    """Run a recipe's worker command line until it has run a job, then stop it as its manager does."""
    assert argv[0] in ("python", "/srv/app/.venv/bin/python") and argv[1] == "manage.py", argv
    job = jobs.effect.enqueue(tag="recipe")
    # `manage.py` of the recipe is the project's; the tests' project is run through django-admin's module.
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", *argv[2:]],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_until(lambda: worker.poll() is not None or Effect.objects.filter(job_id=job.pk).exists(), 60, "the job to run")
        assert worker.poll() is None
        worker.send_signal(stop_signal)
        output, _ = worker.communicate(timeout=stop_timeout)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    assert worker.returncode == 0, output
    return output


# --- systemd ---------------------------------------------------------------------------------------


def unit_settings(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if re.match(r"^[A-Za-z]+=", line))


@recipe
def test_the_systemd_unit_verifies_and_its_command_stops_inside_the_stop_timeout(worker_env, tmp_path):
    unit = block("# /etc/systemd/system/durq-worker@.service")
    settings = unit_settings(unit.code)
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        # A scratch root holding the unit and the interpreter's path: verify checks that the command exists.
        root = tmp_path / "root"
        (root / "etc/systemd/system").mkdir(parents=True)
        (root / "etc/systemd/system/durq-worker@.service").write_text(unit.code)
        interpreter = root / settings["ExecStart"].split()[0].lstrip("/")
        interpreter.parent.mkdir(parents=True)
        interpreter.write_text("#!/bin/sh\n")
        interpreter.chmod(0o755)
        verified = subprocess.run(
            [analyze, "verify", f"--root={root}", "--man=no", "--recursive-errors=no", "durq-worker@1.service"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert verified.returncode == 0 and not verified.stdout.strip() and not verified.stderr.strip(), verified
    argv = settings["ExecStart"].split()
    assert settings["KillSignal"] == "SIGTERM" and settings["KillMode"] == "mixed"
    stop_timeout = float(settings["TimeoutStopSec"])
    assert stop_timeout > grace_of(argv)
    env = {**worker_env, **dict([settings["Environment"].split("=", 1)]), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    run_and_stop(argv, env, signal.SIGTERM, stop_timeout)
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: the unit was not verified (its command line ran)")


# --- Docker Compose -------------------------------------------------------------------------------


def seconds(duration: str) -> float:
    """A Compose duration such as ``45s`` or ``1m30s``."""
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", duration)
    assert parts and "".join(number + unit for number, unit in parts) == duration, duration
    return sum(float(number) * units[unit] for number, unit in parts)


@recipe
def test_the_compose_worker_runs_in_exec_form_and_stops_inside_its_grace_period(worker_env):
    worker = yaml_block("# compose.yaml")["services"]["worker"]
    argv = worker["command"]
    assert isinstance(argv, list), "exec form: the worker itself gets the signal"
    assert worker["init"] is True and worker["restart"] == "unless-stopped"
    stop_timeout = seconds(worker["stop_grace_period"])
    assert stop_timeout > grace_of(argv)
    run_and_stop(
        argv, {**worker_env, **worker["environment"], "DJANGO_SETTINGS_MODULE": "tests.settings"}, signal.SIGTERM, stop_timeout
    )


# --- Kubernetes -----------------------------------------------------------------------------------


def probe(script: str, url: str) -> int:
    """The liveness probe's exit status, run as the kubelet runs it (in the container, with its env)."""
    env = {**os.environ, "DURQ_HEALTH_URL": url, "DURQ_MONITORING_TOKEN": TOKEN}
    return subprocess.run([sys.executable, "-c", script], env=env, timeout=30).returncode


@recipe
@pytest.mark.urls(__name__)
def test_the_kubernetes_probe_follows_the_health_view_and_the_worker_stops_inside_its_grace(worker_env, live_server, settings):
    settings.DURQ = {**settings.DURQ, "MONITORING": {"TOKEN": TOKEN, "MIN_WORKERS": 1, "MAX_WAIT": 300}}
    spec = yaml_block("# worker.yaml")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    argv = container["command"]
    assert spec["terminationGracePeriodSeconds"] > grace_of(argv)
    liveness = container["livenessProbe"]
    assert liveness["exec"]["command"][:2] == ["python", "-c"]
    script = liveness["exec"]["command"][2]
    env_names = {item["name"] for item in container["env"]}
    assert {"DURQ_HEALTH_URL", "DURQ_MONITORING_TOKEN"} <= env_names
    health = f"{live_server.url}/durq/health/"

    jobs.effect.enqueue(tag="nobody-serves-this")
    assert probe(script, health) == 1, "a due job and no live worker: 503, the probe fails"
    assert probe(script, unreachable_url()) == 0, "the web app down is not the worker's fault"
    run_and_stop(
        argv, {**worker_env, "DJANGO_SETTINGS_MODULE": "tests.settings"}, signal.SIGTERM, spec["terminationGracePeriodSeconds"]
    )

    started = subprocess.Popen(
        [sys.executable, "-m", "django", *argv[2:]], cwd=ROOT, env=worker_env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        wait_until(lambda: WorkerProcess.objects.exists(), 60, "the worker to register")
        wait_until(lambda: probe(script, health) == 0, 30, "the probe to pass with a live worker and an empty queue")
    finally:
        started.send_signal(signal.SIGTERM)
        started.wait(60)


def unreachable_url() -> str:
    """A health URL on a port nothing listens on: the web app is down."""
    from tests.pgbouncer import free_port

    return f"http://127.0.0.1:{free_port()}/durq/health/"


# --- PgBouncer ------------------------------------------------------------------------------------


@pytest.fixture
def site_role() -> Iterator[tuple[str, str]]:
    """The recipe's role (``mysite``), made with its own statement, owning the test database's tables."""
    role, password = f"durq_deploy_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    statement = re.search(r'-c "(CREATE ROLE [^"]+)"', block_with("CREATE ROLE").code).group(1)  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        cursor.execute(statement.replace("mysite", role).replace("change-me", password))
        # Instead of ALTER DATABASE … OWNER: the test database stays the test run's.
        cursor.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        cursor.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
    try:
        yield role, password
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP OWNED BY {role}")
            cursor.execute(f"DROP ROLE {role}")


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(db_vendor() != "postgres", reason="PgBouncer pools PostgreSQL connections")
def test_the_pgbouncer_sample_logs_clients_in_with_passwords_and_runs_as_another_user(site_role, worker_env):
    import psycopg

    from tests import pgbouncer

    role, password = site_role
    database = str(connection.settings_dict["NAME"])
    # The page's userlist statement, run as the superuser it runs as.
    query = re.search(r'-Atc "(.+)" \|', block_with("pg_authid").code).group(1).replace('\\"', '"')  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        cursor.execute(query.replace("'mysite'", f"'{role}'"))  # no parameters: the driver leaves %s alone
        userlist = "\n".join(row[0] for row in cursor.fetchall()) + "\n"
    assert userlist.startswith(f'"{role}" "SCRAM-SHA-256$'), "the server keeps a SCRAM secret, which PgBouncer checks against"

    port = pgbouncer.free_port()
    ini = block("; /etc/pgbouncer/pgbouncer.ini").code
    # Only what names this machine changes: the database, the port and where the files are.
    server = pgbouncer.server()
    ini = ini.replace(
        "mysite = host=127.0.0.1 port=5432 dbname=mysite",
        f"{database} = host={server['host']} port={server['port']} dbname={database}",
    )
    ini = ini.replace("listen_port = 6432", f"listen_port = {port}").replace("/etc/pgbouncer", "{folder}")
    ini = ini.replace("unix_socket_dir = /var/run/postgresql", "unix_socket_dir = {folder}")
    assert ini.count("{folder}") == 3 and str(port) in ini and database in ini, ini  # the comment line, the socket, auth_file
    with contextlib.ExitStack() as stack:
        try:
            # As root, the page's `-u postgres`: PgBouncer refuses to run as root.
            folder = stack.enter_context(pgbouncer.running(ini, {"userlist.txt": userlist}))
        except pgbouncer.Missing as missing:
            if os.environ.get("CI") == "true":
                pytest.fail(f"{missing}; with CI=true this test must run")
            pytest.skip(str(missing))
        with psycopg.connect(host="127.0.0.1", port=port, dbname=database, user=role, password=password) as client:
            assert client.execute("SELECT current_user").fetchone() == (role,)
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(host="127.0.0.1", port=port, dbname=database, user=role, connect_timeout=5).close()

        job = jobs.effect.enqueue(tag="through the recipe")
        env = {**worker_env, "DURQ_TEST_PGBOUNCER_PORT": str(port), "DURQ_PG_USER": role, "DURQ_PG_PASSWORD": password}
        result = subprocess.run(
            [sys.executable, "-m", "django", "durq_worker", "--burst", "--queue", "default:2"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert Effect.objects.filter(job_id=job.pk).exists(), result.stderr
        assert "durq.W006" in result.stderr, "the worker found the pooler"
        assert owner_of(folder / "pgbouncer.ini") != 0, "PgBouncer runs as another user than root"


def owner_of(ini: Path) -> int:
    """The user id of the PgBouncer process started with ``ini``."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if str(ini) in (status.parent / "cmdline").read_bytes().decode(errors="replace"):
                return int(next(line for line in status.read_text().splitlines() if line.startswith("Uid:")).split()[1])
        except OSError:
            continue
    raise AssertionError(f"no PgBouncer process runs {ini}")
