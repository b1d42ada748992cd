"""What a running handler can ask of the queue: ``heartbeat()``, ``should_stop()``, ``is_last_attempt()``.

A :class:`JobContext` is one attempt: one claim of one job, named by its lease (job id, claim
token). It knows until when the database last confirmed that lease, on this process's monotonic
clock, so ``should_stop()`` turns true by itself when renewals stop getting through — whatever
thread stalled — before the database could give the job to another worker. It also turns true
when the worker's presence lock may have gone, as a takeover needs nothing more.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..clock import Clock

if TYPE_CHECKING:
    from ..db import ClaimedJob, Renewal
    from ..db.store import Store

LEASE_LOST = "lease lost"
LEASE_AT_RISK = "lease at risk"
PRESENCE_LOST = "presence lost"
CANCELLED = "cancelled"
TIMED_OUT = "timed out"
SHUTDOWN = "shutdown"
# The reasons a worker asks a handler to stop although its job is still its own: a handler that
# returns after hearing one of them hands its job back, attempt not counted.
HAND_BACK_REASONS = (SHUTDOWN, LEASE_AT_RISK, PRESENCE_LOST)
# How often a job whose lease is unconfirmed looks again, before it starts, whether a renewal got through.
CONFIRM_WAIT_S = 0.05


# Guards JobContext.settle(); contention is rare (a timeout racing a return), so one lock serves all.
_settle_lock = threading.Lock()


def lease_margin_s(lease_ms: int) -> float:
    """How long before its lease runs out an attempt whose renewals stall is told to stop.

    A quarter of the lease: with three renewals per lease the keeper has missed two in a row by
    then, and the handler still has a quarter of the lease to notice and return.
    """
    return lease_ms / 4000


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
        stop_cause: Callable[[], str] | None = None,
        claimed_mono: float | None = None,
        presence_held_since: Callable[[], float | None] | None = None,
        claimed_ms: int | None = None,
    ) -> None:
        self.job_id = job.id
        self.name = job.name
        self.queue = job.queue
        self.attempt = job.attempts
        self.max_attempts = job.max_attempts
        self.claim_token = job.claim_token
        self.lease = (job.id, job.claim_token)  # names this attempt: (job id, claim token)
        self.worker_id = worker_id
        self.lease_ms = job.lease_ms
        self.timeout_ms = job.timeout_ms
        # Until the handler starts (``start()``), the claim's times: a dispatcher builds one context
        # per job it claims and passes both, so the clocks are read once per batch, not per job.
        mono = time.monotonic() if claimed_mono is None else claimed_mono
        self.started_ms = clock.now_ms() if claimed_ms is None else claimed_ms
        self.started_mono = mono
        self.deadline_ms = self.started_ms + job.timeout_ms if job.timeout_ms else None
        self.lease_lost = False
        # An operator's cancel, read at the claim or from a renewal: final whatever happens next.
        self.stop_requested = bool(getattr(job, "stop_requested", False))
        self.stop_seen = False  # should_stop() has answered True to the handler
        self.seen_reason: str | None = None  # the reason it gave then
        self.settled = False  # an outcome of this attempt is being recorded; nothing else may record one
        # Monotonic second until which the database has confirmed this lease: from the moment the
        # claim read its "now" (``claimed_mono``), or at the latest from when the context was built.
        self.confirmed_until = mono + job.lease_ms / 1000
        # Monotonic second at which the lease was last confirmed: the claim, then each renewal sent.
        self.confirmed_at = mono
        self._margin_s = lease_margin_s(job.lease_ms)
        # Set by ``start()``: a timeout counts from the handler's start, so an attempt waiting for
        # its lease to be confirmed (``wait_confirmed``) is never reaped as one that overran.
        self._deadline_mono: float | None = None
        self._store = store
        self._clock = clock
        self._shutdown = shutdown
        self._stop_cause = stop_cause
        self._presence_held_since = presence_held_since

    def start(self) -> None:
        """The handler starts now: timeouts count from here, not from the claim."""
        self.started_ms = self._clock.now_ms()
        self.started_mono = mono = time.monotonic()
        if self.timeout_ms:
            self.deadline_ms = self.started_ms + self.timeout_ms
            self._deadline_mono = mono + self.timeout_ms / 1000

    def settle(self) -> bool:
        """Claim the right to record this attempt's outcome; True for the first caller only.

        The slot that ran the handler and the monitor that reaps a timeout may both reach an
        outcome; exactly one of them records it, counts it and announces it.
        """
        with _settle_lock:
            if self.settled:
                return False
            self.settled = True
            return True

    def heartbeat(self) -> bool:
        """Extend this job's lease now; False when another worker has taken the job over."""
        if self.lease_lost:
            return False
        asked = time.monotonic()
        renewal = self._store.renew([self.lease], self._clock)
        self.apply_renewal(renewal, asked)
        return not self.lease_lost

    def apply_renewal(self, renewal: Renewal, asked: float) -> None:
        """Record what a (batched) renewal sent at monotonic time ``asked`` said about this lease.

        A renewal sets the lease to at least its start + the lease length, so it confirms the
        lease until ``asked`` + the lease length on this process's clock. A lease the renewal
        found busy (its row locked by another transaction) is neither confirmed nor lost.
        """
        if self.lease in renewal.renewed:
            self.stop_requested = self.stop_requested or renewal.renewed[self.lease]
            self.confirmed_until = max(self.confirmed_until, asked + self.lease_ms / 1000)
            self.confirmed_at = max(self.confirmed_at, asked)
        elif self.lease not in renewal.busy and not self.settled:
            self.lease_lost = True

    @property
    def at_risk_from(self) -> float:
        """The monotonic second from which this lease is at risk unless a renewal confirms it again."""
        return self.confirmed_until - self._margin_s

    def lease_at_risk(self) -> bool:
        """No renewal got through for long enough that the lease may lapse before the next one."""
        return time.monotonic() >= self.at_risk_from

    def wait_confirmed(self) -> bool:
        """Before the handler starts: wait while no renewal has confirmed the lease lately; False if lost meanwhile.

        A job claimed ahead may wait in a buffer while renewals fail (a locked or unreachable
        database) until its lease could have run out and another worker taken it: started then,
        it would run beside that worker's attempt. It starts once a renewal confirms the lease or,
        found lost, never; a worker stopping meanwhile leaves it unstarted too, for its lease to expire,
        and so does an outcome recorded meanwhile by anything else (no renewal is sent for it then).
        """
        while not self.lease_lost and not self.settled and (self.lease_at_risk() or self.presence_lost()):
            if self._shutdown.wait(CONFIRM_WAIT_S):
                return False
        return not self.lease_lost and not self.settled

    def presence_lost(self) -> bool:
        """This worker's presence lock may have been released since the lease was last confirmed.

        Another worker takes a job over once its worker's lock is released (``worker/takeover.py``),
        lease or no lease. The worker's presence thread learns that its session was lost at its next
        statement on it, within ``session_presence.WAIT_S`` (2 s), and gives it up 2.5 s before the server
        could end a silent session; from then until a renewal sent after the lock is held again
        confirms the lease, the handler is told to stop.
        """
        if self._presence_held_since is None:
            return False
        since = self._presence_held_since()
        return since is None or since > self.confirmed_at

    def stop_reason(self) -> str | None:
        if self.lease_lost:
            return LEASE_LOST
        if self.stop_requested:
            return CANCELLED
        now = time.monotonic()
        if now >= self.confirmed_until - self._margin_s:
            return LEASE_AT_RISK
        if self.presence_lost():
            return PRESENCE_LOST
        if self._deadline_mono is not None and now >= self._deadline_mono:
            return TIMED_OUT
        if self._shutdown.is_set():
            return SHUTDOWN
        return None

    def stop_detail(self) -> str:
        """Why the worker itself asked handlers to stop (a signal, --max-memory, a failure)."""
        return self._stop_cause() if self._stop_cause is not None else ""

    def should_stop(self) -> bool:
        """True when the handler should return soon: shutdown, lost lease or presence, cancellation or timeout."""
        reason = self.stop_reason()
        if reason is None:
            return False
        self.stop_seen = True
        self.seen_reason = reason
        return True

    def timed_out(self) -> bool:
        return self._deadline_mono is not None and time.monotonic() >= self._deadline_mono

    def overdue_by_s(self) -> float | None:
        """Seconds past the timeout (negative before it); None without a timeout."""
        return None if self._deadline_mono is None else time.monotonic() - self._deadline_mono

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

    def dependencies(self) -> list[Upstream]:
        """The jobs this one waited for (``after=`` in a workflow), in that order: how each ended, and its result.

        A fan-in callback counts them (``Counter(u.status for u in ctx.dependencies())``); a
        step of a chain reads the one result before it. An upstream deleted since it finished
        (``KEEP_FINISHED = 0``, for a job queued before it gained dependents) shows as finished
        with no result.
        """
        import json

        from ..models import Dependency, Job  # app loading: django_durq imports this module

        alias = self._store.alias
        upstream = list(
            Dependency.objects.using(alias).filter(job_id=self.job_id).order_by("id").values_list("depends_on_id", flat=True)
        )
        rows = {
            row[0]: row[1:]
            for row in Job.objects.using(alias).filter(pk__in=upstream).values_list("pk", "name", "status", "result")
        }
        found = []
        for job_id in upstream:
            name, status, result = rows.get(job_id, ("", "finished", None))
            found.append(Upstream(job_id, name, status, None if result is None else json.loads(result)))
        return found


@dataclass(frozen=True)
class Upstream:
    """A job that another waited for: its id, its name, how it ended and what it returned (JSON)."""

    job_id: int
    name: str
    status: str
    result: Any
