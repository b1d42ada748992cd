"""Whether a pool may start a job now: its queue was seen not paused lately enough.

A pause is a row every claim reads (``ops/pausing.py``), but a pool claims ahead of its slots
(``PREFETCH``), and a job claimed just before a pause would otherwise start after it. So a slot
starts a job only within ``PAUSE_SEEN_WITHIN_S`` of the start of a statement that saw the queue
not paused: the claim that took the job, or a read of the queue's state that the slot makes when
that claim is older. The slot asks as the last step before the handler's run (``Executor.run``),
after every wait and every step on its way there (a renewal to confirm a job's lease may take
seconds while the database is locked; any step may stall in a frozen process), so only the
run's signals lie between its answer and the handler. A
statement that saw the queue not paused began before the pause committed, so no job of the
queue starts later than ``PAUSE_SEEN_WITHIN_S`` after a pause commits (or, where the database
takes longer to answer one read, later than that read). A pool that finds its queue paused hands
back the jobs it had claimed ahead, attempts not counted.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ..db.gates import is_paused

if TYPE_CHECKING:
    from .runtime import Runtime

logger = logging.getLogger("django_durq")

# The bound a pause keeps. While a pool's buffer holds jobs claimed longer ago than this, its
# slots read the queue's state once per this interval at most (one read for the whole pool).
PAUSE_SEEN_WITHIN_S = 0.010


class PauseGuard:
    def __init__(self, queue: str, runtime: Runtime) -> None:
        self.queue = queue
        self.runtime = runtime
        self._lock = threading.Lock()  # one slot at a time reads the queue's state
        self._seen_mono = 0.0  # when the latest statement that saw the queue not paused began

    def saw_active(self, began_mono: float) -> None:
        """A statement that began at monotonic ``began_mono`` saw the queue not paused (a claim that took jobs)."""
        self._seen_mono = max(self._seen_mono, began_mono)

    def may_start(self) -> bool:
        """True when a job of the queue may start now; False when the queue is paused (or cannot be read)."""
        if time.monotonic() - self._seen_mono <= PAUSE_SEEN_WITHIN_S:
            return True
        with self._lock:
            if time.monotonic() - self._seen_mono <= PAUSE_SEEN_WITHIN_S:
                return True  # another slot has just read it
            asked = time.monotonic()
            try:
                paused = self.runtime.store.retrying("pause check", lambda d: is_paused(d, self.queue), give_up_after_s=5.0)
            except Exception:  # noqa: BLE001 - not known to be active: start nothing, as if paused
                logger.warning("durq: could not read whether queue %r is paused; handing its buffered jobs back", self.queue)
                return False
            if paused:
                return False
            self.saw_active(asked)
            return True
