"""Counting the ends of jobs that other jobs wait for: release a dependent once nothing it waits for is left.

Each edge (``durq_dependency``: job ``job_id`` waits for ``depends_on_id``) is counted once,
when its upstream job has ended and a settler takes the edge: the edges are read with a row lock
(``SKIP LOCKED``: a worker and the sweep never wait for each other nor count an edge twice) and
marked ``settled`` in the same transaction that updates their dependents. So a dependent's
``deps_left`` reaches 0 in exactly one transaction, which releases it: a fan-in callback is queued
once, however many workers end its members at the same moment and whoever crashes meanwhile.

A dependent whose upstream ended dead or cancelled is cancelled too (``cancelled_by`` names the
upstream), and so on down the graph, unless it says ``on_failure = 'run'``: then the failure
counts as an end like any other. ``revive`` undoes that when the failed job is retried.

The worker that ends a job with dependents settles its edges right after its own commit; the
maintenance sweep settles whatever that missed (a crash between the two, an operator's cancel),
so a dependent waits at most a sweep interval longer, never forever.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.db import transaction

from .. import wakeup
from .base import JOB

if TYPE_CHECKING:
    from .base import Dialect

EDGES = "durq_dependency"
# The due time of a job that still waits for others: never, as far as a claim can tell.
# 9999-12-31T23:59:59Z, the last instant a Python datetime can show.
BLOCKED_MS = 253_402_300_799_000
# Edges taken per round; a sweep goes round until none is left.
BATCH = 500
ENDED = ("finished", "dead", "cancelled")


@dataclass
class Settled:
    """What a settle did: edges counted, jobs released (now due) and jobs cancelled with their upstream."""

    edges: int = 0
    released: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)


def settle(dialect: Dialect, now_ms: int, upstream: Sequence[int] | None = None) -> Settled:
    """Count the ends of ``upstream`` jobs (every ended job when None) for the jobs waiting on them."""
    result = Settled()
    if upstream is not None and not upstream:
        return result  # nothing ended (a cancel that only asked running jobs to stop): no "IN ()" to send
    pending: Sequence[int] | None = upstream
    with transaction.atomic(using=dialect.connection.alias):
        while True:
            edges = _take_ended_edges(dialect, pending)
            if not edges:
                break
            result.edges += len(edges)
            cancelled = _apply(dialect, edges, now_ms, result)
            if pending is not None:
                # Jobs cancelled here have ended too: their dependents are counted in this transaction.
                pending = cancelled
                if not pending:
                    break
    return result


def uncounted_ends(dialect: Dialect) -> tuple[bool, bool]:
    """Whether some edge is not counted yet (a workflow is in flight), and whether some job's end is
    still to be counted: one read, so that an idle sweep takes no write lock."""
    row = dialect.fetchall(
        f"SELECT EXISTS (SELECT 1 FROM {EDGES} WHERE NOT settled),"
        f" EXISTS (SELECT 1 FROM {EDGES} d LEFT JOIN {JOB} u ON u.id = d.depends_on_id"
        " WHERE NOT d.settled AND (u.id IS NULL OR u.status IN ('finished', 'dead', 'cancelled')))"
    )[0]
    return bool(row[0]), bool(row[1])


def _take_ended_edges(dialect: Dialect, upstream: Sequence[int] | None) -> list[tuple[int, int, int, str]]:
    """Unsettled edges whose upstream has ended (or is gone), locked: (edge id, job id, upstream id, how it ended)."""
    params: list[object] = []
    where = "NOT d.settled AND (u.id IS NULL OR u.status IN ('finished', 'dead', 'cancelled'))"
    if upstream is not None:
        where += f" AND d.depends_on_id IN ({', '.join(['%s'] * len(upstream))})"
        params += list(upstream)
    rows = dialect.fetchall(
        f"SELECT d.id, d.job_id, d.depends_on_id, u.status FROM {EDGES} d LEFT JOIN {JOB} u ON u.id = d.depends_on_id"
        f" WHERE {where} ORDER BY d.id LIMIT {BATCH} {dialect.edge_lock}",
        params,
    )
    if not rows:
        return []
    marks = ", ".join(["%s"] * len(rows))
    dialect.execute(f"UPDATE {EDGES} SET settled = TRUE WHERE id IN ({marks})", [row[0] for row in rows])
    # An upstream that is gone was deleted once it finished (KEEP_FINISHED = 0 for a job that
    # gained dependents after its claim): its end counts as finished.
    return [(row[0], row[1], row[2], row[3] or "finished") for row in rows]


def _apply(dialect: Dialect, edges: list[tuple[int, int, int, str]], now_ms: int, result: Settled) -> list[int]:
    """Update the dependents of these edges; returns the ids of the dependents cancelled."""
    ended: dict[int, int] = defaultdict(int)  # dependent -> upstream ends counted now
    failed: dict[int, int] = {}  # dependent -> an upstream that ended dead or cancelled
    for _, job_id, upstream_id, status in edges:
        ended[job_id] += 1
        if status != "finished":
            failed.setdefault(job_id, upstream_id)
    marks = ", ".join(["%s"] * len(ended))
    # Locked, in id order: settlers of two members of one group take turns on their dependent,
    # and each sees the count the other left.
    rows = dialect.fetchall(
        f"SELECT id, queue, deps_left, on_failure FROM {JOB} WHERE id IN ({marks}) AND status = 'waiting'"
        f" ORDER BY id {dialect.row_lock}",
        sorted(ended),
    )
    cancelled: list[int] = []
    released_queues: set[str] = set()
    by_count: dict[int, list[int]] = defaultdict(list)
    for job_id, queue, deps_left, on_failure in rows:
        count = min(ended[job_id], deps_left or 0)
        if job_id in failed and on_failure != "run":
            _cancel(dialect, job_id, failed[job_id], count, now_ms)
            cancelled.append(job_id)
            continue
        if count:
            by_count[count].append(job_id)
            if (deps_left or 0) == count:
                result.released.append(job_id)
                released_queues.add(queue)
    for count, ids in by_count.items():
        marks = ", ".join(["%s"] * len(ids))
        # run_at_ms is set first: MariaDB assigns left to right, reading deps_left before its update.
        dialect.execute(
            f"UPDATE {JOB} SET run_at_ms = CASE WHEN deps_left = %s THEN %s ELSE run_at_ms END,"
            f" deps_left = deps_left - %s WHERE id IN ({marks}) AND status = 'waiting'",
            [count, now_ms, count, *ids],
        )
    if released_queues:
        wakeup.wake_on_commit(dialect.connection.alias, sorted(released_queues))
    result.cancelled += cancelled
    return cancelled


def _cancel(dialect: Dialect, job_id: int, upstream_id: int, count: int, now_ms: int) -> None:
    entry = {
        "attempt": 0,
        "at_ms": now_ms,
        "worker": "",
        "kind": "dependency",
        "type": "",
        "message": f"job {upstream_id}, which it waited for, ended without finishing",
        "traceback": "",
    }
    dialect.execute(
        f"UPDATE {JOB} SET status = 'cancelled', finished_ms = %s, cancelled_by = %s, deps_left = deps_left - %s,"
        " errors = %s WHERE id = %s AND status = 'waiting'",
        [now_ms, upstream_id, count, json.dumps([entry]), job_id],
    )


def revive(dialect: Dialect, upstream: Sequence[int], now_ms: int) -> list[int]:
    """``upstream`` jobs are waiting again (retried): their dependents wait for them again.

    Dependents cancelled because one of these failed come back (and theirs, down the graph);
    dependents still held back wait for the retried job again. A dependent that already ran,
    or was released to run anyway (``on_failure = 'run'``), is left as it is. Returns the ids
    of the jobs brought back. Runs in the caller's transaction.
    """
    revived: list[int] = []
    pending = list(upstream)
    while pending:
        marks = ", ".join(["%s"] * len(pending))
        rows = dialect.fetchall(
            f"SELECT d.id, j.id, j.status, j.deps_left, j.cancelled_by FROM {EDGES} d JOIN {JOB} j ON j.id = d.job_id"
            f" WHERE d.settled AND d.depends_on_id IN ({marks})",
            pending,
        )
        upstream_set = set(pending)
        pending = []
        reset: list[int] = []
        for edge_id, job_id, status, deps_left, cancelled_by in rows:
            if status == "cancelled" and cancelled_by in upstream_set:
                reset.append(edge_id)
                pending.append(job_id)
            elif status == "waiting" and (deps_left or 0) > 0:
                reset.append(edge_id)
                dialect.execute(f"UPDATE {JOB} SET deps_left = deps_left + 1 WHERE id = %s", [job_id])
        if reset:
            marks = ", ".join(["%s"] * len(reset))
            dialect.execute(f"UPDATE {EDGES} SET settled = FALSE WHERE id IN ({marks})", reset)
        for job_id in pending:
            left = dialect.fetchall(f"SELECT COUNT(*) FROM {EDGES} WHERE job_id = %s AND NOT settled", [job_id])[0][0]
            dialect.execute(
                f"UPDATE {JOB} SET status = 'waiting', finished_ms = NULL, cancelled_by = NULL, deps_left = %s,"
                " run_at_ms = %s WHERE id = %s AND status = 'cancelled'",
                [left, BLOCKED_MS if left else now_ms, job_id],
            )
        revived += pending
    return revived


def rewait(dialect: Dialect, retried: Sequence[int]) -> None:
    """Retried jobs wait again for the jobs of theirs that are waiting or running: due once those end.

    A retry makes a job due now; a job of a workflow cancelled before what it waits for ended
    (an operator's cancel), or retried together with it, must not run first. Its edges from
    jobs active again are counted anew, and ``deps_left`` is what is left uncounted. Runs after
    ``revive``, in the caller's transaction.
    """
    if not retried:
        return
    marks = ", ".join(["%s"] * len(retried))
    dialect.execute(
        f"UPDATE {EDGES} SET settled = FALSE WHERE settled AND job_id IN ({marks})"
        f" AND depends_on_id IN (SELECT id FROM {JOB} WHERE status IN ('waiting', 'running'))",
        list(retried),
    )
    dialect.execute(
        f"UPDATE {JOB} SET deps_left = (SELECT COUNT(*) FROM {EDGES} d WHERE d.job_id = {JOB}.id AND NOT d.settled)"
        f" WHERE id IN ({marks}) AND deps_left IS NOT NULL",
        list(retried),
    )
    dialect.execute(f"UPDATE {JOB} SET run_at_ms = %s WHERE id IN ({marks}) AND deps_left > 0", [BLOCKED_MS, *retried])
