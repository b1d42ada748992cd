"""One attempt — one claim of one job — and the book of every attempt a worker process holds.

An attempt is named by its lease, (job id, claim token): a new claim of the same job is a new
attempt with a new token, so nothing one attempt does (its return, its timeout, its completion)
can touch another's bookkeeping. The book holds an attempt from its claim until its outcome is
recorded — buffered, running, or finished and waiting for its completion to commit — and the
lease keeper renews exactly what the book holds.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..clock import CappedClock, Clock
from ..db import ClaimedJob, Lease
from ..handlers.context import JobContext

if TYPE_CHECKING:
    from .pool import Pool

BUFFERED = "buffered"  # claimed ahead, not started
RUNNING = "running"
FINISHING = "finishing"  # the handler returned; its completion waits to be committed in a batch


class Attempt:
    __slots__ = ("abandoned", "buffered_at", "ctx", "finished_ms", "job", "lease", "pool", "result", "state", "stored")

    def __init__(self, job: ClaimedJob, ctx: JobContext, pool: Pool | None = None) -> None:
        self.job = job
        self.ctx = ctx
        self.lease: Lease = ctx.lease
        self.pool = pool
        self.state = BUFFERED
        self.buffered_at = time.monotonic()
        self.result: Any = None
        # Set when its finished row is kept (retention on): the result as stored, and when it finished.
        self.stored: str | None = None
        self.finished_ms: int | None = None
        # A timeout gave this attempt's slot to a new thread: the old thread, when its handler
        # returns at last, records nothing and takes no further job.
        self.abandoned = False

    def __repr__(self) -> str:
        return f"<Attempt job={self.job.id} token={self.job.claim_token} {self.state}>"


class AttemptBook:
    """Every attempt this process holds a lease for, by lease; thread-safe.

    It also says until when this process may claim (``claims_until``): until the first moment a
    lease it holds turns at risk, three quarters of the lease after the database last confirmed
    it. A claim reads its time before it checks that moment, so no lease this process holds has
    expired at the claim's time, and its expired branch can never take back a job this process
    still holds. A claim adds its attempts (moving the moment earlier if their leases are short);
    a renewal that gets through moves it on (``reconfirm``); one that fails stops claims at once
    (``hold_claims``); a renewal that hangs stops them when the moment comes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts: dict[Lease, Attempt] = {}
        self.claims_until = math.inf  # monotonic second; read without the lock (one float)

    def add(self, attempts: list[Attempt]) -> None:
        with self._lock:
            for attempt in attempts:
                self._attempts[attempt.lease] = attempt
                self.claims_until = min(self.claims_until, attempt.ctx.at_risk_from)

    def may_claim(self, now_mono: float) -> bool:
        """Whether a claim whose time was read before monotonic second ``now_mono`` may go ahead."""
        return now_mono < self.claims_until

    def reconfirm(self) -> None:
        """After a renewal got through: claims go on until the first lease still held turns at risk."""
        with self._lock:
            live = (attempt.ctx.at_risk_from for attempt in self._attempts.values() if not attempt.ctx.lease_lost)
            self.claims_until = min(live, default=math.inf)

    def claim_clock(self, clock: Clock) -> Clock:
        """``clock``, read no later than the claim bound: for a claim that reads the time again."""
        remaining_s = self.claims_until - time.monotonic()
        if remaining_s == math.inf:
            return clock
        # Past the bound already (a renewal failed meanwhile): the claim keeps the time it read.
        return CappedClock(clock, clock.now_ms() + math.floor(remaining_s * 1000) if remaining_s > 0 else 0)

    def hold_claims(self) -> None:
        """After a renewal failed: no claim until one gets through."""
        with self._lock:  # not lost to a claim adding its attempts meanwhile
            self.claims_until = -math.inf

    def remove_many(self, attempts: list[Attempt]) -> None:
        with self._lock:
            for attempt in attempts:
                if self._attempts.get(attempt.lease) is attempt:
                    del self._attempts[attempt.lease]

    def remove(self, attempt: Attempt) -> None:
        """Forget ``attempt``, and only it: another attempt of the same job keeps its place."""
        with self._lock:
            if self._attempts.get(attempt.lease) is attempt:
                del self._attempts[attempt.lease]

    def holds(self, lease: Lease) -> bool:
        with self._lock:
            return lease in self._attempts

    def snapshot(self) -> list[Attempt]:
        with self._lock:
            return list(self._attempts.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._attempts)

    def __iter__(self) -> Iterator[Attempt]:
        return iter(self.snapshot())
