"""The compressed day's database servers, its own: restarted once during the run, never the shared ones.

- PostgreSQL: a cluster made with ``initdb`` in a temporary directory, with PostgreSQL's defaults,
  and a PgBouncer of its own in transaction mode in front of it, configured as docs/postgresql.md
  shows (plus its authentication). Its restart is ``pg_ctl restart -m fast``.
- MariaDB: a server of its own (``mariadb-install-db``, ``mariadbd``) on a temporary directory;
  its restart is a SIGTERM and a new start on the same files.
- SQLite: a file. It has no server to restart: an outside process holds the write lock instead.

Servers run as the ``postgres`` / ``mysql`` system users when the harness runs as root.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_port(port: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {seconds:g} s")


def _as(user: str) -> dict[str, Any]:
    """Popen arguments that run a server as ``user`` when the harness runs as root."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid}


def _own(path: Path, user: str) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, user, user)


class Server:
    """One database for the day: ``env`` for the settings, ``restart()`` once, ``stop()`` at the end."""

    vendor = ""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.env: dict[str, str] = {"DURQ_DAY_DB": self.vendor}

    def start(self) -> None: ...

    def restart(self) -> str:
        """Restart the database; says what was done and how long it took."""
        raise NotImplementedError

    def problem(self) -> str | None:
        """Why the database cannot be reached any more (a server process of the day's exited), or None."""
        return None

    def stop(self) -> None: ...


class SQLiteFile(Server):
    vendor = "sqlite"

    def start(self) -> None:
        self.env["DURQ_DAY_NAME"] = str(self.workdir / "day.sqlite3")

    def restart(self) -> str:
        code = (
            "import sqlite3, sys, time\n"
            "db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)\n"
            "db.execute('BEGIN EXCLUSIVE'); time.sleep(5); db.execute('ROLLBACK')\n"
        )
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", code, self.env["DURQ_DAY_NAME"]], check=True)
        return f"SQLite has no server: an outside process held the write lock ({time.monotonic() - started:.1f} s)"


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda path: int(Path(path).parts[-3]))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries (initdb) on this machine")
    return Path(found[-1]).parent


class PostgresBehindPgBouncer(Server):
    vendor = "postgres"

    def __init__(self, workdir: Path, direct_listen: bool) -> None:
        super().__init__(workdir)
        self.direct_listen = direct_listen
        self.data = workdir / "pgdata"
        self.port = free_port()
        self.bouncer_port = free_port()
        self.bouncer: subprocess.Popen[bytes] | None = None

    def _pg_ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c max_connections=200"
        command = [str(_pg_bin() / "pg_ctl"), action, "-D", str(self.data), "-w", "-o", options, "-l", str(self.data / "log")]
        subprocess.run([*command, *extra], check=True, capture_output=True, **_as("postgres"))

    def start(self) -> None:
        self.workdir.chmod(0o755)
        self.data.mkdir()
        _own(self.data, "postgres")
        initdb = [str(_pg_bin() / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
        subprocess.run(initdb, check=True, capture_output=True, cwd=self.data, **_as("postgres"))
        self._pg_ctl("start")
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-c", "CREATE DATABASE day"],
            check=True,
            capture_output=True,
        )
        folder = self.workdir / "pgbouncer"
        folder.mkdir()
        (folder / "userlist.txt").write_text('"postgres" ""\n')
        (folder / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"day = host=127.0.0.1 port={self.port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.bouncer_port}\n"
            "unix_socket_dir =\n"
            "pool_mode = transaction\n"
            "default_pool_size = 20\n"
            # Authentication (a server with trust needs none from PgBouncer either) and room for
            # every worker's connections: a user sets these two for PgBouncer to start and serve.
            "auth_type = trust\n"
            f"auth_file = {folder / 'userlist.txt'}\n"
            "max_client_conn = 500\n"
        )
        for path in (folder, *folder.iterdir()):
            _own(path, "postgres")
        log = (self.workdir / "pgbouncer.log").open("wb")
        self.bouncer = subprocess.Popen(
            [shutil.which("pgbouncer") or "/usr/sbin/pgbouncer", str(folder / "pgbouncer.ini")],
            stdout=log,
            stderr=subprocess.STDOUT,
            **_as("postgres"),
        )
        _wait_for_port(self.bouncer_port)
        self.env.update(DURQ_DAY_NAME="day", DURQ_DAY_PORT=str(self.bouncer_port))
        if self.direct_listen:
            self.env["DURQ_DAY_DIRECT_PORT"] = str(self.port)

    def restart(self) -> str:
        started = time.monotonic()
        self._pg_ctl("restart", "-m", "fast")
        return f"pg_ctl restart -m fast of the day's own cluster ({time.monotonic() - started:.1f} s); PgBouncer kept running"

    def problem(self) -> str | None:
        if self.bouncer is not None and self.bouncer.poll() is not None:
            return f"PgBouncer exited with status {self.bouncer.returncode} (see pgbouncer.log)"
        return None

    def stop(self) -> None:
        if self.bouncer is not None and self.bouncer.poll() is None:
            self.bouncer.terminate()
            self.bouncer.wait(timeout=30)
        try:
            self._pg_ctl("stop", "-m", "immediate")
        except subprocess.CalledProcessError:
            pass


class MariaDBServer(Server):
    vendor = "mysql"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.data = workdir / "mariadb"
        self.port = free_port()
        self.popen: subprocess.Popen[bytes] | None = None

    def _launch(self) -> None:
        log = (self.workdir / "mariadb.log").open("ab")
        self.popen = subprocess.Popen(
            [
                shutil.which("mariadbd") or "/usr/sbin/mariadbd",
                "--no-defaults",
                f"--datadir={self.data}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.data / 'mariadb.sock'}",
                f"--pid-file={self.data / 'mariadb.pid'}",
                "--skip-grant-tables",  # a throwaway server: any user connects, as root would
                "--max-connections=300",
                *(["--user=mysql"] if os.geteuid() == 0 else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        _wait_for_port(self.port)

    def start(self) -> None:
        self.workdir.chmod(0o755)
        self.data.mkdir()
        _own(self.data, "mysql")
        install = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
        command = [install, "--no-defaults", f"--datadir={self.data}", "--skip-test-db"]
        command.append("--auth-root-authentication-method=normal")
        if os.geteuid() == 0:
            command.append("--user=mysql")
        subprocess.run(command, check=True, capture_output=True)
        self._launch()
        import MySQLdb

        server = MySQLdb.connect(host="127.0.0.1", port=self.port, user="root")
        try:
            server.cursor().execute("CREATE DATABASE day CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        finally:
            server.close()
        self.env.update(DURQ_DAY_NAME="day", DURQ_DAY_PORT=str(self.port))

    def restart(self) -> str:
        assert self.popen is not None
        started = time.monotonic()
        self.popen.send_signal(signal.SIGTERM)
        self.popen.wait(timeout=120)
        self._launch()
        return f"the day's own MariaDB server stopped (SIGTERM) and started again ({time.monotonic() - started:.1f} s)"

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            self.popen.wait(timeout=120)


def make_server(vendor: str, workdir: Path, direct_listen: bool) -> Server:
    if vendor == "postgres":
        return PostgresBehindPgBouncer(workdir, direct_listen)
    if vendor == "mysql":
        return MariaDBServer(workdir)
    return SQLiteFile(workdir)
