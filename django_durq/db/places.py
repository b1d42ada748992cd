"""Places: what a running limit counts, one per handler of a limited job until its thread ends.

Limits count handlers, and a handler is counted in one of two ways:

- **its attempt's row**, while the row is ``running`` under that attempt: from the claim (jobs
  claimed ahead included) until the attempt is settled. This is every handler that ends the usual
  way, so a limited claim writes nothing for its places and a completion frees nothing;
- **a place row** (``durq_limit_place``), for a handler that outlives its attempt's row. Python
  cannot stop a thread: a timed-out handler is abandoned and runs on, and a paused process
  (``SIGSTOP``, a long stall) resumes where it was after its lease ran out and its job was claimed
  again or buried. Whoever ends the row under a handler that may still run writes its place in
  the same step: the worker whose handler ran past its timeout (:func:`hold_abandoned`, before it
  fails the attempt), the claim that takes over an expired attempt (:func:`hold_taken_over`) and
  the sweep that buries one (:func:`hold_buried`), the last two only while the old attempt's
  worker still has a row. The handler's worker frees it when the thread is done with the attempt.

So a key's or a queue's place is held for as long as a handler runs, and until its process is
known to have ended: a running row stops counting once its lease has run out and its worker's
row is gone, and the place rows of a worker whose row is gone are freed (:func:`free_ended`). The
maintenance duty removes the row of a process that exited or was killed at once (its presence lock
is released, and the duty runs every few seconds), taking over its running jobs in the same pass;
a process that is paused or cut off keeps its row until a PostgreSQL or MariaDB session stays
silent for ``session_presence.SESSION_IDLE_S``, or ten heartbeats are missed where a worker holds
no presence lock. On SQLite a paused process keeps its lock, and its places, until it resumes or
ends.

Only limited jobs pay for places, and only when a handler outlives its attempt: the fast claim
never reads this table, and a limited claim reads it with the running rows in one statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .rows import JOB

if TYPE_CHECKING:
    from .base import Dialect, Lease

PLACES = "durq_limit_place"
WORKERS = "durq_worker"

# Every place held now, as rows of (queue, limit key, the job's own max_running): the running
# attempts still counted, then the handlers that outlived theirs. A running row whose lease is
# still current counts whoever holds it; one whose lease ran out counts while its worker has a row.
_HELD = (
    f"SELECT queue, limit_key, limit_running FROM {JOB} WHERE status = 'running'"
    f" AND (lease_expires_ms > %s OR claimed_by IN (SELECT worker_id FROM {WORKERS}))"
    f" UNION ALL SELECT queue, limit_key, limit_running FROM {PLACES}"
)
_COLUMNS = "job_id, claim_token, queue, limit_key, limit_running, worker_id, taken_ms"


def needs_place(key: str | None, queue_max_running: int | None) -> bool:
    """Whether a job counts against a running limit: its key's (any job with a key) or its queue's."""
    return key is not None or queue_max_running is not None


def counts(dialect: Dialect, queue: str, now_ms: int) -> tuple[int, dict[str, int]]:
    """Places held by handlers of ``queue``'s jobs (what its ``max_running`` counts), and places held
    per key in every queue (keys without any left out): one read of the running rows and the places.
    """
    # Grouped by position: with parameters bound by the server, the expression written twice would
    # hold two parameters, which PostgreSQL cannot tell are equal.
    rows = dialect.fetchall(
        f"SELECT limit_key, CASE WHEN queue = %s THEN 1 ELSE 0 END, COUNT(*) FROM ({_HELD}) held GROUP BY 1, 2",
        (queue, now_ms),
    )
    in_queue = 0
    per_key: dict[str, int] = {}
    for key, is_here, count in rows:
        if is_here:
            in_queue += int(count)
        if key is not None:
            per_key[key] = per_key.get(key, 0) + int(count)
    return in_queue, per_key


def held(dialect: Dialect, now_ms: int) -> list[tuple[str, str | None, int | None]]:
    """Every place held now: (queue, limit key, the job's own max_running), for an operator's view."""
    return [(row[0], row[1], row[2]) for row in dialect.fetchall(_HELD, (now_ms,))]


def hold_abandoned(dialect: Dialect, worker_id: str, now_ms: int, lease: Lease) -> None:
    """A place for this attempt's handler, which runs past its timeout: written while its row is
    still running under the attempt, before the attempt is failed, so the handler is never uncounted.
    """
    held_by, params = dialect.held_many([lease])
    select = f"SELECT id, claim_token, queue, limit_key, limit_running, %s, %s FROM {JOB} WHERE {held_by}"
    _insert(dialect, select, [worker_id, now_ms, *params])


def hold_taken_over(dialect: Dialect, now_ms: int, job_ids: Sequence[int]) -> None:
    """Places for the attempts these claimed jobs were just taken over from, whose workers still have
    a row: their handlers may still run. A claim adds one to the token and keeps the old holder.
    """
    if not job_ids:
        return
    marks = ", ".join(["%s"] * len(job_ids))
    _insert(
        dialect,
        f"SELECT id, claim_token - 1, queue, limit_key, limit_running, reclaimed_from, %s FROM {JOB}"
        f" WHERE id IN ({marks}) AND reclaimed_from IN (SELECT worker_id FROM {WORKERS})",
        [now_ms, *job_ids],
    )


def hold_buried(dialect: Dialect, now_ms: int, lease: Lease, queue_capped: bool) -> None:
    """A place for the attempt just buried after its lease ran out, if it counted against a running
    limit and its worker still has a row: its handler may still run.
    """
    _insert(
        dialect,
        f"SELECT id, claim_token, queue, limit_key, limit_running, claimed_by, %s FROM {JOB}"
        f" WHERE id = %s AND claim_token = %s AND (limit_key IS NOT NULL OR %s)"
        f" AND claimed_by IN (SELECT worker_id FROM {WORKERS})",
        [now_ms, lease[0], lease[1], queue_capped],
    )


def _insert(dialect: Dialect, select: str, params: list[object]) -> None:
    # Two writers may both see a handler outlive its attempt (its worker's timeout, a takeover):
    # the place is one, whoever writes it first.
    dialect.execute(f"{dialect.insert_ignoring} INTO {PLACES} ({_COLUMNS}) {select}{dialect.conflicts_ignored}", params)


def free(dialect: Dialect, leases: Sequence[Lease]) -> int:
    """Free the places of these attempts (job id, claim token); how many there were."""
    if not leases:
        return 0
    attempts, params = dialect.attempt_pairs(leases)
    return dialect.execute(f"DELETE FROM {PLACES} WHERE {attempts}", params)


def free_ended(dialect: Dialect) -> list[str]:
    """Free the places of worker processes whose row is gone; the queues whose places were freed.

    A worker's row exists from before its first claim until it stops, or until the maintenance
    duty judges it ended (its presence lock released, or its heartbeats missed): whatever removed
    the row, its handlers are gone, or are to be treated so.
    """
    ended = f"worker_id NOT IN (SELECT worker_id FROM {WORKERS})"
    # Read first: on SQLite even a DELETE that matches nothing takes the write lock.
    queues = sorted({row[0] for row in dialect.fetchall(f"SELECT DISTINCT queue FROM {PLACES} WHERE {ended}")})
    if queues:
        dialect.execute(f"DELETE FROM {PLACES} WHERE {ended}")
    return queues
