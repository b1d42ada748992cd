"""A freshly created database for every measurement, dropped afterwards.

SQLite: a new file (WAL) under ``benchmarks/.work/`` on the same disk as the checkout.
PostgreSQL and MariaDB: a database with a unique name, ``test_durq_bench_…``, created with the
servers' own command-line clients. Servers are found as the test suite finds them
(``DURQ_PG_HOST/PORT/USER/PASSWORD``, ``DURQ_MYSQL_HOST/PORT/USER/PASSWORD``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .envs import BENCH_DIR

WORK = BENCH_DIR / ".work"
PREFIX = "test_durq_bench"
_counter = itertools.count(1)

PG = {
    "host": os.environ.get("DURQ_PG_HOST", "127.0.0.1"),
    "port": os.environ.get("DURQ_PG_PORT", "5432"),
    "user": os.environ.get("DURQ_PG_USER", "postgres"),
    "password": os.environ.get("DURQ_PG_PASSWORD", ""),
}
MYSQL = {
    "host": os.environ.get("DURQ_MYSQL_HOST", "127.0.0.1"),
    "port": os.environ.get("DURQ_MYSQL_PORT", "3306"),
    "user": os.environ.get("DURQ_MYSQL_USER", "root"),
    "password": os.environ.get("DURQ_MYSQL_PASSWORD", ""),
}


def psql(sql: str, database: str = "postgres", port: str | None = None) -> str:
    """Run ``sql`` with psql; ``port`` names a server of the harness's own (see ``core/pg_server.py``)."""
    env = {**os.environ, "PGPASSWORD": PG["password"]}
    where = ["-h", PG["host"], "-p", port or PG["port"]]
    command = ["psql", "-X", "-q", "-At", *where, "-U", PG["user"], "-d", database, "-c", sql]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"psql: {done.stderr.strip()}")
    return done.stdout


def mariadb(sql: str, database: str | None = None) -> str:
    client = shutil.which("mariadb") or shutil.which("mysql") or "mariadb"
    command = [client, "-h", MYSQL["host"], "-P", MYSQL["port"], "-u", MYSQL["user"], "-N", "-B", "-e", sql]
    if database:
        command[1:1] = ["-D", database]
    if MYSQL["password"]:
        command.insert(1, f"-p{MYSQL['password']}")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"mariadb: {done.stderr.strip()}")
    return done.stdout


def available(kind: str) -> str | None:
    """None when a server of this kind answers; otherwise why not."""
    try:
        if kind == "postgres":
            psql("SELECT 1")
        elif kind == "mysql":
            mariadb("SELECT 1")
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    return None


@dataclass
class Database:
    kind: str  # sqlite, postgres, mysql, redis
    name: str  # database name, or the file path for SQLite
    port: str | None = None  # a PostgreSQL server of the harness's own, not the shared one

    def env(self) -> dict[str, str]:
        env = {"BENCH_DB": self.kind, "BENCH_DB_NAME": self.name}
        if self.port:
            env["DURQ_PG_PORT"] = self.port
        return env

    @property
    def url(self) -> str:
        if self.kind == "postgres":
            auth = PG["user"] + (f":{PG['password']}" if PG["password"] else "")
            return f"postgresql://{auth}@{PG['host']}:{self.port or PG['port']}/{self.name}"
        return self.name

    def query(self, sql: str) -> list[list[str]]:
        """Rows of ``sql`` run in this PostgreSQL or MariaDB database, as text fields."""
        if self.kind == "postgres":
            out = psql(sql, self.name, self.port)
        elif self.kind == "mysql":
            out = mariadb(sql, self.name)
        else:
            raise RuntimeError(f"no command-line client for {self.kind}")
        return [row.split("|" if self.kind == "postgres" else "\t") for row in out.splitlines() if row]

    def drop(self) -> None:
        if self.kind == "sqlite":
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(self.name + suffix).unlink(missing_ok=True)
            shutil.rmtree(self.name + "-durq", ignore_errors=True)  # django-durq's presence locks
        elif self.kind == "postgres":
            psql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)', port=self.port)
        elif self.kind == "mysql":
            mariadb(f"DROP DATABASE IF EXISTS `{self.name}`")


def analyze(database: Database) -> None:
    """Refresh the planner's statistics of a PostgreSQL database (others keep theirs up to date)."""
    if database.kind == "postgres":
        psql("ANALYZE", database.name, database.port)


def create(kind: str, tag: str, port: str | None = None) -> Database:
    """A new, empty database of ``kind``; ``tag`` becomes part of its name; ``port``: see :func:`psql`."""
    safe = "".join(ch if ch.isalnum() else "_" for ch in tag).lower()
    name = f"{PREFIX}_{safe}_{os.getpid()}_{next(_counter)}"
    if kind == "sqlite":
        WORK.mkdir(parents=True, exist_ok=True)
        database = Database(kind, str(WORK / f"{name}.sqlite3"))
        database.drop()
        return database
    if kind == "postgres":
        psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', port=port)
        psql(f'CREATE DATABASE "{name}"', port=port)
    elif kind == "mysql":
        mariadb(f"DROP DATABASE IF EXISTS `{name}`")
        mariadb(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    return Database(kind, name, port)


def _owner_alive(name: str) -> bool:
    """Whether the harness process that created this database (its pid is in the name) still runs."""
    parts = name.split(".")[0].rsplit("_", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def drop_leftovers() -> list[str]:
    """Drop databases and files that an interrupted earlier run of the harness left behind."""
    dropped = []
    if available("postgres") is None:
        for name in psql(f"SELECT datname FROM pg_database WHERE datname LIKE '{PREFIX}\\_%'").split():
            if not _owner_alive(name):
                psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                dropped.append(name)
    if available("mysql") is None:
        for name in mariadb(f"SHOW DATABASES LIKE '{PREFIX}\\_%'").split():
            if not _owner_alive(name):
                mariadb(f"DROP DATABASE IF EXISTS `{name}`")
                dropped.append(name)
    if WORK.exists():
        for path in WORK.glob(f"{PREFIX}_*"):
            if not _owner_alive(path.name):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
                dropped.append(path.name)
    return dropped
