"""Places: one row per handler of a limited job, held from its claim until its thread ends.

Limits count places, never rows whose status is ``running``. A job's row stops being ``running``
when its attempt is settled (finished, failed at its timeout, handed back) or is taken over after
its lease lapsed, and a handler can outlive all of these: Python cannot stop a thread, a
timed-out handler is abandoned and runs on, a paused process (SIGSTOP, a long stall) resumes
where it was. A place goes with the handler instead:

- taken in the limited claim's own transaction, for each job the claim admits that has a limit
  key or whose queue has a ``max_running`` (jobs claimed ahead hold theirs from then on);
- freed by the worker when the handler's thread is done with the attempt (its completion's
  transaction, or right after any other outcome), or when it hands back a job that never started;
- freed for a worker process that has ended by the maintenance duty that removes worker rows
  (:func:`free_ended`): the places of every worker that has no row any more.

So a key's or a queue's place is held for as long as a handler runs, and until its process is
known to have ended: at once for a process that exited or was killed (its presence lock is
released, and the duty runs every few seconds); for a process that is paused or cut off, after a
PostgreSQL or MariaDB session stays silent for ``session_presence.SESSION_IDLE_S``, or after ten missed
heartbeats where a worker holds no presence lock. On SQLite a paused process keeps its lock, and
its places, until it resumes or ends.

Only limited jobs pay for places: the fast claim never reads or writes this table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Dialect, Lease

PLACES = "durq_limit_place"
JOB = "durq_job"
WORKERS = "durq_worker"


def needs_place(key: str | None, queue_max_running: int | None) -> bool:
    """Whether a job counts against a running limit: its key's (any job with a key) or its queue's."""
    return key is not None or queue_max_running is not None


def take(dialect: Dialect, worker_id: str, now_ms: int, leases: Sequence[Lease]) -> None:
    """Insert a place for each of these attempts, just claimed, with its job's queue, key and key limit."""
    if not leases:
        return
    held, params = dialect.held_many(leases)
    dialect.execute(
        f"INSERT INTO {PLACES} (job_id, claim_token, queue, limit_key, limit_running, worker_id, taken_ms)"
        f" SELECT id, claim_token, queue, limit_key, limit_running, %s, %s FROM {JOB} WHERE {held}",
        [worker_id, now_ms, *params],
    )


def free(dialect: Dialect, leases: Sequence[Lease]) -> int:
    """Free the places of these attempts (job id, claim token); how many there were."""
    if not leases:
        return 0
    attempts, params = dialect.attempt_pairs(leases)
    return dialect.execute(f"DELETE FROM {PLACES} WHERE {attempts}", params)


def counts(dialect: Dialect, queue: str) -> tuple[int, dict[str, int]]:
    """Places held by handlers of ``queue``'s jobs (what its ``max_running`` counts), and places held
    per key in every queue (keys without any left out): one read of a table as small as what runs.
    """
    # Grouped by position: with parameters bound by the server, the expression written twice would
    # hold two parameters, which PostgreSQL cannot tell are equal.
    rows = dialect.fetchall(
        f"SELECT limit_key, CASE WHEN queue = %s THEN 1 ELSE 0 END, COUNT(*) FROM {PLACES} GROUP BY 1, 2", (queue,)
    )
    in_queue = 0
    per_key: dict[str, int] = {}
    for key, is_here, count in rows:
        if is_here:
            in_queue += int(count)
        if key is not None:
            per_key[key] = per_key.get(key, 0) + int(count)
    return in_queue, per_key


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
