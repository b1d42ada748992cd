"""The statements that give a running job back to the queue without an outcome from its handler.

Two cases, both fenced by the claim token and ``status = 'running'`` like every write after a
claim, so a row that changed meanwhile is left as it is:

- a takeover: the job's worker has ended (``worker/takeover.py``). Its attempt is recorded as
  failed and the job is claimable at once; a last attempt becomes a dead letter. The statements
  keep the job's due time: it was due when it was claimed, so it keeps its place in the order;
- a hand-back by a worker that has no handler for the job's type (``execution/recording.py``): the attempt
  is not counted, and the job is due again a moment later, for a worker that has one.

An operator's cancel is final in both: the job ends cancelled instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .rows import JOB, _fence

if TYPE_CHECKING:
    from .base import Dialect, Lease


@dataclass
class Orphan:
    """A running job of an ended worker, as the takeover read it under its row lock."""

    id: int
    claim_token: int
    name: str
    queue: str
    attempts: int
    max_attempts: int
    errors: str
    worker: str
    dependents: int | None
    stop_requested: bool

    @property
    def lease(self) -> Lease:
        return (self.id, self.claim_token)

    @property
    def last_attempt(self) -> bool:
        return self.attempts >= self.max_attempts

    @property
    def ends(self) -> bool:
        """The takeover ends the job (a dead letter, or cancelled at an operator's request)."""
        return self.last_attempt or bool(self.stop_requested)


def _marks(values: Sequence[object]) -> str:
    return ", ".join(["%s"] * len(values))


def running_of(dialect: Dialect, workers: Sequence[str]) -> list[Lease]:
    """The leases of the running jobs these workers hold: a read that takes no lock (nor SQLite's write lock)."""
    if not workers:
        return []
    rows = dialect.fetchall(
        f"SELECT id, claim_token FROM {JOB} WHERE status = 'running' AND claimed_by IN ({_marks(workers)})", list(workers)
    )
    return [(row[0], row[1]) for row in rows]


def lock_orphans(dialect: Dialect, leases: Sequence[Lease]) -> list[Orphan]:
    """Lock these leases' rows (within the caller's transaction) and read those still running under them."""
    if not leases:
        return []
    fence, params = _fence(leases)
    rows = dialect.fetchall(
        f"SELECT id, claim_token, name, queue, attempts, max_attempts, errors, claimed_by, dependents, stop_requested FROM {JOB}"
        f" WHERE status = 'running' AND {fence} {dialect.row_lock}",
        params,
    )
    return [Orphan(*row) for row in rows]


def take_over(dialect: Dialect, orphan: Orphan, now_ms: int, errors: str) -> bool:
    """Record the orphan's attempt as failed: waiting and due at once, or a dead letter on its last attempt."""
    ended = "dead" if orphan.last_attempt else "waiting"
    finished = "%s" if orphan.last_attempt else "NULL"
    fence, params = _fence([orphan.lease])
    return (
        dialect.execute(
            f"UPDATE {JOB} SET status = CASE WHEN stop_requested THEN 'cancelled' ELSE '{ended}' END,"
            f" finished_ms = CASE WHEN stop_requested THEN %s ELSE {finished} END,"
            f" lease_expires_ms = NULL, errors = %s WHERE status = 'running' AND {fence}",
            [now_ms, *([now_ms] if orphan.last_attempt else []), errors, *params],
        )
        == 1
    )


def hand_back_unknown(dialect: Dialect, lease: Lease, run_at_ms: int, now_ms: int, errors: str | None) -> bool:
    """Give back a job whose type this worker does not know, attempt not counted, due at ``run_at_ms``.

    ``errors``: the job's history with the hand-back noted, or None to leave it as it is.
    """
    fence, params = _fence([lease])
    return (
        dialect.execute(
            f"UPDATE {JOB} SET status = CASE WHEN stop_requested THEN 'cancelled' ELSE 'waiting' END,"
            " finished_ms = CASE WHEN stop_requested THEN %s ELSE NULL END,"
            " lease_expires_ms = NULL, attempts = attempts - 1, run_at_ms = %s, errors = COALESCE(%s, errors)"
            f" WHERE status = 'running' AND {fence}",
            [now_ms, run_at_ms, errors, *params],
        )
        == 1
    )
