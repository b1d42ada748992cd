"""A private ``redis-server`` on a free loopback port, for the Celery rows.

The harness never uses a Redis it did not start: the server keeps nothing on disk and is
stopped with the run. Without Debian's ``redis-server`` the Celery rows are skipped.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.port = 0
        self.popen: subprocess.Popen[bytes] | None = None

    @staticmethod
    def missing() -> str | None:
        if shutil.which("redis-server") is None:
            return "redis-server is not installed (Debian: apt-get install redis-server); Celery rows skipped"
        return None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.port = free_port()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / "redis.log").open("wb") as sink:
            self.popen = subprocess.Popen(
                ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"],
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.ping():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def command(self, *words: str) -> bytes:
        """Send one inline command and return the raw first reply line."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as conn:
            conn.sendall((" ".join(words) + "\r\n").encode())
            return conn.recv(4096)

    def ping(self) -> bool:
        try:
            return self.command("PING").startswith(b"+PONG")
        except OSError:
            return False

    def flush(self) -> None:
        self.command("FLUSHALL")

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
