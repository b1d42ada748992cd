"""Wake-ups between processes on one host: after its commit, an enqueue rings an idle worker's socket.

Every worker process that can (SQLite; MariaDB for workers on the enqueuing host) binds a Unix
datagram socket, its bell, in a directory the enqueuing processes can find from the database
settings alone: SQLite's presence directory next to the file (``<database>-durq/``), or for
MariaDB one under the system's temporary directory named after the server and database.
PostgreSQL has no bells: its ``NOTIFY`` reaches workers on every host.

A ring names one queue. A ring for one job goes to one worker, picked at random: a worker with a
free slot for the queue takes it and claims; one without (busy, not serving that queue, stopping)
passes the ring on to a worker it has not been to yet. So one enqueue wakes one claimer, not every
idle worker on the file at once, and a busy worker never sits on a job another could start (a
busy worker claims by itself when a slot frees). A commit of several jobs rings as many workers.

A bell that cannot be reached (its worker has ended, its buffer is full, a permission is
missing) is skipped for the next one; with no bell at all the watcher's poll finds the job.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import random
import socket
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from django.db import connections

from . import presence

SUFFIX = ".bell"
# The longest path a Unix socket can be bound to (sun_path holds 108 bytes with the NUL).
MAX_PATH = 107
# A directory listing younger than this, relative to the directory's last change, is read
# again next time: a bell bound within the same tick of the file system's clock would not
# change the directory's mtime a second time.
FRESH_NS = 100_000_000
# A ring is small; the tried list stays short (one name per worker process on the host).
MAX_DATAGRAM = 65_536
_SEPARATOR = "\0"


def directory(alias: str) -> Path | None:
    """Where the bells of database ``alias``'s workers on this host are; None where there are none."""
    if not hasattr(socket, "AF_UNIX"):
        return None
    connection = connections[alias]
    if connection.vendor == "sqlite":
        return presence.directory(alias)
    if connection.vendor == "mysql":
        settings = connection.settings_dict
        # Every process of one host that reaches the same server and database finds the same name.
        where = f"{settings['HOST'] or 'localhost'}:{settings['PORT'] or ''}/{settings['NAME']}"
        return Path(tempfile.gettempdir()) / f"durq-{hashlib.sha256(where.encode()).hexdigest()[:16]}"
    return None


class Bell:
    """A worker process's own socket: what rings reach it by."""

    def __init__(self, root: Path, name: str, sock: socket.socket) -> None:
        self.root = root
        self.name = name
        self.socket = sock

    @classmethod
    def open(cls, alias: str, worker_id: str) -> Bell | None:
        """Bind this worker's bell; None where it cannot be (the watcher then polls more often)."""
        root = directory(alias)
        if root is None:
            return None
        name = worker_id.replace(os.sep, "_") + SUFFIX
        path = root / name
        if len(os.fsencode(path)) > MAX_PATH:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            if not root.is_dir():
                root.mkdir(exist_ok=True)
                if connections[alias].vendor == "mysql":
                    # Shared by the workers and web apps of every user on the host, like /tmp.
                    root.chmod(0o1777)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a previous process's, with the same id: never a live one
            sock.bind(os.fspath(path))
            _let_writers_ring(alias, path)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return None
        return cls(root, name, sock)

    def fileno(self) -> int:
        return self.socket.fileno()

    def take(self) -> list[tuple[str, list[str]]]:
        """The rings waiting: (queue, bells already tried) each, all of them read at once."""
        rings: list[tuple[str, list[str]]] = []
        while True:
            try:
                data = self.socket.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return rings
            if data:  # an empty datagram only interrupts the wait (see ``interrupt``)
                queue, *tried = data.decode().split(_SEPARATOR)
                rings.append((queue, tried))

    def pass_on(self, queue: str, tried: Sequence[str]) -> bool:
        """Ring another worker for a job this one cannot start now; False when none is left to try."""
        return _ring_one(self.root, queue, [*tried, self.name])

    def interrupt(self) -> None:
        """End a wait on this bell now (at stop)."""
        with contextlib.suppress(OSError):
            _sender().sendto(b"", os.fspath(self.root / self.name))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            (self.root / self.name).unlink()
        self.socket.close()


def _let_writers_ring(alias: str, path: Path) -> None:
    """Whoever may write the SQLite file (and so enqueue) may ring: the socket gets its write bits."""
    connection = connections[alias]
    if connection.vendor != "sqlite":
        return
    with contextlib.suppress(OSError):
        writable = os.stat(connection.settings_dict["NAME"]).st_mode & 0o666
        os.chmod(path, 0o600 | writable)


def ring(alias: str, queues: Iterable[str], jobs: int | None = None) -> None:
    """Wake workers on this host for jobs of ``queues`` just committed: ``jobs`` per queue, or every worker."""
    root = directory(alias)
    if root is None:
        return
    for queue in queues:
        if jobs == 1:
            _ring_one(root, queue, [])
        else:
            names = _bells(root)
            for name in names if jobs is None else random.sample(names, min(jobs, len(names))):
                _send(root, name, queue, [])


def _ring_one(root: Path, queue: str, tried: Sequence[str]) -> bool:
    """Ring one worker not tried yet, the next if it cannot be reached; False when none could be."""
    left = [name for name in _bells(root) if name not in tried]
    random.shuffle(left)
    return any(_send(root, name, queue, tried) for name in left)


def _send(root: Path, name: str, queue: str, tried: Sequence[str]) -> bool:
    data = _SEPARATOR.join([queue, *tried]).encode()
    try:
        _sender().sendto(data, os.fspath(root / name))
    except ConnectionRefusedError:
        # Nobody is bound there: its worker has ended. Gone for everyone, once anyone may remove it.
        with contextlib.suppress(OSError):
            (root / name).unlink()
        _forget(root)
        return False
    except OSError as error:
        if error.errno == errno.ENOENT:
            _forget(root)
        return False  # full (the worker has rings to read already), or not ours to ring
    return True


# --- this process's view of a directory, and the socket it sends from --------------------------

_lock = threading.Lock()
_listings: dict[Path, tuple[int, int, list[str]]] = {}  # root -> (its mtime_ns, when listed, bells)
_senders: dict[int, socket.socket] = {}  # pid -> an unbound datagram socket (a fork gets its own)


def _bells(root: Path) -> list[str]:
    """The bells in ``root``, listed again only when the directory has changed since."""
    try:
        mtime = os.stat(root).st_mtime_ns
    except OSError:
        return []
    with _lock:
        cached = _listings.get(root)
    if cached is not None and cached[0] == mtime and cached[1] - mtime > FRESH_NS:
        return cached[2]
    listed_at = time.time_ns()
    try:
        names = sorted(entry.name for entry in os.scandir(root) if entry.name.endswith(SUFFIX))
    except OSError:
        return []
    with _lock:
        _listings[root] = (mtime, listed_at, names)
    return names


def _forget(root: Path) -> None:
    with _lock:
        _listings.pop(root, None)


def _sender() -> socket.socket:
    pid = os.getpid()
    with _lock:
        sock = _senders.get(pid)
        if sock is None:
            _senders.clear()  # a parent's, inherited by fork: not to be shared
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
            _senders[pid] = sock
        return sock
