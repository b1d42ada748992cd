"""A PgBouncer of the tests' own (Debian's ``pgbouncer``), in transaction mode, on a free port.

Started with fewer server connections than a worker opens, so that transactions really do move
between server connections. ``tests/db/test_pgbouncer.py`` starts one per module; the PgBouncer CI
leg (``DURQ_TEST_THROUGH_PGBOUNCER=1``) one per test session, and every worker the tests spawn
reaches the queue through it (``tests/conftest.py``, ``worker_env``).

PgBouncer refuses to run as root: as root, it runs as the ``postgres`` user (``-u``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SERVER_CONNECTIONS = 5  # PgBouncer's pool: fewer than one worker with four slots holds (4 + 1 + 4)


@dataclass
class Bouncer:
    port: int

    def transactions(self, database: str) -> int:
        """Transactions PgBouncer has passed to ``database`` so far (its admin console's SHOW STATS)."""
        import psycopg  # here, not at the top: the MariaDB leg collects the tests without psycopg

        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=server()["user"],
            dbname="pgbouncer",
            autocommit=True,
            cursor_factory=psycopg.ClientCursor,  # the console speaks the simple protocol only
        ) as admin:
            cursor = admin.execute("SHOW STATS")
            columns = [column.name for column in cursor.description or ()]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
        return sum(int(row["total_xact_count"]) for row in rows if row["database"] == database)


def server() -> dict[str, str]:
    return {
        "host": os.environ.get("DURQ_PG_HOST", "127.0.0.1"),
        "port": os.environ.get("DURQ_PG_PORT", "5432"),
        "user": os.environ.get("DURQ_PG_USER", "postgres"),
        "password": os.environ.get("DURQ_PG_PASSWORD", ""),
    }


class Missing(Exception):
    """PgBouncer cannot run here (not installed, or root with no user to run it as)."""


def binary() -> str:
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise Missing("pgbouncer is not installed (scripts/system-deps installs Debian's package)")
    return found


def run_as() -> list[str]:
    """PgBouncer's ``-u USER`` when this process is root, which PgBouncer refuses to run as."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise Missing("PgBouncer refuses to run as root, and there is no postgres user to run it as") from None
    return ["-u", "postgres"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@contextmanager
def running(config: str, files: dict[str, str] | None = None, user: list[str] | None = None) -> Iterator[Path]:
    """Run PgBouncer with ``config`` (an ini text; ``{folder}`` is its folder) until the block ends.

    ``files``: other files to write in the folder (a userlist), by name. The folder is readable
    by PgBouncer's user.
    """
    program = binary()
    as_user = run_as() if user is None else user
    folder = Path(tempfile.mkdtemp(prefix="durq-pgbouncer-"))
    folder.chmod(0o755)
    for name, text in (files or {}).items():
        (folder / name).write_text(text)
    ini = folder / "pgbouncer.ini"
    ini.write_text(config.replace("{folder}", str(folder)))
    for path in folder.iterdir():
        path.chmod(0o644)
    log = folder / "pgbouncer.log"
    port = int(next(line.split("=")[1] for line in ini.read_text().splitlines() if line.startswith("listen_port")))
    with log.open("wb") as sink:
        process = subprocess.Popen([program, *as_user, str(ini)], stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while process.poll() is None and not accepts(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        if process.poll() is not None or not accepts(port):
            raise RuntimeError(f"PgBouncer did not start:\n{log.read_text()}")
        yield folder
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def transaction_pooler(pool_size: int = SERVER_CONNECTIONS, pool_mode: str = "transaction") -> Iterator[Bouncer]:
    """A PgBouncer in transaction mode (or ``pool_mode``) in front of the tests' PostgreSQL server, trusting its clients."""
    backend = server()
    port = free_port()
    config = (
        "[databases]\n"
        f"* = host={backend['host']} port={backend['port']}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        "auth_file = {folder}/userlist.txt\n"
        f"admin_users = {backend['user']}\n"
        f"pool_mode = {pool_mode}\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 500\n"
    )
    with running(config, {"userlist.txt": f'"{backend["user"]}" "{backend["password"]}"\n'}):
        yield Bouncer(port)
