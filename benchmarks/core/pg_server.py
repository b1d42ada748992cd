"""A PostgreSQL server of the harness's own on a free loopback port, for the bloat workload.

The shared server this was built on runs with autovacuum off (its postgresql.conf), and a
table's storage parameters can turn autovacuum off but never on where the server has it off.
How large the job table grows under autovacuum is therefore measured on a throwaway cluster
with PostgreSQL's defaults, made by the same installation's ``initdb`` (as the ``postgres``
system user when the harness runs as root, since PostgreSQL refuses to run as root), stopped
and deleted with the run.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from . import databases
from .redis import free_port


def _bin_dir() -> Path | None:
    found = shutil.which("pg_config")
    if found:
        done = subprocess.run([found, "--bindir"], capture_output=True, text=True)
        candidate = Path(done.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda path: int(Path(path).parts[-3]))
    return Path(versions[-1]).parent if versions else None


class PostgresServer:
    def __init__(self, log_dir: Path, settings: dict[str, str] | None = None) -> None:
        """``settings``: server settings given at start (``shared_preload_libraries``, say); the defaults otherwise."""
        self.log_dir = log_dir
        self.settings = settings or {}
        self.port = ""
        self.data: Path | None = None
        self.popen: subprocess.Popen[bytes] | None = None
        self.version = ""

    @staticmethod
    def missing() -> str | None:
        if _bin_dir() is None:
            return "no PostgreSQL server binaries (initdb) on this machine; the bloat rows are skipped"
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                return "running as root without a postgres system user to run a private PostgreSQL as"
        return None

    def _as_owner(self) -> dict[str, Any]:
        """Popen arguments that drop root for the ``postgres`` user (PostgreSQL will not run as root)."""
        return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}

    def start(self) -> None:
        bin_dir = _bin_dir()
        assert bin_dir is not None
        self.port = str(free_port())
        self.data = Path(tempfile.mkdtemp(prefix="durq-bench-pg-"))
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.data, owner.pw_uid, owner.pw_gid)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        initdb = [str(bin_dir / "initdb"), "-D", str(self.data), "-U", databases.PG["user"], "--auth=trust", "-E", "UTF8"]
        done = subprocess.run(initdb, capture_output=True, text=True, cwd=self.data, **self._as_owner())
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {(done.stdout + done.stderr)[-1500:]}")
        command = [
            str(bin_dir / "postgres"), "-D", str(self.data), "-c", f"port={self.port}",
            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.data}",
        ]  # fmt: skip
        for name, value in self.settings.items():
            command += ["-c", f"{name}={value}"]
        with (self.log_dir / "postgres.log").open("wb") as sink:
            self.popen = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.data, **self._as_owner()
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.version = self.sql("SHOW server_version").strip()
                return
            except RuntimeError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the private PostgreSQL did not answer on port {self.port}")

    def sql(self, statement: str, database: str = "postgres") -> str:
        return databases.psql(statement, database, self.port)

    def configure(self, settings: dict[str, str]) -> None:
        """Server-wide settings that need no restart (``ALTER SYSTEM``), then a reload; {} resets them."""
        self.sql("ALTER SYSTEM RESET ALL")
        for name, value in settings.items():
            self.sql(f"ALTER SYSTEM SET {name} = '{value}'")
        self.sql("SELECT pg_reload_conf()")
        time.sleep(0.2)  # the postmaster signals its children; let them read the file

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)  # "fast" shutdown: sessions are ended, nothing is kept
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if self.data is not None:
            shutil.rmtree(self.data, ignore_errors=True)
