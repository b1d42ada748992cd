"""Which workers are alive on a SQLite database, learned from the operating system, not from writes.

Every process that uses a SQLite database runs on the host that holds the file, so the kernel
can say which workers are alive: each worker holds an exclusive ``flock`` on a file of its own in
a directory next to the database (``<database>-durq/``), and the kernel drops the lock when the
process ends, however it ends. An idle worker therefore writes no heartbeat row, and the
maintenance leader is whichever worker holds ``maintenance.lock``: an idle worker on SQLite
takes the database's write lock not at all.

Elsewhere (PostgreSQL, MariaDB: workers on many hosts), and wherever these locks cannot be used
(no ``fcntl``, an in-memory database, a directory that cannot be written), there is no presence
directory, and heartbeat rows stay the evidence that a worker is alive.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from django.db import connections

try:
    import fcntl
except ImportError:  # Windows: heartbeat rows only
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("django_durq")

LEADER_FILE = "maintenance.lock"
SUFFIX = ".worker"


class Liveness(enum.Enum):
    HELD = "held"  # the worker's process is alive
    RELEASED = "released"  # its process has ended
    UNKNOWN = "unknown"  # no lock file for it: judge by its heartbeat row


def directory(alias: str) -> Path | None:
    """Where the workers of database ``alias`` hold their locks; None where locks are not used."""
    connection = connections[alias]
    if fcntl is None or connection.vendor != "sqlite" or connection.is_in_memory_db():  # type: ignore[attr-defined]
        return None
    return Path(f"{connection.settings_dict['NAME']}-durq")


def _file(root: Path, worker_id: str) -> Path:
    return root / (worker_id.replace(os.sep, "_") + SUFFIX)


def _lock_in_place(path: Path, operation: int) -> int:
    """Open ``path`` and ``flock`` it; the descriptor, once the lock is on the file still at ``path``.

    A lock file is unlinked only by whoever holds it, so a lock taken on a file that has just been
    unlinked is retried on the new one: a held lock always names the file others look at.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, operation)
            if os.path.exists(path) and os.stat(path).st_ino == os.fstat(fd).st_ino:
                _readable_by_all(fd)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _readable_by_all(fd: int) -> None:
    """Let a web process running as another user test the lock (reading is all it needs)."""
    with contextlib.suppress(OSError):  # not ours to change: its creator decided
        os.fchmod(fd, os.fstat(fd).st_mode | 0o444)


class Presence:
    """This worker process's locks: its own file while it lives, the leader's file once it leads."""

    def __init__(self, root: Path, worker_id: str, fd: int) -> None:
        self.root = root
        self.worker_id = worker_id
        self._fd: int | None = fd
        self._leader_fd: int | None = None

    @classmethod
    def announce(cls, alias: str, worker_id: str) -> Presence | None:
        """Hold this worker's lock; None (with a warning) where it cannot, and heartbeats are used."""
        root = directory(alias)
        if root is None:
            return None
        try:
            if not root.is_dir():
                root.mkdir(exist_ok=True)
                # Readable and searchable by all, as the web app may run as another user.
                with contextlib.suppress(OSError):
                    root.chmod(root.stat().st_mode | 0o555)
            fd = _lock_in_place(_file(root, worker_id), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            logger.warning("durq: cannot hold a presence lock in %s (%s); this worker writes heartbeat rows instead", root, error)
            return None
        return cls(root, worker_id, fd)

    def lead(self) -> bool:
        """True while this worker holds the maintenance leader's lock; takes it when it is free."""
        if self._leader_fd is None:
            try:
                self._leader_fd = _lock_in_place(self.root / LEADER_FILE, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        return True

    def withdraw(self) -> None:
        """At a clean stop: remove this worker's file and drop both locks."""
        if self._fd is not None:
            _file(self.root, self.worker_id).unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None
        if self._leader_fd is not None:
            os.close(self._leader_fd)
            self._leader_fd = None


def liveness(alias: str, worker_id: str) -> Liveness:
    """Whether the worker's process holds its lock, has ended, or keeps no lock file at all."""
    return states(alias, [worker_id])[worker_id]


def states(alias: str, worker_ids: Iterable[str]) -> dict[str, Liveness]:
    """``liveness()`` of each worker, the directory looked up once."""
    root = directory(alias)
    return {worker_id: Liveness.UNKNOWN if root is None else _state(root, worker_id) for worker_id in worker_ids}


def _state(root: Path, worker_id: str) -> Liveness:
    try:
        fd = os.open(_file(root, worker_id), os.O_RDONLY)
    except OSError:
        return Liveness.UNKNOWN
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return Liveness.HELD
    finally:
        os.close(fd)
    return Liveness.RELEASED


def sweep(alias: str) -> list[str]:
    """Remove the lock files of workers whose processes have ended; their worker ids."""
    root = directory(alias)
    if root is None or not root.is_dir():
        return []
    ended = []
    for path in root.glob(f"*{SUFFIX}"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)  # under the lock: no worker can be holding this file
            ended.append(path.name.removesuffix(SUFFIX))
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
    return ended
