"""What a running handler can ask of the queue: ``heartbeat()``, ``should_stop()``, ``is_last_attempt()``."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .clock import Clock

if TYPE_CHECKING:
    from .db import ClaimedJob
    from .store import Store

LEASE_LOST = "lease lost"
CANCELLED = "cancelled"
TIMED_OUT = "timed out"
SHUTDOWN = "shutdown"


class JobContext:
    """Handed to every handler as its first argument.

    The worker renews leases in the background, so a handler need not call ``heartbeat()``
    to keep its job; call it to learn at once whether the job is still yours.
    """

    def __init__(
        self,
        job: ClaimedJob,
        *,
        worker_id: str,
        store: Store,
        clock: Clock,
        shutdown: threading.Event,
    ) -> None:
        self.job_id = job.id
        self.name = job.name
        self.queue = job.queue
        self.attempt = job.attempts
        self.max_attempts = job.max_attempts
        self.claim_token = job.claim_token
        self.worker_id = worker_id
        self.started_ms = clock.now_ms()
        self.deadline_ms = self.started_ms + job.timeout_ms if job.timeout_ms else None
        self.lease_lost = False
        self.stop_requested = False
        self.stop_seen = False  # should_stop() has answered True to the handler
        self.settled = False  # the executor is recording the outcome; renewals no longer matter
        self._store = store
        self._clock = clock
        self._shutdown = shutdown

    @property
    def lease(self) -> tuple[int, int]:
        return (self.job_id, self.claim_token)

    def heartbeat(self) -> bool:
        """Extend this job's lease now; False when another worker has taken the job over."""
        if self.lease_lost:
            return False
        held = self._store.renew([self.lease], self._clock.now_ms())
        self.apply_renewal(held)
        return not self.lease_lost

    def apply_renewal(self, held: dict[int, bool]) -> None:
        """Record what a (batched) lease renewal said about this job."""
        if self.settled:
            return
        if self.job_id in held:
            self.stop_requested = self.stop_requested or held[self.job_id]
        else:
            self.lease_lost = True

    def stop_reason(self) -> str | None:
        if self.lease_lost:
            return LEASE_LOST
        if self.stop_requested:
            return CANCELLED
        if self.timed_out():
            return TIMED_OUT
        if self._shutdown.is_set():
            return SHUTDOWN
        return None

    def should_stop(self) -> bool:
        """True when the handler should return soon: shutdown, lost lease, cancellation or timeout."""
        if self.stop_reason() is None:
            return False
        self.stop_seen = True
        return True

    def timed_out(self) -> bool:
        return self.deadline_ms is not None and self._clock.now_ms() >= self.deadline_ms

    def is_last_attempt(self) -> bool:
        """True on the attempt after which a failure makes the job a dead letter."""
        return self.attempt >= self.max_attempts

    def progress(self, done: int, total: int | None = None) -> bool:
        """Report progress (shown in the admin); False when the lease is no longer held."""
        if self.lease_lost:
            return False
        held = self._store.retrying("progress", lambda d: d.report_progress(self.lease, done, total))
        if not held:
            self.lease_lost = True
        return held
