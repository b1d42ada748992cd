"""Locks held by a database session, freed by the server when the session ends, however it ends.

PostgreSQL's advisory locks and MariaDB's named locks (``GET_LOCK``) belong to the session that
took them: a worker's process that is killed, crashes or loses its host closes its connection,
and the server frees its locks at once. ``db/session_presence.py`` holds them to tell live
workers from ended ones, and to pick the one that runs the maintenance duties, without writing a
row.

A session that falls silent (a paused or partitioned process) is ended by the server once it has
been idle for ``idle_s``: PostgreSQL's ``idle_session_timeout``, MariaDB's ``wait_timeout``. So a
paused worker's locks are freed too, a little later.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .base import own_connection

# PostgreSQL's two-key advisory locks: the first key says the lock is django-durq's ("durq").
_NAMESPACE = 0x64757271
_LEADER_NAMESPACE = _NAMESPACE + 1
_LOCK_NOT_AVAILABLE = "55P03"
_QUERY_CANCELED = "57014"


class SessionLocks:
    """One vendor's way to take, test and name session locks for the database of ``alias``."""

    # Whether a statement that waits for a lock holds a snapshot while it waits. PostgreSQL's does:
    # the server then keeps every row version that snapshot might see, so the old version of each
    # job claimed meanwhile stays in the claim index, and every claim walks past them.
    wait_holds_snapshot = False

    def __init__(self, wrapper: BaseDatabaseWrapper) -> None:
        self.wrapper = wrapper

    def connect(self, idle_s: int) -> Any:
        """A driver connection of its own, in autocommit, that the server ends after ``idle_s`` of silence."""
        raise NotImplementedError

    def take(self, session: Any, worker_id: str | None, wait_s: float) -> bool:
        """Take the worker's lock (None: the leader's), waiting up to ``wait_s``; True once held."""
        raise NotImplementedError

    def held(self, worker_ids: Iterable[str]) -> set[str]:
        """Which of these workers' locks some session holds now (read on the alias's own connection)."""
        raise NotImplementedError

    def interrupt(self, session: Any) -> None:
        """End a ``take`` that waits on ``session`` now (called from another thread, at stop)."""
        raise NotImplementedError


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class PostgreSQLLocks(SessionLocks):
    wait_holds_snapshot = True

    def connect(self, idle_s: int) -> Any:
        session = own_connection(self.wrapper)
        session.autocommit = True
        cursor = session.cursor()
        # Set per session: any user may. A silent peer is also dropped by TCP keepalives.
        cursor.execute(f"SET idle_session_timeout = '{int(idle_s)}s'")
        cursor.execute(f"SET tcp_keepalives_idle = {int(idle_s)}")
        return session

    @staticmethod
    def key(worker_id: str | None) -> tuple[int, int]:
        if worker_id is None:
            return _LEADER_NAMESPACE, 0
        return _NAMESPACE, int.from_bytes(_digest(worker_id)[:4], "big") & 0x7FFFFFFF

    def take(self, session: Any, worker_id: str | None, wait_s: float) -> bool:
        first, second = self.key(worker_id)
        cursor = session.cursor()
        if wait_s <= 0:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [first, second])
            return bool(cursor.fetchone()[0])
        cursor.execute(f"SET lock_timeout = '{int(wait_s * 1000)}ms'")
        try:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [first, second])
        except Exception as error:
            code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
            if code in (_LOCK_NOT_AVAILABLE, _QUERY_CANCELED):
                return False  # waited long enough, or interrupted at stop: the session is fine
            raise
        return True

    def held(self, worker_ids: Iterable[str]) -> set[str]:
        by_key = {self.key(worker_id)[1]: worker_id for worker_id in worker_ids}
        if not by_key:
            return set()
        with self.wrapper.cursor() as cursor:
            cursor.execute(
                "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s AND objsubid = 2"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                [_NAMESPACE],
            )
            return {by_key[row[0]] for row in cursor.fetchall() if row[0] in by_key}

    def interrupt(self, session: Any) -> None:
        session.cancel()


class MySQLLocks(SessionLocks):
    def connect(self, idle_s: int) -> Any:
        session = own_connection(self.wrapper)
        session.autocommit(True)
        session.cursor().execute(f"SET SESSION wait_timeout = {int(idle_s)}")
        return session

    def name(self, worker_id: str | None) -> str:
        # Named locks are server-wide: the database's name is part of the lock's.
        database = self.wrapper.settings_dict["NAME"]
        if worker_id is None:
            return "durq-lead:" + _digest(database).hex()[:40]
        return "durq:" + _digest(f"{database}\0{worker_id}").hex()[:40]

    def take(self, session: Any, worker_id: str | None, wait_s: float) -> bool:
        cursor = session.cursor()
        cursor.execute("SELECT GET_LOCK(%s, %s)", [self.name(worker_id), max(wait_s, 0)])
        return cursor.fetchone()[0] == 1  # 0: waited long enough; NULL: interrupted at stop

    def held(self, worker_ids: Iterable[str]) -> set[str]:
        ids = list(worker_ids)
        if not ids:
            return set()
        with self.wrapper.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(["IS_USED_LOCK(%s)"] * len(ids)), [self.name(worker_id) for worker_id in ids])
            row = cursor.fetchone()
        return {worker_id for worker_id, holder in zip(ids, row, strict=True) if holder is not None}

    def interrupt(self, session: Any) -> None:
        # A waiting GET_LOCK ends when its query is killed, from a connection of its own.
        killer = own_connection(self.wrapper)
        try:
            killer.cursor().execute(f"KILL QUERY {int(session.thread_id())}")
        finally:
            killer.close()


def session_locks(alias: str) -> SessionLocks | None:
    """The session locks of the database ``alias``; None where there are none (SQLite)."""
    wrapper = connections[alias]
    if wrapper.vendor == "postgresql":
        return PostgreSQLLocks(wrapper)
    if wrapper.vendor == "mysql":
        return MySQLLocks(wrapper)
    return None
