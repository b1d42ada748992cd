"""A worker's presence on PostgreSQL and MariaDB: its locks, held by a session of its own and a thread that keeps it.

The session holds the worker's lock (``db/session_locks.py``) from before the worker's row exists
until the worker stops, and the leader's lock once the worker leads; the server frees both when the
session ends. ``db/presence.py`` chooses between this and the lock files of SQLite.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from typing import Any

from django.db import connections

from .session_locks import SessionLocks, session_locks

logger = logging.getLogger("django_durq")

# A session lock's session: the server ends it after this long without a statement, so a paused or
# cut-off worker's locks are freed then; the session's thread speaks at least every WAIT_S.
SESSION_IDLE_S = 10
WAIT_S = 2.0
# How often a worker that does not lead asks for the leader's lock where it cannot wait for it on
# the server: a killed leader's duties move within this.
LEAD_LOOK_S = 1.0
WITHDRAW_S = 5.0
# A session not heard from for this long may be ended by the server before the thread can tell:
# the worker's handlers are then told to stop (``held_since``), 2.5 s before the server could.
SILENT_S = SESSION_IDLE_S - 2.5
# The longest the session's thread waits between two tries to connect again: after a database
# restart every worker holds its lock again within this (and a connect) of the server's return.
RECONNECT_S = 6.0


class SessionPresence:
    """This worker's locks on a database server, held by a session of its own and the thread that keeps it.

    The thread waits for the leader's lock: on the server (``WAIT_S`` at a time, no work on either
    side while it waits) where a waiting statement holds no snapshot, or asking again every
    ``LEAD_LOOK_S`` where it would (see ``_try_to_lead``). Once it leads, it says ``SELECT 1``
    every ``WAIT_S`` so that the server does not end the session as silent. If the session is lost
    (a restart, a network cut, a pause longer than ``SESSION_IDLE_S``), the thread connects again
    and takes the worker's lock again.
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
        # Written to at withdraw(): wakes a wait on the session's socket (the leader's, or a look for its lock).
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
                        self._leading = self._try_to_lead()
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

    def _try_to_lead(self) -> bool:
        """Take the leader's lock if it is free; wait up to ``WAIT_S`` on the server, or ``LEAD_LOOK_S`` here.

        Where a statement that waits holds a snapshot (PostgreSQL), the lock is asked for without
        waiting and asked again ``LEAD_LOOK_S`` later: a worker waiting there all along would keep
        the server from removing the old row versions of every job claimed meanwhile.
        """
        if not self.locks.wait_holds_snapshot:
            return self.locks.take(self._session, None, WAIT_S)
        if self.locks.take(self._session, None, 0):
            return True
        self._quiet(LEAD_LOOK_S)
        return False

    def _quiet(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` between statements on the session (the leader's, or looks for its lock); True at a stop.

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
