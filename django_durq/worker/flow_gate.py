"""Which claim a pool uses, and when it claims again while limits hold its queue's jobs back.

A queue with limits of its own (``DURQ["QUEUES"]``) claims through the limited claim
(``db/flow.py``) from the start; any other switches to it for good once it holds a job with a
``Limit``. The fast claim leaves limited jobs alone, so a pool that has not switched yet never
runs one without its limit.

A limited claim that comes back short says when a rate window next opens for the jobs it held
back (``Outlook``); the pool sleeps until then at the latest, so a held job starts as soon as its
window lets it, not at the next poll.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..db.flow import Outlook, has_limited_jobs, next_start
from ..handlers.limits import QueueLimits

if TYPE_CHECKING:
    from .runtime import Runtime

logger = logging.getLogger("django_durq")

# How often a pool whose claims succeed looks whether its queue got jobs with limits.
LIMITED_CHECK_S = 1.0


class FlowGate:
    def __init__(self, queue: str, runtime: Runtime) -> None:
        self.queue = queue
        self.runtime = runtime
        self.limits = runtime.settings.queue(queue).limits
        self.gated = self.limits.any
        self._checked = 0.0  # monotonic time of the last look for limited jobs
        # What the last idle probe read: when the queue's first lease of a last attempt runs out
        # (None: no such job running), and when (monotonic) it was read; None before any probe
        # and while gated.
        self._last_lease_due: int | None = None
        self._probed: float | None = None
        self.outlook = Outlook()  # what the last limited claim said of rate windows
        self._window_opens: float | None = None  # monotonic time a rate window opens for held-back jobs

    @property
    def claim_limits(self) -> QueueLimits | None:
        """What the pool's claims pass: the queue's limits once gated (the limited claim), else None."""
        return self.limits if self.gated else None

    @property
    def claim_outlook(self) -> Outlook | None:
        """Where a limited claim of the pool says when a rate window opens; None for the fast claim."""
        return self.outlook if self.gated else None

    def claimed(self, *, short: bool) -> None:
        """After a claim: remember when a rate window opens for the jobs it held back, if it came back short."""
        opens_ms = self.outlook.opens_at_ms if short and self.gated else None
        if opens_ms is None:
            self._window_opens = None
            return
        self._window_opens = time.monotonic() + max(opens_ms - self.runtime.clock.now_ms(), 0) / 1000

    def until_window(self, wait_s: float) -> float:
        """``wait_s``, cut short to wake when a rate window opens: a held-back job starts then, not at the next poll."""
        opens = self._window_opens
        if opens is None:
            return wait_s
        left_s = opens - time.monotonic()
        if left_s <= 0:
            self._window_opens = None  # open already (or it opened while the pool slept): claim now, once
            return 0.0
        return min(wait_s, left_s)

    def next_due(self, now: int) -> int | None:
        """When this pool may next claim something: the idle probe, a read that takes no write lock.

        Under limits it asks whether a job may start, not merely whether one is due, so jobs
        held back by a limit do not make an idle pool claim again and again.
        """
        store = self.runtime.store
        if self.gated:
            return store.retrying("probe", lambda d: next_start(d, self.queue, now, self.limits))
        waiting_due, lease_due, last_lease_due = store.due_times(self.queue)
        self._last_lease_due, self._probed = last_lease_due, time.monotonic()
        return min((t for t in (waiting_due, lease_due) if t is not None), default=None)

    def lost_possible(self, now: int, fresh_s: float) -> bool:
        """Whether a last attempt's lease may have run out by ``now``: False only when a probe made
        within ``fresh_s`` saw none that runs out before it (none running, or all leased longer).

        A lease is set by a claim to the claim's time plus the job's lease and only ever moves
        later, so a job claimed after the probe runs out after the next probe at the soonest
        unless its lease is shorter than ``fresh_s``; then it is found one probe later.
        """
        if self._probed is None or time.monotonic() - self._probed > fresh_s:
            return True  # busy (claiming without probes) or gated: look
        return self._last_lease_due is not None and self._last_lease_due <= now

    def learn(self, *, found_none: bool) -> bool:
        """Switch to the limited claim when the queue holds limited jobs; True when it just did.

        Looked for when a claim found nothing although a job was due or announced (it may be
        limited), and once a second while claims succeed, so that limited jobs do not wait for
        the queue's other jobs to run out.
        """
        if self.gated:
            return False
        now_mono = time.monotonic()
        if not found_none and now_mono - self._checked < LIMITED_CHECK_S:
            return False
        self._checked = now_mono
        if self.runtime.store.retrying("look for limits", lambda d: has_limited_jobs(d, self.queue)):
            logger.info("durq: queue %r holds jobs with limits; its claims now enforce them", self.queue)
            self.gated = True
        return self.gated
