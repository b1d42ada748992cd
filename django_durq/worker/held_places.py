"""The place rows under limits (``db/places.py``) of a pool's handlers: written for a handler that runs
past its timeout, and freed as handlers return.

A running attempt's row is its place; a place row holds a handler that outlives its attempt (its
timeout, or its attempt taken over or buried while it ran). It is freed when the handler's thread
is done with the attempt: in the transaction that records a finished job's completion (and claims
next), or right after any other outcome. One that cannot be freed then (the database is away) is
kept here and freed with the pool's next write: a handler that has returned never holds its key's
place for longer than the database takes to come back.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from django.db import connections

from ..db import Lease, dialect_for, places, wakeup

if TYPE_CHECKING:
    from ..db.store import Store

logger = logging.getLogger("django_durq")


class HeldPlaces:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._unfreed: list[Lease] = []

    def __len__(self) -> int:
        return len(self._unfreed)

    def free(self, leases: list[Lease]) -> bool:
        """Free these places now; False when they are kept for the next write instead."""
        try:
            self.store.retrying("free places", lambda d: places.free(d, leases), give_up_after_s=5.0)
        except Exception:  # noqa: BLE001 - kept for the next write, which retries as long as it takes
            logger.warning("durq: could not free %d place(s) under limits now; the next write will", len(leases))
            self.keep(leases)
            return False
        return True

    def hold_abandoned(self, lease: Lease, worker_id: str, now_ms: int) -> bool:
        """Write the place of an attempt whose handler runs past its timeout; False if it could not be."""
        try:
            self.store.retrying("hold place", lambda d: places.hold_abandoned(d, worker_id, now_ms, lease), give_up_after_s=5.0)
        except Exception:  # noqa: BLE001 - the timeout waits for the database, as every write does
            logger.warning("durq: could not keep the place under limits of job %s past its timeout yet", lease[0])
            return False
        return True

    def keep(self, leases: list[Lease]) -> None:
        with self._lock:
            self._unfreed.extend(leases)

    def take(self) -> list[Lease]:
        """The places kept for the next write; that write frees them or hands them back with ``keep``."""
        with self._lock:
            taken, self._unfreed = self._unfreed, []
        return taken


def free_ended_places(alias: str) -> int:
    """Free the places of worker processes that have ended (their rows are gone); wake the queues they held back.

    Called by the maintenance duty that removes ended workers' rows, once it has removed them.
    """
    queues = places.free_ended(dialect_for(connections[alias]))
    if queues:
        wakeup.wake_on_commit(alias, queues)
    return len(queues)
