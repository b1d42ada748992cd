"""The job row as the queue's SQL sees it: its table, the columns a claim reads, a claimed job, a lease and its fence."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

JOB = "durq_job"

# True while an operator has paused the job's queue (see ops/pausing.py); its one %s is the queue.
# It reads the control row by primary key and does not depend on the job row, so a database
# evaluates it once per statement: a queue with no control row costs one index probe.
NOT_PAUSED = "NOT EXISTS (SELECT 1 FROM durq_queue_control AS control WHERE control.queue = %s AND control.paused)"

# Columns a claim hands to the worker; the payload of a job that is not being run is never read.
CLAIM_COLUMNS = (
    "id",
    "name",
    "queue",
    "arguments",
    "attempts",
    "max_attempts",
    "claim_token",
    "lease_ms",
    "timeout_ms",
    "errors",
    "reclaimed_from",
    "priority",
    "run_at_ms",
    "created_ms",
    "stop_requested",
    "handbacks",
    "dependents",
    "workflow_id",
    "expires_ms",
)


@dataclass
class ClaimedJob:
    id: int
    name: str
    queue: str
    arguments: str
    attempts: int
    max_attempts: int
    claim_token: int
    lease_ms: int
    timeout_ms: int | None
    errors: str
    reclaimed_from: str | None
    priority: int
    run_at_ms: int
    created_ms: int
    stop_requested: bool = False  # an operator asked it to stop: it is cancelled, never started
    handbacks: int = 0  # started attempts handed back uncounted so far
    dependents: int | None = None  # jobs waiting for this one (workflows.py); its end must be counted
    workflow_id: int | None = None
    expires_ms: int | None = None  # not started by then: ended without running (executor, db/expiry.py)
    # Not a column: set after the claim. It counts against a running limit (db/places.py): its worker
    # frees the place row that a handler outliving the attempt may hold.
    placed: bool = False

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ClaimedJob:
        """By position: the fields follow ``CLAIM_COLUMNS`` in order (tests/db/test_claimed_job.py)."""
        return cls(*row)


Lease = tuple[int, int]  # (job id, claim token)


@dataclass(frozen=True)
class ClaimCount:
    """What a claim that counts itself (``Dialect.claim_counted``) adds to its writer's counters.

    The names and bounds come from db/counters.py: one ``started`` per job claimed, and the time
    from due to claim (``now_ms - run_at_ms``, never below 0) as a histogram, its sum in ``wait_sum``
    and each observation in the first of ``wait_buckets`` whose bound in ``wait_bounds_ms`` is not
    below it (the last bucket has no bound).
    """

    writer: str
    updated_ms: int
    started: str
    wait_sum: str
    wait_buckets: tuple[str, ...]
    wait_bounds_ms: tuple[int, ...]


@dataclass
class Renewal:
    """What one renewal of a batch of leases found.

    ``renewed``: the leases it extended, each with whether an operator asked its job to stop.
    ``busy``: leases still held whose row another transaction had locked, left as they were for
    the next renewal rather than waited for. A lease in neither is lost (taken over or deleted).
    """

    renewed: dict[Lease, bool]
    busy: set[Lease] = field(default_factory=set)


def _fence(leases: Sequence[Lease]) -> tuple[str, list[int]]:
    """``(id = %s AND claim_token = %s) OR …`` for a batch of leases, with its parameters."""
    clause = " OR ".join(["(id = %s AND claim_token = %s)"] * len(leases))
    params: list[int] = []
    for job_id, token in leases:
        params.extend((job_id, token))
    return f"({clause})", params


def integer_list(values: Iterable[int]) -> str:
    """``1, 2, 3``: integers a statement takes by the batch, written into its text instead of bound.

    Where the driver interpolates bound values itself (mysqlclient, MariaDB's), it escapes each
    in Python, 1-2 µs a value: several per job of a batch, on the thread that claims for every
    slot. ``int()`` keeps the text a list of numbers whatever the caller passed.
    """
    return ", ".join([str(int(value)) for value in values])


def integer_pairs(leases: Sequence[Lease]) -> str:
    """``(1, 7), (2, 14)``: (id, claim token) pairs for a row-value ``IN`` list, written as :func:`integer_list`."""
    return ", ".join([f"({int(job_id)}, {int(token)})" for job_id, token in leases])
