"""After a retry, every job of the workflow that has not started counts again every edge it waits on.

A retry turns dead or cancelled jobs ``waiting`` again (``ops.retry``). In the same transaction
:func:`revive` re-counts, from scratch and under each job's row lock (see ``dependencies.py``),
every upstream edge of:

- the retried jobs themselves;
- each job that waits for one of them and has not started (``waiting`` or ``blocked``): a
  callback released to run anyway (``on_failure="run"``) waits for the retried job again;
- each job cancelled because one of them failed (``cancelled_by``), and so on down the graph.

Each of these then is what its count says, the same rule as for a job that was never retried:
``cancelled`` (``cancelled_by`` names the upstream) when a job it waits for ended dead or
cancelled and its ``on_failure`` is "cancel", else ``blocked`` while a job it waits for has not
ended, else ``waiting``, due at the later of its own due time and now. So a fan-in callback runs
only once every job it waits for finished (or, with "run", ended), whichever of them are retried
and in whatever order. A job that runs or has run (running, finished, dead) is left as it is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import wakeup
from .dependencies import EDGES, FAILED, cancel_dependent, chunks, lock_jobs, marks, settle
from .rows import JOB

if TYPE_CHECKING:
    from .base import Dialect

ACTIVE = ("waiting", "blocked", "running")
NOT_STARTED = ("waiting", "blocked")
_COLUMNS = "id, queue, status, deps_left, on_failure, cancelled_by"


@dataclass
class Revived:
    """What a revive did: jobs brought back from cancelled, and jobs left (or made) cancelled by an upstream that failed."""

    revived: list[int] = field(default_factory=list)
    cancelled: dict[int, int] = field(default_factory=dict)  # job -> the failed job it waits for


@dataclass
class _Count:
    deps_left: int  # jobs it waits for that have not ended
    cancelled_by: int | None  # a job it waits for that ended dead or cancelled, when its policy is "cancel"

    @property
    def status(self) -> str:
        if self.cancelled_by is not None:
            return "cancelled"
        return "blocked" if self.deps_left else "waiting"


def revive(dialect: Dialect, retried: Sequence[int], now_ms: int) -> Revived:
    """``retried`` jobs wait again (set ``waiting`` by the caller, their rows locked): count again what depends on them.

    Runs in the caller's transaction. Returns what came back and what stays cancelled.
    """
    result = Revived()
    if not retried:
        return result
    rows = {int(row[0]): row for chunk in chunks(sorted(retried)) for row in lock_jobs(dialect, chunk, _COLUMNS)}
    active = set(rows)
    frontier = sorted(rows)
    while frontier:
        dependents = {
            int(found[0])
            for chunk in chunks(frontier)
            for found in dialect.fetchall(f"SELECT DISTINCT job_id FROM {EDGES} WHERE depends_on_id IN ({marks(chunk)})", chunk)
        } - rows.keys()
        frontier = []
        for chunk in chunks(sorted(dependents)):
            # A dependent that runs or ran is left as it is: its row is not locked (its worker renews it).
            for row in lock_jobs(dialect, chunk, _COLUMNS, (*NOT_STARTED, "cancelled")):
                job_id, status, cancelled_by = int(row[0]), row[2], row[5]
                if status in NOT_STARTED:
                    rows[job_id] = row
                elif status == "cancelled" and cancelled_by in active:
                    rows[job_id] = row
                    active.add(job_id)
                    frontier.append(job_id)
        # A job cancelled by one found later in this round is found again from it in the next.
    _recount(dialect, rows, now_ms, result)
    return result


def _recount(dialect: Dialect, rows: dict[int, tuple[Any, ...]], now_ms: int, result: Revived) -> None:
    """Count every edge of these locked jobs again, in id order: a job's upstream is counted before it."""
    incoming: dict[int, list[tuple[int, int, bool, str]]] = defaultdict(list)
    for chunk in chunks(sorted(rows)):
        for edge_id, job_id, upstream_id, settled, status in dialect.fetchall(
            f"SELECT d.id, d.job_id, d.depends_on_id, d.settled, u.status FROM {EDGES} d"
            f" LEFT JOIN {JOB} u ON u.id = d.depends_on_id WHERE d.job_id IN ({marks(chunk)}) ORDER BY d.id",
            chunk,
        ):
            # An upstream that is gone was deleted once it finished (retention).
            incoming[int(job_id)].append((int(edge_id), int(upstream_id), bool(settled), status or "finished"))
    decided: dict[int, str] = {}
    counted: list[int] = []
    uncounted: list[int] = []
    counts: dict[int, _Count] = {}
    for job_id in sorted(rows):
        if job_id not in incoming:
            continue  # waits for nothing: a retried job outside a workflow, or a workflow's first job
        count = _count(incoming[job_id], decided, rows[job_id][4], counted, uncounted)
        decided[job_id] = count.status
        counts[job_id] = count
    for ids, settled in ((counted, True), (uncounted, False)):
        for chunk in chunks(ids):
            dialect.execute(f"UPDATE {EDGES} SET settled = %s WHERE id IN ({marks(chunk)})", [settled, *chunk])
    _write(dialect, rows, counts, now_ms, result)


