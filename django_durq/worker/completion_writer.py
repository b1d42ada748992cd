"""A pool's completion writer: finished jobs written on a connection of their own while the dispatcher claims.

Where the database runs writers in parallel (PostgreSQL, MariaDB), a pool whose claims enforce no
limit records its finished jobs on this thread, so the dispatcher's claim does not wait behind
their write: in a drain of short jobs the dispatcher is what the slots wait for, and the write of
a batch of completions took about twice its claim. One batch is written at a time; what finishes
meanwhile waits for the next. A limited pool keeps both in one transaction (``pool.py``): there the
places its handlers held are freed by the transaction that claims next, so the claim can give
them on. Where writers are serialized (SQLite) two connections would only take turns at the lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import connections

from .attempt import Attempt

if TYPE_CHECKING:
    from .pool import Pool

logger = logging.getLogger("django_durq")


class CompletionWriter:
    """Writes one batch of a pool's completions at a time, on its own thread and connection."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._changed = threading.Condition()
        self._batch: list[Attempt] | None = None
        self._writing = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"durq-{pool.queue}-complete", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        """False once closed or stopped on an error: the dispatcher then records completions itself."""
        return not self._closed

    def take(self, completions: Callable[[], list[Attempt]]) -> bool:
        """Take the pool's held completions (``completions()`` hands them over) unless a batch is being written."""
        with self._changed:
            if self._writing or self._closed:
                return False
            batch = completions()
            if not batch:
                return True
            self._batch, self._writing = batch, True
            self._changed.notify_all()
        return True

    def close(self) -> None:
        """Write the batch in hand, then stop: what finishes later the dispatcher records itself."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            while self._writing:
                self._changed.wait()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        pool = self._pool
        try:
            while True:
                with self._changed:
                    while self._batch is None and not self._closed:
                        self._changed.wait()
                    if self._batch is None:
                        return
                    batch, self._batch = self._batch, None
                try:
                    pool._record_completions(batch, [])
                finally:
                    with self._changed:
                        self._writing = False
                        self._changed.notify_all()
                    pool.kick.set()  # what finished meanwhile may be written now
        except BaseException as error:
            logger.exception("durq: the completion writer of queue %r stopped on an unexpected error", pool.queue)
            with self._changed:
                self._closed = True
            pool.runtime.fail("completion writer failure", error)
        finally:
            connections.close_all()  # this thread's: the server sees the session end, not a dropped socket
