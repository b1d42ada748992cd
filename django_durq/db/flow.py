"""The limited claim: jobs claimed under concurrency and rate limits, per key and per queue, across every worker.

A limit is enforced *inside* the claim, never after it: a job that may not start yet stays
waiting with its attempts unspent and its place in the order kept, and the claim takes the next
job instead (``db/admission.py``). What counts is read from rows, never from permits in a
worker's memory: places held by running handlers (``db/places.py``: running rows, and the
handlers that outlived theirs) and starts logged in each rate's window (``db/starts.py``). One
transaction takes the claimer's turns (``db/gates.py``), counts, claims what it admitted (whose
rows are then their places) and logs their starts, so two claimers never both see the last free
place.

The fast claim (``Dialect.claim``) leaves limited jobs alone; a pool claims through here once its
queue has limits in the settings or limited jobs in the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import DatabaseError, transaction

from ..conf import hooks
from . import gates, places
from .admission import Admission
from .rows import JOB, ClaimedJob

if TYPE_CHECKING:
    from ..clock import Clock
    from ..handlers.limits import QueueLimits
    from .base import Dialect


@dataclass
class Outlook:
    """What a limited claim learnt for its pool: when a rate window next lets a held-back job start.

    None when no rate holds a due job back, or when the claim took all it was asked for.
    """

    opens_at_ms: int | None = None


def claim_limited(
    dialect: Dialect,
    queue: str,
    limit: int,
    now_ms: int,
    worker_id: str,
    limits: QueueLimits,
    clock: Clock | None = None,
    outlook: Outlook | None = None,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` jobs of ``queue`` that its limits let start now, in claim order.

    With ``clock``, the time is read again once the turns are taken: a claimer that waited for
    its turn must not log its starts at the time it began to wait, behind starts logged meanwhile.
    Each job claimed that counts against a running limit is marked ``ClaimedJob.placed``: its row
    is its place while it runs, and a place row written for a handler that outlives its attempt
    is freed by its worker when the handler's thread is done with it.
    """
    if outlook is not None:
        outlook.opens_at_ms = None
    own = not dialect.connection.in_atomic_block
    try:
        # Nested in a transaction that records completions, this is a savepoint: a turn not had in
        # time gives up the claim alone (db/gates.py).
        with transaction.atomic(using=dialect.connection.alias):
            if own:
                dialect.bound_turns()
            jobs = _claim_in_turn(dialect, queue, limit, now_ms, worker_id, limits, clock, outlook)
    except DatabaseError as error:
        if not dialect.is_lock_error(error):
            raise
        if outlook is not None:
            outlook.opens_at_ms = now_ms  # claim again at once, not at the next poll: the turn may be free by then
        return []
    jobs.sort(key=lambda job: (job.reclaimed_from is None, -job.priority, job.run_at_ms, job.id))
    return jobs


def _claim_in_turn(
    dialect: Dialect,
    queue: str,
    limit: int,
    now_ms: int,
    worker_id: str,
    limits: QueueLimits,
    clock: Clock | None,
    outlook: Outlook | None,
) -> list[ClaimedJob]:
    if gates.take_turns(dialect, queue, now_ms):
        return []  # paused
    hooks.reach("in_turn", 0)  # a claimer frozen while it holds its turns
    if clock is not None:
        now_ms = max(now_ms, clock.now_ms())
    admission = Admission(dialect, queue, now_ms, limits)
    accepted = admission.admit(limit)
    if outlook is not None and len(accepted) < limit:
        outlook.opens_at_ms = admission.opens_at()
    if not accepted:
        return []
    hooks.jitter("admit")  # a claimer stalled between counting and claiming still holds its turns
    # Claimed only under the key it was counted with: a debounce may have replaced it since the read.
    jobs = dialect.claim_ids([(candidate.id, candidate.key) for candidate in accepted], now_ms, worker_id)
    counted = {candidate.id: candidate for candidate in accepted}
    for job in jobs:
        job.placed = places.needs_place(counted[job.id].key, limits.max_running)
    # A claimed job's row is its place; an attempt taken over may still have a handler running.
    places.hold_taken_over(dialect, now_ms, [job.id for job in jobs if job.placed and job.reclaimed_from is not None])
    admission.record_starts([counted[job.id] for job in jobs])
    return jobs


def next_start(dialect: Dialect, queue: str, now_ms: int, limits: QueueLimits) -> int | None:
    """When a job of ``queue`` may next start under its limits (``<= now_ms``: now); None: nothing waits.

    A read that locks nothing, for an idle pool: jobs held back by a limit do not make it claim
    again and again. A held-back job starts at the latest when a rate window opens, or when a
    place frees: the pool whose handler ends claims next, others at their next poll or wake-up.
    """
    if gates.is_paused(dialect, queue):
        return None
    admission = Admission(dialect, queue, now_ms, limits)
    if admission.admit(1):
        return now_ms
    later_due, lease_due = dialect.fetchall(
        f"SELECT (SELECT MIN(run_at_ms) FROM {JOB} WHERE queue = %s AND status = 'waiting' AND run_at_ms > %s),"
        f" (SELECT MIN(lease_expires_ms) FROM {JOB} WHERE queue = %s AND status = 'running' AND lease_expires_ms > %s)",
        (queue, now_ms, queue, now_ms),
    )[0]
    times = [t for t in (admission.opens_at(), lease_due, later_due) if t is not None]
    if admission.held_back and not times:
        return None  # held back until a place frees
    return min(times) if times else None


def has_limited_jobs(dialect: Dialect, queue: str) -> bool:
    """Whether ``queue`` holds a waiting or running job with a limit (one seek in ``durq_job_limited``).

    A job waits or runs exactly while ``finished_ms`` is NULL, which is what the index holds.
    """
    return bool(
        dialect.fetchall(
            f"SELECT 1 FROM {JOB} WHERE queue = %s AND limit_key IS NOT NULL AND finished_ms IS NULL LIMIT 1",
            (queue,),
        )
    )