def _count(
    edges: list[tuple[int, int, bool, str]],
    decided: dict[int, str],
    on_failure: str | None,
    counted: list[int],
    uncounted: list[int],
) -> _Count:
    """What a job is, given how each job it waits for stands now; notes the edges whose ``settled`` changes."""
    left = 0
    failed: int | None = None
    for edge_id, upstream_id, settled, status in edges:
        status = decided.get(upstream_id, status)
        if status in ACTIVE:
            left += 1
            if settled:
                uncounted.append(edge_id)
            continue
        if not settled:
            counted.append(edge_id)
        if status in FAILED and failed is None:
            failed = upstream_id
    return _Count(left, failed if on_failure != "run" else None)


def _write(dialect: Dialect, rows: dict[int, tuple[Any, ...]], counts: dict[int, _Count], now_ms: int, result: Revived) -> None:
    """Make each job what its count says; what it cancels, and what waits for those, is settled here too."""
    newly_cancelled: list[int] = []
    recounted: dict[int, list[int]] = defaultdict(list)  # deps_left -> jobs to set to it
    released: list[int] = []
    queues: set[str] = set()
    for job_id, count in counts.items():
        _, queue, status, deps_left, _, cancelled_by = rows[job_id]
        if count.cancelled_by is not None:
            result.cancelled[job_id] = count.cancelled_by
            if status != "cancelled":
                cancel_dependent(dialect, job_id, count.cancelled_by, count.deps_left, now_ms)
                newly_cancelled.append(job_id)
            elif cancelled_by != count.cancelled_by:
                dialect.execute(
                    f"UPDATE {JOB} SET cancelled_by = %s, deps_left = %s WHERE id = %s",
                    [count.cancelled_by, count.deps_left, job_id],
                )
            continue
        if status == "cancelled":
            result.revived.append(job_id)
        if count.deps_left:
            recounted[count.deps_left].append(job_id)
        elif status != "waiting":
            released.append(job_id)
            queues.add(queue)
        elif deps_left:
            recounted[0].append(job_id)  # a retried job waiting already: only its count is stale
    for deps_left, ids in recounted.items():
        for chunk in chunks(ids):
            dialect.execute(
                f"UPDATE {JOB} SET status = %s, deps_left = %s, finished_ms = NULL, cancelled_by = NULL"
                f" WHERE id IN ({marks(chunk)})",
                ["blocked" if deps_left else "waiting", deps_left, *chunk],
            )
    for chunk in chunks(released):
        dialect.execute(
            f"UPDATE {JOB} SET status = 'waiting', deps_left = 0, finished_ms = NULL, cancelled_by = NULL,"
            f" run_at_ms = {dialect.greatest}(run_at_ms, %s) WHERE id IN ({marks(chunk)})",
            [now_ms, *chunk],
        )
    if queues:
        wakeup.wake_on_commit(dialect.connection.alias, sorted(queues))
    # Jobs cancelled here have ended: what waits for them is counted in the same transaction.
    settle(dialect, now_ms, newly_cancelled)
    result.revived.sort()
