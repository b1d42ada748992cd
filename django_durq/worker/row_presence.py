"""A worker's presence where it can hold no lock: its row, written every ``BEAT_S``, and a silence that ends it.

Where a worker holds no presence lock (behind a transaction pooler, which lends sessions out;
see db/presence.py), nothing ends with its process that other workers could see. Its row stands
in: a thread of its own writes ``last_seen_ms`` from the queue's clock every ``BEAT_S``, and the
maintenance leader takes over the running jobs of a worker whose row has been silent for
``GONE_S`` (``StaleWorkers``, worker/takeover.py) rather than waiting out their leases. The row
says how often it is written (``beat_ms``); a worker whose row does not say so is left to its
jobs' leases.

The worker tells its handlers to stop (``held_since`` None) once no beat begun within
``SILENT_S`` got through: ``GONE_S - SILENT_S`` before the leader may judge it gone, as a session
lock's worker does before the server could end its session. The time a beat writes is read after
the moment it is measured from, so a beat slow to commit makes the worker stop its handlers
sooner, never the leader judge it gone sooner.

The leader judges only while its own beats have got through without a break for ``GONE_S``: after
a database outage every worker's row is old, and each must first have had the time to write it
again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection

from django.db import DatabaseError, connections

from ..clock import Clock
from ..db import presence, session_presence
from ..models import WorkerProcess

logger = logging.getLogger("django_durq")

BEAT_S = 2.0
BEAT_MS = round(BEAT_S * 1000)
# Silent this long, the worker's handlers are told to stop; silent GONE_S, its jobs are taken
# over: the bounds of a presence session (db/session_presence.py), kept by rows.
SILENT_S = session_presence.SILENT_S
GONE_MS = presence.ROW_GONE_MS
GONE_S = GONE_MS / 1000
# A pause between two beats that got through longer than this breaks the run the leader counts on.
BREAK_S = 2 * BEAT_S


class RowBeat:
    """This worker's row, written every ``BEAT_S`` by a thread of its own while the worker runs."""

    def __init__(self, alias: str, worker_id: str, clock: Clock, write_row: Callable[[int], None]) -> None:
        self.alias = alias
        self.worker_id = worker_id
        self.clock = clock
        self._write_row = write_row  # writes the whole row anew, for when it was removed
        started = time.monotonic()  # the row was written at registration, just before
        # When the last beat that got through began; since when beats have got through with no
        # silence past SILENT_S (what handlers go by), and with no pause past BREAK_S (the leader).
        self._heard = started
        self._held_since = started
        self._unbroken_since = started
        self._failing = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="durq-row-beat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def held_since(self) -> float | None:
        """Since when beats have got through without a silence that let the leader judge this worker gone; None now."""
        if time.monotonic() - self._heard > SILENT_S:
            return None
        return self._held_since

    def unbroken_for(self) -> float:
        """Seconds for which this worker's beats have got through without a pause past ``BREAK_S``."""
        now = time.monotonic()
        if now - self._heard > BREAK_S:
            return 0.0
        return now - self._unbroken_since

    def beat(self) -> bool:
        """Write the row once; True when it got through."""
        sent = time.monotonic()
        now_ms = self.clock.now_ms()  # read after ``sent``: the row never claims a later moment than the worker counts from
        try:
            written = WorkerProcess.objects.using(self.alias).filter(worker_id=self.worker_id).update(last_seen_ms=now_ms)
            if not written:
                # Judged gone and removed (a long stall): written anew, so this live worker is listed.
                logger.warning("durq: this worker's row was removed while it lived; writing it again")
                self._write_row(now_ms)
        except DatabaseError as error:
            if not self._failing:
                logger.warning("durq: this worker's row could not be written (%s); trying again", type(error).__name__)
            self._failing = True
            connections[self.alias].close()  # the next beat connects anew
            return False
        if sent - self._heard > SILENT_S:
            self._held_since = sent  # leases confirmed before now may have been taken over meanwhile
        if sent - self._heard > BREAK_S:
            self._unbroken_since = sent
        if self._failing:
            logger.info("durq: this worker's row is written again")
        self._failing = False
        self._heard = sent
        return True

    def _run(self) -> None:
        try:
            while not self._stopped.wait(BEAT_S):
                self.beat()
        finally:
            connections.close_all()


def silent(alias: str, workers: Collection[str], now_ms: int) -> set[str]:
    """Those of ``workers`` whose rows say they are written every ``beat_ms`` and have not been for ``GONE_MS``.

    A worker without a row is not judged here: its row goes only after ten missed heartbeats,
    when its jobs' leases have run out long since.
    """
    if not workers:
        return set()
    seen = dict(
        WorkerProcess.objects.using(alias)
        .filter(worker_id__in=list(workers), beat_ms__isnull=False)
        .values_list("worker_id", "last_seen_ms")
    )
    return {worker_id for worker_id, last_seen_ms in seen.items() if now_ms - last_seen_ms > GONE_MS}
