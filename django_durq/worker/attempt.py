"""One attempt — one claim of one job — and the book of every attempt a worker process holds.

An attempt is named by its lease, (job id, claim token): a new claim of the same job is a new
attempt with a new token, so nothing one attempt does (its return, its timeout, its completion)
can touch another's bookkeeping. The book holds an attempt from its claim until its outcome is
recorded — buffered, running, or finished and waiting for its completion to commit — and the
lease keeper renews exactly what the book holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..context import JobContext
from ..db import ClaimedJob, Lease

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
    """Every attempt this process holds a lease for, by lease; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts: dict[Lease, Attempt] = {}

    def add(self, attempts: list[Attempt]) -> None:
        with self._lock:
            for attempt in attempts:
                self._attempts[attempt.lease] = attempt

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

    def snapshot(self) -> list[Attempt]:
        with self._lock:
            return list(self._attempts.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._attempts)

    def __iter__(self) -> Iterator[Attempt]:
        return iter(self.snapshot())
