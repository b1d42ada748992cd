"""The queue's writes and reads as the worker needs them, made robust to a flaky database.

Every call goes through :meth:`Store.retrying`: contention ("database is locked", deadlocks)
is retried after a short jittered wait, and a dropped connection is closed so Django opens a
fresh one on the next try. These errors are logged at WARNING and never reach a handler.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from django.db import DatabaseError, InterfaceError, InternalError, OperationalError, connections

from ..clock import Clock
from ..conf import hooks
from ..handlers.limits import QueueLimits
from . import ClaimedJob, Dialect, Lease, Renewal, counters, dialect_for

if TYPE_CHECKING:
    from .flow import Outlook

logger = logging.getLogger("django_durq")

T = TypeVar("T")


class Store:
    def __init__(self, alias: str) -> None:
        self.alias = alias

    @property
    def dialect(self) -> Dialect:
        # Django connections are per thread, so the dialect is built for the calling thread.
        return dialect_for(connections[self.alias])

    def retrying(
        self,
        what: str,
        operation: Callable[[Dialect], T],
        give_up_after_s: float = 120.0,
        give_up: threading.Event | None = None,
    ) -> T:
        """Run ``operation`` until it succeeds, waiting out contention and reconnecting after drops.

        It gives up (raising the last error) after ``give_up_after_s``, or as soon as ``give_up``
        is set: a worker asked to stop while the database is away stops at once.
        """
        started = time.monotonic()
        delay = 0.005
        tries = 0
        while True:
            connection = connections[self.alias]
            dialect = dialect_for(connection)
            try:
                hooks.fail(what)
                return operation(dialect)
            except DatabaseError as error:
                if not _connection_lost(error):
                    raise
                if connection.in_atomic_block:
                    raise  # the caller's transaction is gone; only the caller can retry it
                tries += 1
                contention = dialect.is_lock_error(error)
                if not contention:
                    _drop_connection(connection)
                if time.monotonic() - started > give_up_after_s or (give_up is not None and give_up.is_set()):
                    raise
                level = logging.DEBUG if contention and tries < 20 else logging.WARNING
                logger.log(level, "durq: %s failed (%s); retry %d in %.0f ms", what, _one_line(error), tries, delay * 1000)
                time.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, 1.0 if contention else 5.0)

    def claim(
        self,
        queue: str,
        limit: int,
        now_ms: int,
        worker_id: str,
        limits: QueueLimits | None = None,
        clock: Clock | None = None,
        outlook: Outlook | None = None,
    ) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs; ``limits`` (a pool whose queue has any) claims limited jobs too."""
        hooks.jitter("claim")
        hooks.reach("in_claim", 0)  # a claim of a pool holding no completions, before its statement
        limited = limits is not None
        return self.retrying(
            "claim",
            lambda d: counters.claimed(
                d,
                now_ms,
                lambda: d.claim_next(queue, limit, now_ms, worker_id, limits, clock, outlook),
                lambda count: d.claim_counted(queue, limit, now_ms, worker_id, count),
                limited=limited,
            ),
        )

    def due_times(self, queue: str) -> tuple[int | None, int | None, int | None]:
        return self.retrying("probe", lambda d: d.due_times(queue))

    def renew(self, leases: Sequence[Lease], clock: Clock, bound_s: float | None = None) -> Renewal:
        """Renew leases from ``now`` as read right before each try: a retry never writes a stale time.

        With ``bound_s``, each try waits at most that long for a lock and the renewal gives up
        (raising) once that much time has passed: a renewal that hangs is a failed renewal.
        """
        bound_ms = None if bound_s is None else max(1, round(bound_s * 1000))
        return self.retrying("heartbeat", lambda d: d.renew(leases, clock.now_ms(), bound_ms), bound_s or 120.0)


def _connection_lost(error: DatabaseError) -> bool:
    """The connection failed under the statement: the driver says so, or psycopg read two results for one.

    Behind PgBouncer in transaction mode, a server connection that dies inside a transaction
    leaves its FATAL message waiting for the client, which reads it with its next command's reply:
    psycopg then raises an InternalError with no SQLSTATE ("received 2 results from command
    'COMMIT'"), whatever the transaction's fate. A database error raised by SQL has a SQLSTATE,
    but PostgreSQL also ends a session silent inside a transaction for longer than
    ``idle_in_transaction_session_timeout`` with an InternalError (25P03): a claimer frozen in its
    turn (db/gates.py) finds its connection gone.
    """
    if isinstance(error, OperationalError | InterfaceError):
        return True
    return isinstance(error, InternalError) and getattr(error.__cause__, "sqlstate", "") in (None, "25P03")


def _drop_connection(connection: object) -> None:
    try:
        connection.close()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - the connection is already broken; forget it
        connection.connection = None  # type: ignore[attr-defined]


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
