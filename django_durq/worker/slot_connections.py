"""A slot thread's database connections between jobs: checked after idling, tidied after each job."""

from __future__ import annotations

import time

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..execution.handler_call import reclaim_connection


class SlotConnections:
    """One slot thread's database connections, kept in hand between jobs.

    Asking Django's thread-local for each connection after every job costs more than a short
    job itself, so a slot looks the wrappers up once (no connection is opened by that) and
    again after it has been idle. Wrappers outlive ``close()``: Django reconnects them on use.
    """

    def __init__(self) -> None:
        self.wrappers: list[BaseDatabaseWrapper] = []

    def after_idle(self) -> None:
        """Close connections the server dropped while this slot was idle, before a handler gets them.

        A server restart, a failover or ``idle_session_timeout`` kills idle connections; without
        this check the next handler on every slot would fail its attempt on its first query.
        """
        self.wrappers = [connections[alias] for alias in connections]
        for connection in self.wrappers:
            if connection.connection is not None and not connection.in_atomic_block and not connection.is_usable():
                connection.close()

    def tidy(self) -> None:
        """Drop connections a handler broke or left inside a transaction; keep healthy ones open.

        Unlike ``close_old_connections()``, a healthy connection survives between jobs even with
        ``CONN_MAX_AGE = 0``: reconnecting for every job would cost more than most jobs.

        This runs after every job, so it reads the wrappers' state (the connection is open:
        ``autocommit`` is what ``get_autocommit()`` would return) and asks Django to close an
        obsolete connection only once its ``CONN_MAX_AGE`` has run out, or where
        ``CONN_HEALTH_CHECKS`` wants the next handler's first query to check it.
        """
        for connection in self.wrappers:
            if connection.connection is None:
                continue
            if connection.in_atomic_block or not connection.autocommit:
                reclaim_connection(connection)  # a handler's, on a database the queue does not use
            elif connection.errors_occurred and not connection.is_usable():
                connection.close()
            elif (
                connection.close_at is not None
                and connection.settings_dict["CONN_MAX_AGE"]
                and (connection.health_check_enabled or time.monotonic() >= connection.close_at)  # type: ignore[attr-defined]
            ):
                connection.close_if_unusable_or_obsolete()
