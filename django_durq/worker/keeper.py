"""The lease keeper: one thread per worker process whose only work is renewing leases.

It renews every lease the process holds (buffered, running, and finished jobs whose completion
has not committed yet) in one statement, at least three times per lease, and re-reads the
database server's clock (see ``clock.ServerClock``) as it goes. It runs no user code,
reaps nothing and writes no counters, so a slow signal receiver, a long completion batch or a
stuck dispatcher cannot make a healthy job's lease lapse.

When renewals stop getting through (the database is unreachable, a lock holds the renewal up
past its bound, or this thread itself was stalled), each attempt's context sees its confirmed
lease running out and ``should_stop()`` turns true ("lease at risk") a margin before the database
could give the job away. From that same moment the process claims nothing (``AttemptBook``),
and after a renewal that failed it claims nothing until one succeeds again.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from django.db import connections

from ..clock import ServerClock
from ..conf import hooks
from ..db import wakeup
from ..execution.outcomes import log_extra
from .attempt import RUNNING

if TYPE_CHECKING:
    from .runtime import Runtime

logger = logging.getLogger("django_durq")

MIN_TICK_S = 0.05


class LeaseKeeper:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.stopped = threading.Event()
        self.kick = threading.Event()  # a job with a lease shorter than three heartbeats was claimed
        self._thread = threading.Thread(target=self._loop, name="durq-lease-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.kick.set()
        self._thread.join(timeout=5)

    def _tick_s(self) -> float:
        """Renew at the heartbeat interval, and at least three times per shortest lease held."""
        tick_ms = self.runtime.settings.heartbeat_interval_ms
        for attempt in self.runtime.book.snapshot():
            tick_ms = min(tick_ms, attempt.job.lease_ms // 3)
        return max(tick_ms / 1000, MIN_TICK_S)

    def _loop(self) -> None:
        last = time.monotonic()
        try:
            while not self.stopped.is_set():
                # A kick (a job with a short lease was claimed) only shortens the wait.
                self.kick.wait(max(0.0, last + self._tick_s() - time.monotonic()))
                self.kick.clear()
                if self.stopped.is_set():
                    break
                if time.monotonic() - last >= self._tick_s():
                    last = time.monotonic()
                    self.renew_once()
        except BaseException as error:
            logger.exception("durq: the lease keeper stopped on an unexpected error")
            self.runtime.fail("lease keeper failure", error)
        finally:
            connections.close_all()

    def renew_once(self) -> bool:
        """Renew every lease in the book; False when the renewal could not get through in time."""
        runtime = self.runtime
        book = runtime.book
        clock = runtime.clock
        if isinstance(clock, ServerClock):
            clock.measure(quiet=True)  # the database's clock, re-read at every renewal
        attempts = book.snapshot()
        if not attempts:
            self._reconfirmed()
            return True
        for attempt in attempts:
            if attempt.state == RUNNING:
                hooks.reach("in_heartbeat", attempt.job.id)
        hooks.jitter("renew")
        leases = [attempt.lease for attempt in attempts]
        asked = time.monotonic()
        try:
            # Bounded by the next tick: a renewal that gets through late confirms nothing, and
            # one that hangs (a lock, a stalled server) must fail in time to be tried again.
            renewal = runtime.store.renew(leases, clock, bound_s=self._tick_s())
        except Exception as error:  # noqa: BLE001 - the contexts see their leases run out
            logger.warning("durq: could not renew %d lease(s): %s; claiming paused until a renewal succeeds", len(leases), error)
            book.hold_claims()
            return False
        for attempt in attempts:
            attempt.ctx.apply_renewal(renewal, asked)
            if attempt.ctx.lease_lost and attempt.state == RUNNING:
                job = attempt.job
                logger.warning("durq: job %s (%s) lost its lease (taken over or deleted)", job.id, job.name, extra=log_extra(job))
        if renewal.busy:
            logger.debug("durq: %d lease(s) not renewed this time: another transaction holds their rows", len(renewal.busy))
        self._reconfirmed()
        return True

    def _reconfirmed(self) -> None:
        """Move the claim bound on after a renewal; wake the pools if it had stopped their claims."""
        book = self.runtime.book
        held = not book.may_claim(time.monotonic())
        book.reconfirm()
        if held and book.may_claim(time.monotonic()):
            wakeup.notify_all()
