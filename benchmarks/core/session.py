"""One run of the harness: its options, scratch directory, virtualenvs, Redis and results file."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters import Adapter
from . import databases, envs, procs
from .pg_server import PostgresServer
from .redis import RedisServer

# How this run was started, recorded with every line so that the published page can say it; the
# BENCH_* variables change what is measured (benchsite/settings.py), so they are part of it.
COMMAND = " ".join(
    [f"{name}={shlex.quote(value)}" for name, value in sorted(os.environ.items()) if name.startswith("BENCH_")]
    + [shlex.join(["python3", "-m", "benchmarks.run", *sys.argv[1:]])]
)

RESULTS = envs.BENCH_DIR / "results"

# Variables of the calling shell that would send a child to the wrong interpreter or settings.
_DROP_ENV = ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "DJANGO_SETTINGS_MODULE", "PYTHONSTARTUP")


@dataclass
class Options:
    repeats: int = 3
    jobs: int = 5000
    quick: bool = False
    idle_seconds: float = 60.0
    memory_jobs: int = 100_000
    scale_rows: int = 1_000_000
    scaling_jobs: int = 100_000
    bloat_jobs: int = 1_000_000
    coexist_seconds: float = 10.0
    verbose: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class Skip(Exception):
    """This system, database or workload cannot run here; the message says why."""


class Session:
    def __init__(self, options: Options, results_path: Path | None = None) -> None:
        self.options = options
        self.run_id = time.strftime("%Y%m%d-%H%M%S")
        self.work = databases.WORK / f"run-{self.run_id}-{os.getpid()}"
        self.work.mkdir(parents=True, exist_ok=True)
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.results_path = results_path or RESULTS / f"{self.run_id}.jsonl"
        self.python = envs.find_python()
        self._pythons: dict[str, Path] = {}
        self._env_errors: dict[str, str] = {}
        self._redis: RedisServer | None = None
        self._redis_error: str | None = None
        self._pg_server: PostgresServer | None = None
        self._pg_server_error: str | None = None
        self._servers: dict[str, str | None] = {}
        self._closers: list[Callable[[], None]] = []  # what a workload started for the whole run
        self.versions: dict[str, dict[str, str]] = {}
        self.hints: dict[tuple[str, str, str], float] = {}
        self._counter = 0

    # --- output --------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(text, flush=True)

    def record(
        self,
        workload: str,
        adapter: Adapter | None,
        database: str,
        params: dict[str, Any],
        repeat: int,
        metrics: dict[str, Any],
        load_before: list[float],
    ) -> dict[str, Any]:
        line = {
            "run_id": self.run_id,
            "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "workload": workload,
            "system": adapter.name if adapter else "-",
            "label": adapter.label if adapter else "-",
            "database": database,
            "params": params,
            "repeat": repeat,
            "metrics": metrics,
            "loadavg_before": load_before,
            "loadavg_after": procs.loadavg(),
            "versions": self.versions.get(adapter.env, {}) if adapter else {},
            "command": COMMAND,
        }
        with self.results_path.open("a") as handle:
            handle.write(json.dumps(line) + "\n")
        return line

    def machine(self) -> dict[str, Any]:
        cpu = "?"
        with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
            for row in handle:
                if row.startswith("model name"):
                    cpu = row.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as handle:
            mem_kb = int(handle.readline().split()[1])
        return {
            "cpu": cpu,
            "cores": os.cpu_count(),
            "memory_gb": round(mem_kb / 1_048_576, 1),
            "kernel": platform.release(),
            "python": self.python.replace(os.path.expanduser("~"), "~", 1),
            "durq_revision": envs.git_revision(),
        }

    # --- environments --------------------------------------------------------------------------

    def python_for(self, adapter: Adapter) -> Path:
        if adapter.env in self._env_errors:
            raise Skip(self._env_errors[adapter.env])
        if adapter.env not in self._pythons:
            try:
                self._pythons[adapter.env] = envs.ensure(adapter.env, self.python, log=self.say)
            except envs.EnvError as error:
                self._env_errors[adapter.env] = str(error)
                raise Skip(str(error)) from None
            self.versions[adapter.env] = envs.installed_versions(adapter.env, list(adapter.packages))
            if adapter.needs_repo:
                self.versions[adapter.env]["django-durq"] = f"{envs.durq_version()} ({envs.git_revision()})"
        return self._pythons[adapter.env]

    def tools_python(self) -> Path:
        return envs.ensure("tools", self.python, log=self.say)

    def check_database(self, adapter: Adapter, database: str) -> None:
        """Raise Skip when ``adapter`` cannot run on ``database`` on this machine."""
        if database not in adapter.databases:
            raise Skip(f"{adapter.name} does not run on {database}")
        django_db = adapter.django_database(database)
        if django_db in ("postgres", "mysql"):
            if django_db not in self._servers:
                self._servers[django_db] = databases.available(django_db)
            if self._servers[django_db] is not None:
                raise Skip(f"{django_db} server unreachable: {self._servers[django_db]}")
        if django_db == "mysql":
            self.python_for(adapter)
            if not envs.has_module(adapter.env, "MySQLdb"):
                raise Skip(f"mysqlclient is not installed in {adapter.env}'s virtualenv")
        if database == "redis":
            self.redis()

    def redis(self) -> RedisServer:
        if self._redis_error:
            raise Skip(self._redis_error)
        if self._redis is None:
            missing = RedisServer.missing()
            if missing:
                self._redis_error = missing
                raise Skip(missing)
            server = RedisServer(self.work)
            try:
                server.start()
            except (RuntimeError, OSError) as error:
                self._redis_error = f"could not start redis-server: {error}"
                raise Skip(self._redis_error) from None
            self._redis = server
            self.say(f"[redis] own redis-server on 127.0.0.1:{server.port}")
        return self._redis

    def pg_server(self) -> PostgresServer:
        """A PostgreSQL of the harness's own, with the server defaults (autovacuum on); see core/pg_server.py."""
        if self._pg_server_error:
            raise Skip(self._pg_server_error)
        if self._pg_server is None:
            missing = PostgresServer.missing()
            if missing:
                self._pg_server_error = missing
                raise Skip(missing)
            server = PostgresServer(self.work)
            try:
                server.start()
            except (RuntimeError, OSError) as error:
                self._pg_server_error = f"could not start a private PostgreSQL: {error}"
                raise Skip(self._pg_server_error) from None
            self._pg_server = server
            self.say(f"[postgres] own PostgreSQL {server.version} on 127.0.0.1:{server.port}")
        return self._pg_server

    def on_close(self, closer: Callable[[], None]) -> None:
        """Run ``closer`` when the run ends (a server a workload started for itself)."""
        self._closers.append(closer)

    def close(self) -> None:
        for closer in self._closers:
            closer()
        if self._redis is not None:
            self._redis.stop()
        if self._pg_server is not None:
            self._pg_server.stop()

    # --- processes -----------------------------------------------------------------------------

    def next_tag(self, label: str) -> str:
        self._counter += 1
        return f"{self._counter:04d}-{label}"

    def env_for(self, adapter: Adapter, database: databases.Database, ticks: Path | None = None) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key not in _DROP_ENV}
        paths = [str(envs.SITES)]
        if adapter.needs_repo:
            paths.append(str(adapter.source or envs.REPO))
        env.update(database.env())
        env.update(
            {
                "PYTHONPATH": os.pathsep.join(paths),
                "DJANGO_SETTINGS_MODULE": "benchsite.settings",
                "BENCH_SYSTEM": adapter.name,
                "BENCH_DB_URL": database.url,
                "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        if self._redis is not None:
            env["BENCH_REDIS_URL"] = self._redis.url
        if ticks is not None:
            env["BENCH_TICKS"] = str(ticks)
        else:
            env.pop("BENCH_TICKS", None)
        return env

    @contextlib.contextmanager
    def fresh_database(self, adapter: Adapter, database: str, tag: str, port: str | None = None) -> Iterator[databases.Database]:
        """A new database with the system's schema, dropped afterwards (``port``: the harness's own PostgreSQL)."""
        python = self.python_for(adapter)
        db = databases.create(adapter.django_database(database), f"{adapter.name}_{tag}", port)
        try:
            env = self.env_for(adapter, db)
            for command in adapter.prepare_commands(python):
                procs.run(command, env, envs.SITES)
            if database == "redis":
                self.redis().flush()
            yield db
        finally:
            with contextlib.suppress(RuntimeError, OSError):
                db.drop()

    def agent(
        self,
        adapter: Adapter,
        db: databases.Database,
        *args: str,
        timeout_s: float = 1800,
        ticks: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Run ``benchsite.agent`` in the system's virtualenv; its JSON answer."""
        python = self.python_for(adapter)
        env = self.env_for(adapter, db, ticks) | (extra_env or {})
        out = procs.run([str(python), "-m", "benchsite.agent", *args], env, envs.SITES, timeout_s)
        return dict(json.loads(out.strip().splitlines()[-1]))

    def start_workers(
        self,
        adapter: Adapter,
        db: databases.Database,
        concurrency: int,
        ticks: Path,
        processes: int = 1,
        extra_env: dict[str, str] | None = None,
    ) -> procs.Group:
        """The worker command(s) at ``concurrency``, ``processes`` times over (as on that many hosts)."""
        python = self.python_for(adapter)
        commands = adapter.worker_commands(python, concurrency) * processes
        tag = self.next_tag(f"{adapter.name}-{db.kind}-worker")
        env = self.env_for(adapter, db, ticks) | (extra_env or {})
        return procs.start_group(commands, env, envs.SITES, self.work / "logs", tag)

    def ticks_file(self, label: str) -> Path:
        path = self.work / "ticks" / f"{self.next_tag(label)}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        return path
