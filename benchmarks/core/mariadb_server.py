"""A MariaDB server of the harness's own on a free loopback port, for diagnosing the scaling workload.

The shared server's counters (``SHOW GLOBAL STATUS``, ``INNODB_METRICS``) and slow query log mix in
every other client's work; a throwaway server made by the same installation's
``mariadb-install-db``, with its defaults (``--no-defaults``), counts only the harness's. When the
harness runs as root, the server runs as the ``mysql`` system user. Stopped and deleted with the run.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .redis import free_port


class MariaDBServer:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.port = ""
        self.data: Path | None = None
        self.popen: subprocess.Popen[bytes] | None = None

    @staticmethod
    def missing() -> str | None:
        for binary in ("mariadb-install-db", "mariadbd", "mariadb"):
            if shutil.which(binary) is None and not Path(f"/usr/sbin/{binary}").exists():
                return f"no {binary} on this machine"
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("mysql")
            except KeyError:
                return "running as root without a mysql system user to run a private MariaDB as"
        return None

    def _as_owner(self) -> dict[str, str]:
        return {"user": "mysql", "group": "mysql"} if os.geteuid() == 0 else {}

    def start(self) -> None:
        self.port = str(free_port())
        self.data = Path(tempfile.mkdtemp(prefix="durq-bench-mariadb-"))
        if os.geteuid() == 0:
            owner = pwd.getpwnam("mysql")
            os.chown(self.data, owner.pw_uid, owner.pw_gid)
        install = ["mariadb-install-db", "--no-defaults", f"--datadir={self.data}/db", "--auth-root-authentication-method=normal",
                   "--skip-test-db"]  # fmt: skip
        if os.geteuid() == 0:
            install.append("--user=mysql")
        done = subprocess.run(install, capture_output=True, text=True, cwd=self.data)
        if done.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {(done.stdout + done.stderr)[-1500:]}")
        mariadbd = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        command = [
            mariadbd, "--no-defaults", f"--datadir={self.data}/db", f"--port={self.port}", "--bind-address=127.0.0.1",
            f"--socket={self.data}/sock", f"--pid-file={self.data}/pid", f"--log-error={self.data}/error.log",
            "--skip-log-bin", "--max-connections=300",
        ]  # fmt: skip
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / "mariadb.log").open("wb") as sink:
            self.popen = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.data, **self._as_owner()
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.sql("SELECT 1")
                return
            except RuntimeError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the private MariaDB did not answer on port {self.port}")

    def sql(self, statement: str) -> str:
        client = shutil.which("mariadb") or "mariadb"
        command = [client, "-h", "127.0.0.1", "-P", self.port, "-u", "root", "-N", "-B", "-e", statement]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"mariadb: {done.stderr.strip()}")
        return done.stdout

    def slow_log(self) -> Path:
        assert self.data is not None
        return self.data / "slow.log"

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if self.data is not None:
            shutil.rmtree(self.data, ignore_errors=True)
