"""The call of a handler: its arguments in, its exception or ``Retry`` out, and the transaction it may leave open."""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections

from ..clock import Clock, datetime_to_ms, seconds_to_ms
from ..db.store import Store
from ..exceptions import Abort, Retry
from ..handlers.context import JobContext
from ..handlers.registry import JobDefinition
from .outcomes import Failure, _safe_str, _traceback, _type_path

logger = logging.getLogger("django_durq")


class HandlerCall:
    """The handler's side of an attempt (a part of :class:`~.executor.Executor`)."""

    # Set by Executor.__init__.
    store: Store
    clock: Clock
    _local: threading.local

    def _call(
        self, definition: JobDefinition, ctx: JobContext, args: list[Any], kwargs: dict[str, Any]
    ) -> tuple[Failure | None, Any]:
        try:
            if definition.is_async:
                # async_to_sync runs thread-sensitive sync_to_async calls (the ORM) back in this
                # thread, so the handler's queries use this worker thread's own connection.
                return None, async_to_sync(definition.func)(ctx, *args, **kwargs)
            return None, definition.func(ctx, *args, **kwargs)
        except Retry as retry:
            try:
                retry_at = self._retry_at(retry)
            except Exception as error:  # noqa: BLE001 - a bad Retry is the handler's failure
                message = f"Retry(after={retry.after!r}) is invalid: {_safe_str(error)}"
                return Failure("exception", message, _type_path(error), _traceback(error), error=error), None
            return Failure("retry", retry.reason or "retry requested", retry_at_ms=retry_at, error=retry), None
        except Abort as abort:
            return Failure("exception", _safe_str(abort), _type_path(abort), _traceback(abort), final=True, error=abort), None
        except BaseException as error:  # noqa: BLE001 - a handler must never take the worker down
            return Failure("exception", _safe_str(error), _type_path(error), _traceback(error), error=error), None

    def _retry_at(self, retry: Retry) -> int:
        if isinstance(retry.after, datetime):
            return datetime_to_ms(retry.after)
        return self.clock.now_ms() + seconds_to_ms(retry.after)

    def _connection(self) -> Any:
        """This thread's connection to the queue's database, looked up once per thread."""
        try:
            return self._local.connection
        except AttributeError:
            self._local.connection = connections[self.store.alias]
            return self._local.connection


def transaction_state(connection: Any) -> tuple[int, bool]:
    """(atomic blocks open, autocommit) of a connection, without connecting."""
    return len(connection.atomic_blocks), connection.connection is None or connection.autocommit


def reclaim_connection(connection: Any, before: tuple[int, bool] = (0, True)) -> None:
    """Take back this thread's connection from a transaction the handler left open.

    A handler that called ``set_autocommit(False)`` (or entered ``atomic()`` without leaving it)
    would otherwise hold the outcome's writes in its own transaction, to be rolled back with
    it. The open transaction is discarded, as it would be if the handler had crashed. ``before``
    is the state the handler found: code that runs jobs inside its own transaction (a test's
    ``drain()``) keeps it.
    """
    depth, autocommit = transaction_state(connection)
    if depth == before[0] and autocommit:
        return  # as the handler found it: nearly always
    alias = connection.alias
    if depth > before[0]:
        logger.warning("durq: a handler left a transaction open on %r; rolling it back", alias)
        if before[0] == 0:
            _reset_atomic_state(connection)
    elif before[1] and not autocommit and not connection.in_atomic_block:
        logger.warning("durq: a handler turned autocommit off on %r; rolling back and turning it on", alias)
        try:
            connection.rollback()
            connection.set_autocommit(True)
        except Exception:  # noqa: BLE001 - a broken connection: Django opens a new one on next use
            _reset_atomic_state(connection)


def _reset_atomic_state(connection: Any) -> None:
    try:
        connection.close()
    except Exception:  # noqa: BLE001 - closing a broken connection
        pass
    connection.connection = None
    connection.in_atomic_block = False
    connection.atomic_blocks = []
    connection.savepoint_ids = []
    connection.needs_rollback = False
    connection.closed_in_transaction = False
    connection.commit_on_exit = True
