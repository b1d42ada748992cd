"""Which workers are alive, learned from locks that end with their process, not from writes.

On SQLite every process that uses the database runs on the host that holds the file, so the
kernel can say which workers are alive: each worker holds an exclusive ``flock`` on a file of its
own in a directory next to the database (``<database>-durq/``), and the kernel drops the lock
when the process ends, however it ends. The maintenance leader is whichever worker holds
``maintenance.lock``.

On PostgreSQL and MariaDB a session of the worker's own holds its lock, and the leader's once it
leads (``db/session_locks.py``): the server frees them when the session ends. On PostgreSQL that
session goes to ``DURQ["LISTEN_DATABASE"]``, and only where the worker found, when it started,
that the alias's connections keep their server session (``db/pooler.py``): a transaction pooler
would lend the session holding a lock to other workers, which would then all hold it.

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
import select
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from django.db import connections

from .session_locks import SessionLocks, session_locks

try:
    import fcntl
except ImportError:  # Windows: heartbeat rows only
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("django_durq")

LEADER_FILE = "maintenance.lock"
SUFFIX = ".worker"


# A session lock's session: the server ends it after this long without a statement, so a paused or
# cut-off worker's locks are freed then; the session's thread speaks at least every WAIT_S.
SESSION_IDLE_S = 10
WAIT_S = 2.0
WITHDRAW_S = 5.0
# A session not heard from for this long may be ended by the server before the thread can tell:
# the worker's handlers are then told to stop (``held_since``), 2.5 s before the server could.
SILENT_S = SESSION_IDLE_S - 2.5
# A worker that holds no lock writes its row every few seconds instead (worker/row_presence.py)
# and is judged by the session's bounds: silent SILENT_S, it tells its handlers to stop; silent
# ROW_GONE_MS, it is gone and its running jobs are taken over.
ROW_GONE_MS = SESSION_IDLE_S * 1000
# The longest the session's thread waits between two tries to connect again: after a database
# restart every worker holds its lock again within this (and a connect) of the server's return.
RECONNECT_S = 6.0


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


class SessionPresence:
    """This worker's locks on a database server, held by a session of its own and the thread that keeps it.

    The thread waits on the server for the leader's lock (``WAIT_S`` at a time, no work on either
    side while it waits); once it leads, it says ``SELECT 1`` every ``WAIT_S`` so that the server
    does not end the session as silent. If the session is lost (a restart, a network cut, a pause
    longer than ``SESSION_IDLE_S``), the thread connects again and takes the worker's lock again.
    """

    def __init__(self, locks: SessionLocks, worker_id: str, session: Any, leading: bool) -> None:
        self.locks = locks
        self.worker_id = worker_id
        self._session: Any = session
        self._leading = leading
        self._renewed = False
        # Since when the worker's lock has been held without a break (None: lost), and when the
        # last statement that got through was sent (monotonic seconds).
        self._held_since: float | None = time.monotonic()
        self._heard = self._held_since
        # When the session was last opened again after it was lost (a database restart, a cut): None until then.
        self.reopened_at: float | None = None
        self._stopped = threading.Event()
        # Written to at withdraw(): wakes the leader's wait on its session's socket.
        self._stop_read, self._stop_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="durq-presence", daemon=True)

    @classmethod
    def announce(cls, alias: str, session_alias: str, worker_id: str) -> SessionPresence | None:
        locks = session_locks(session_alias)
        if locks is None or connections[session_alias].settings_dict["NAME"] != connections[alias].settings_dict["NAME"]:
            return None
        try:
            session = cls._open(locks, worker_id)
            leading = locks.take(session, None, 0)  # at once: a --burst run's one pass needs to know
        except Exception as error:  # noqa: BLE001 - any refusal: heartbeats instead
            logger.warning(
                "durq: cannot hold a presence lock on %r (%s); this worker writes heartbeat rows instead", session_alias, error
            )
            return None
        presence = cls(locks, worker_id, session, leading)
        presence._thread.start()
        return presence

    @staticmethod
    def _open(locks: SessionLocks, worker_id: str) -> Any:
        session = locks.connect(SESSION_IDLE_S)
        try:
            if not locks.take(session, worker_id, WAIT_S):
                raise RuntimeError("another session holds this worker's lock")
        except BaseException:
            session.close()
            raise
        return session

    def lead(self) -> bool:
        return self._leading

    def renewed(self) -> bool:
        renewed, self._renewed = self._renewed, False
        return renewed

    def held_since(self) -> float | None:
        held = self._held_since
        if held is None or time.monotonic() - self._heard > SILENT_S:
            return None  # lost, or silent so long that the server may have ended the session
        return held

    def withdraw(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        os.write(self._stop_write, b"x")
        # A wait for the leader's lock is interrupted; a connect to a server that does not answer
        # is not waited for long (the session, if it ever opens, is closed by the thread).
        deadline = time.monotonic() + WITHDRAW_S
        while self._thread.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # nothing to interrupt, or the session is gone
                if self._session is not None:
                    self.locks.interrupt(self._session)
            self._thread.join(timeout=0.2)
        os.close(self._stop_write)
        os.close(self._stop_read)

    def _run(self) -> None:
        delay = 0.1
        try:
            while not self._stopped.is_set():
                try:
                    if self._session is None:
                        self._session = self._open(self.locks, self.worker_id)
                        self._heard = self._held_since = self.reopened_at = time.monotonic()
                        self._renewed = True
                        logger.info("durq: this worker's presence lock is held again")
                    sent = time.monotonic()
                    if not self._leading:
                        self._leading = self.locks.take(self._session, None, WAIT_S)
                    elif not self._quiet(WAIT_S):
                        sent = time.monotonic()
                        self._session.cursor().execute("SELECT 1")
                    self._heard = sent  # the server cannot end the session for silence before sent + SESSION_IDLE_S
                    delay = 0.1
                except Exception as error:  # noqa: BLE001 - connect again; heartbeats are not needed meanwhile
                    self._held_since = None  # handlers are told to stop: a takeover may come
                    self._leading = False
                    self._close()
                    logger.warning("durq: the presence session was lost (%s); connecting again", type(error).__name__)
                    self._stopped.wait(delay)
                    delay = min(delay * 2, RECONNECT_S - 1)
        finally:
            self._leading = False
            self._close()

    def _quiet(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` between the leader's statements; True once the worker stops.

        It returns early when the server speaks on the idle session: that is the server ending it
        (a restart, ``pg_terminate_backend``, ``KILL``), and the statement that follows learns it at
        once, so that the worker's handlers are told to stop before another worker takes over.
        """
        try:
            select.select([self._session.fileno(), self._stop_read], [], [], wait_s)
        except (OSError, ValueError):  # no socket to watch: wait out the time
            return self._stopped.wait(wait_s)
        return self._stopped.is_set()

    def _close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(Exception):
                session.close()


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
