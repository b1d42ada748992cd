"""Which workers are alive, learned from locks that end with their process, not from writes.

On SQLite every process that uses the database runs on the host that holds the file, so the
kernel can say which workers are alive: each worker holds an exclusive ``flock`` on a file of its
own in a directory next to the database (``<database>-durq/``), and the kernel drops the lock
when the process ends, however it ends. The maintenance leader is whichever worker holds
``maintenance.lock``.

On PostgreSQL and MariaDB a session of the worker's own holds its lock, and the leader's once it
leads (``db/session_presence.py``, ``db/session_locks.py``): the server frees them when the
session ends. On PostgreSQL that session goes to ``DURQ["LISTEN_DATABASE"]``, and only where the
worker found, when it started, that the alias's connections keep their server session
(``db/pooler.py``): a transaction pooler would lend the session holding a lock to other workers,
which would then all hold it.

Either way an idle worker writes no heartbeat row and renews no lease. Where no lock can be held
(no ``fcntl``, an in-memory database, a directory that cannot be written, no direct PostgreSQL
connection, a server that refuses the session), heartbeat rows stay the evidence that a worker is
alive, and a lease row picks the leader. A worker's row says which it uses (``holds_lock``).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from django.db import connections

from .session_locks import session_locks
from .session_presence import SESSION_IDLE_S, SessionPresence

try:
    import fcntl
except ImportError:  # Windows: heartbeat rows only
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("django_durq")

LEADER_FILE = "maintenance.lock"
SUFFIX = ".worker"


# A worker that holds no lock writes its row every few seconds instead (worker/row_presence.py)
# and is judged by the session's bounds: silent SILENT_S, it tells its handlers to stop; silent
# ROW_GONE_MS, it is gone and its running jobs are taken over.
ROW_GONE_MS = SESSION_IDLE_S * 1000


class Liveness(enum.Enum):
    HELD = "held"  # the worker's process is alive
    RELEASED = "released"  # its process has ended
    UNKNOWN = "unknown"  # it holds no lock: judge by its heartbeat row


class WorkerPresence(Protocol):
    def lead(self) -> bool:
        """True while this worker holds the maintenance leader's lock."""
        ...

    def renewed(self) -> bool:
        """True once after the worker's lock was lost and taken again: its row may have been removed."""
        ...

    def withdraw(self) -> None:
        """At a clean stop: drop this worker's locks."""
        ...

    def held_since(self) -> float | None:
        """Monotonic time since which this worker's lock has been held without a break; None while it may not be.

        A takeover (``worker/takeover.py``) needs the lock released: an attempt whose lease was
        confirmed after this time cannot have been taken over since.
        """
        ...


def announce(alias: str, worker_id: str, session_alias: str | None) -> WorkerPresence | None:
    """Hold this worker's lock; None (heartbeat rows instead) where it cannot be held.

    ``session_alias``: where a server's session lock is held (None: nowhere, as behind a
    transaction pooler, which the supervisor finds out); the queue's database on SQLite.
    """
    if connections[alias].vendor == "sqlite":
        return Presence.announce(alias, worker_id)
    if connections[alias].vendor == "mysql":
        session_alias = alias  # no transaction pooler keeps MariaDB's sessions from their clients
    if session_alias is None:
        return None
    return SessionPresence.announce(alias, session_alias, worker_id)


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
        self._held_since = time.monotonic()

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

    def renewed(self) -> bool:
        return False  # a file lock is held until the process ends

    def held_since(self) -> float | None:
        return self._held_since  # until the process ends

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


def liveness(alias: str, worker_id: str, holds_lock: bool = True) -> Liveness:
    """Whether the worker's process holds its lock, has ended, or holds no lock at all."""
    return states(alias, {worker_id: holds_lock})[worker_id]


def states(alias: str, workers: Mapping[str, bool]) -> dict[str, Liveness]:
    """``liveness()`` of each worker (id -> whether its row says it holds a lock), looked up at once."""
    root = directory(alias)
    if root is not None:
        return {worker_id: _state(root, worker_id) for worker_id in workers}
    locks = session_locks(alias)
    locked = [worker_id for worker_id, holds_lock in workers.items() if holds_lock]
    held = locks.held(locked) if locks is not None and locked else set()
    return {
        worker_id: (Liveness.HELD if worker_id in held else Liveness.RELEASED) if holds_lock else Liveness.UNKNOWN
        for worker_id, holds_lock in workers.items()
    }


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


def lock_files(alias: str) -> list[str]:
    """The worker ids that have a lock file (SQLite; none elsewhere), live and ended alike."""
    root = directory(alias)
    if root is None or not root.is_dir():
        return []
    return [path.name.removesuffix(SUFFIX) for path in root.glob(f"*{SUFFIX}")]


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
