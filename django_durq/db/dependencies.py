"""Counting the ends of jobs that other jobs wait for: release a dependent once nothing it waits for is left.

A job that waits (``blocked``) has ``deps_left``, the number of its edges (``durq_dependency``:
job ``job_id`` waits for ``depends_on_id``) not counted yet. An edge is counted once, when its
upstream job has ended: it is marked ``settled`` in the transaction that lowers its dependent's
``deps_left``, and the statement that counts the last edge also turns the dependent ``waiting``,
due at the later of its own due time and the release. No claim takes a blocked job, so nothing
else can start it.

**Counting under a lock.** Whoever changes a dependent's count or the ``settled`` flags of its
edges (this module, and ``revival.py`` after a retry) first locks the dependent's row, then reads
its edges and the state of the jobs it waits for, each in a statement of its own that sees every
transaction committed before it (PostgreSQL, and MariaDB at READ COMMITTED, Django's default;
SQLite lets one writer at a time). Two counters of one dependent therefore take turns and each
sees what the other left: a fan-in callback is released exactly once, however many workers end
its members at once, and a retry racing an end never leaves a count that no edge will lower.
Dependents are locked in id order, and a dependent's id is always above those of the jobs it
waits for (it was queued after them), so a settler walking down a graph locks downwards; should
two counters walking crossing parts of a graph still deadlock, the database rolls one back and
``Store.retrying`` runs it again.

A dependent whose upstream ended dead or cancelled is cancelled too (``cancelled_by`` names the
upstream), and so on down the graph, in the same transaction, unless it says
``on_failure = 'run'``: then the failure counts as an end like any other.

The worker that ends a job with dependents settles its edges right after its own commit, and an
operator's cancel in its own transaction; the maintenance sweep settles whatever that missed (a
crash between the two, a job ended by a script), so a dependent waits at most a sweep interval
longer, never forever.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import transaction

from . import counters, wakeup
from .rows import JOB

if TYPE_CHECKING:
    from .base import Dialect

EDGES = "durq_dependency"
# Edges (and upstream ids) taken per round; a settle goes round until none is left.
BATCH = 500
ENDED = ("finished", "dead", "cancelled")
FAILED = ("dead", "cancelled")
_ENDED_SQL = "(u.id IS NULL OR u.status IN ('finished', 'dead', 'cancelled'))"


@dataclass
class Settled:
    """What a settle did: edges counted, jobs released (now due) and jobs cancelled with their upstream."""

    edges: int = 0
    released: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)


def settle(dialect: Dialect, now_ms: int, upstream: Sequence[int] | None = None) -> Settled:
    """Count the ends of ``upstream`` jobs (every ended job when None) for the jobs waiting on them.

    One transaction (the caller's, if one is open). Dependents cancelled here have ended too:
    their own dependents are counted in the same transaction, down the graph.
    """
    result = Settled()
    if upstream is not None and not upstream:
        return result  # nothing ended (a cancel that only asked running jobs to stop): no "IN ()" to send
    with transaction.atomic(using=dialect.connection.alias):
        if upstream is None:
            _sweep(dialect, now_ms, result)
            return result
        pending = list(upstream)
        while pending:
            cancelled_before = len(result.cancelled)
            for chunk in chunks(pending):
                _count_ends_of(dialect, now_ms, chunk, result)
            pending = result.cancelled[cancelled_before:]
    return result


def chunks(ids: Sequence[int], size: int = BATCH) -> Iterator[list[int]]:
    for start in range(0, len(ids), size):
        yield list(ids[start : start + size])


def marks(values: Sequence[object]) -> str:
    return ", ".join(["%s"] * len(values))


def uncounted_ends(dialect: Dialect) -> tuple[bool, bool]:
    """Whether some edge is not counted yet (a workflow is in flight), and whether some job's end is
    still to be counted: one read, so that an idle sweep takes no write lock."""
    row = dialect.fetchall(
        f"SELECT EXISTS (SELECT 1 FROM {EDGES} WHERE NOT settled),"
        f" EXISTS (SELECT 1 FROM {EDGES} d LEFT JOIN {JOB} u ON u.id = d.depends_on_id WHERE NOT d.settled AND {_ENDED_SQL})"
    )[0]
    return bool(row[0]), bool(row[1])


def lock_jobs(dialect: Dialect, ids: Sequence[int], columns: str, statuses: Sequence[str] = ()) -> list[tuple[Any, ...]]:
    """Lock these jobs' rows (those in ``statuses``, when given), in id order; rows of ``columns`` as they are now."""
    where = f"id IN ({marks(ids)})" + (f" AND status IN ({marks(statuses)})" if statuses else "")
    return dialect.fetchall(
        f"SELECT {columns} FROM {JOB} WHERE {where} ORDER BY id {dialect.row_lock}", [*sorted(ids), *statuses]
    )


def _count_ends_of(dialect: Dialect, now_ms: int, upstream: list[int], result: Settled) -> None:
    """Count the ends of these jobs: lock the jobs that wait for them, then take the edges still uncounted."""
    dependents = dialect.fetchall(
        f"SELECT id, queue, status, deps_left, on_failure FROM {JOB} WHERE id IN (SELECT job_id FROM {EDGES}"
        f" WHERE depends_on_id IN ({marks(upstream)}) AND NOT settled) ORDER BY id {dialect.row_lock}",
        upstream,
    )
    if dependents:
        locked = {row[0] for row in dependents}
        edges = _take_edges(dialect, f"d.depends_on_id IN ({marks(upstream)})", upstream, locked)
        result.edges += len(edges)
        _apply(dialect, edges, dependents, now_ms, result)


def _sweep(dialect: Dialect, now_ms: int, result: Settled) -> None:
    """Count every end not counted yet, in rounds of edges, until none is left (the cancels it makes included)."""
    while True:
        # Which dependents have an edge to count: a read without locks, done again under them.
        found = dialect.fetchall(
            f"SELECT d.id, d.job_id FROM {EDGES} d LEFT JOIN {JOB} u ON u.id = d.depends_on_id"
            f" WHERE NOT d.settled AND {_ENDED_SQL} ORDER BY d.id LIMIT {BATCH}"
        )
        if not found:
            return
        dependents = lock_jobs(dialect, sorted({job_id for _, job_id in found}), "id, queue, status, deps_left, on_failure")
        edge_ids = [edge_id for edge_id, _ in found]
        edges = _take_edges(dialect, f"d.id IN ({marks(edge_ids)})", edge_ids, {row[0] for row in dependents})
        if not edges:
            return  # counted by another settler meanwhile; anything left is the next sweep's
        result.edges += len(edges)
        _apply(dialect, edges, dependents, now_ms, result)


def _take_edges(dialect: Dialect, where: str, params: list[int], locked: set[int]) -> list[tuple[int, int, int, str]]:
    """The edges ``where`` says that are still uncounted, with their upstream ended and their dependent
    ``locked``, marked counted: (edge, job, upstream, how it ended).

    Read under the dependents' locks, so an edge another settler counted meanwhile is not taken
    again. The upstream jobs are never locked: a lock on an upstream row would wait for a retry
    of that job, which itself waits for the dependent's lock.
    """
    rows = [
        row
        for row in dialect.fetchall(
            f"SELECT d.id, d.job_id, d.depends_on_id, u.status FROM {EDGES} d LEFT JOIN {JOB} u ON u.id = d.depends_on_id"
            f" WHERE {where} AND NOT d.settled AND {_ENDED_SQL} ORDER BY d.id {dialect.edge_lock}",
            params,
        )
        if row[1] in locked
    ]
    if not rows:
        return []
    dialect.execute(f"UPDATE {EDGES} SET settled = TRUE WHERE id IN ({marks(rows)})", [row[0] for row in rows])
    # An upstream that is gone was deleted once it finished (KEEP_FINISHED = 0 for a job that
    # gained dependents after its claim): its end counts as finished.
    return [(row[0], row[1], row[2], row[3] or "finished") for row in rows]


def _apply(
    dialect: Dialect,
    edges: list[tuple[int, int, int, str]],
    dependents: list[tuple[Any, ...]],
    now_ms: int,
    result: Settled,
) -> None:
    """Lower the counts of the blocked dependents of these edges; cancel or release those it decides."""
    ended: dict[int, int] = defaultdict(int)  # dependent -> upstream ends counted now
    failed: dict[int, int] = {}  # dependent -> an upstream that ended dead or cancelled
    for _, job_id, upstream_id, status in edges:
        ended[job_id] += 1
        if status in FAILED:
            failed.setdefault(job_id, upstream_id)
    released_queues: set[str] = set()
    lowered: dict[int, list[int]] = defaultdict(list)  # edges counted now -> dependents still blocked after
    released: dict[int, list[int]] = defaultdict(list)  # edges counted now -> dependents whose last edge they are
    for job_id, queue, status, deps_left, on_failure in dependents:
        if status != "blocked" or job_id not in ended:
            continue  # it ended or runs already: the edge is counted, nothing waits on it
        left = int(deps_left or 0)
        count = min(ended[job_id], left)
        if job_id in failed and on_failure != "run":
            cancel_dependent(dialect, job_id, failed[job_id], left - count, now_ms)
            result.cancelled.append(job_id)
        elif count == left:
            released[count].append(job_id)
            result.released.append(job_id)
            released_queues.add(queue)
        elif count:
            lowered[count].append(job_id)
    for count, ids in lowered.items():
        dialect.execute(f"UPDATE {JOB} SET deps_left = deps_left - %s WHERE id IN ({marks(ids)})", [count, *ids])
    for count, ids in released.items():
        # The statement that counts a job's last edge releases it: due at the later of its own due time and now.
        dialect.execute(
            f"UPDATE {JOB} SET status = 'waiting', run_at_ms = {dialect.greatest}(run_at_ms, %s), deps_left = deps_left - %s"
            f" WHERE id IN ({marks(ids)})",
            [now_ms, count, *ids],
        )
    if released_queues:
        wakeup.wake_on_commit(dialect.connection.alias, sorted(released_queues))


def cancel_dependent(dialect: Dialect, job_id: int, upstream_id: int, deps_left: int, now_ms: int) -> None:
    """Cancel a job that has not started because ``upstream_id``, which it waits for, ended without finishing."""
    entry = {
        "attempt": 0,
        "at_ms": now_ms,
        "worker": "",
        "kind": "dependency",
        "type": "",
        "message": f"job {upstream_id}, which it waited for, ended without finishing",
        "traceback": "",
    }
    errors, queue, name = dialect.fetchall(f"SELECT errors, queue, name FROM {JOB} WHERE id = %s", [job_id])[0]
    history = [*json.loads(errors or "[]"), entry]
    dialect.execute(
        f"UPDATE {JOB} SET status = 'cancelled', finished_ms = %s, cancelled_by = %s, deps_left = %s, errors = %s WHERE id = %s",
        [now_ms, upstream_id, deps_left, json.dumps(history), job_id],
    )
    counters.add(dialect, [(queue, name, counters.CANCELLED, 1)])
