"""Workflows as an operator sees them: recent ones with their members counted, one with its jobs and edges,
and cancel and retry of a whole workflow.

A workflow's state is read from its members: ``running`` while one waits, is blocked or runs,
else ``finished`` when every member finished, ``failed`` when one ended dead (its dependents
cancelled with it, or run anyway), else ``cancelled`` (an operator cancelled members and none died).
Cancel and retry of a workflow are each one transaction (:func:`.acting.cancel_together`,
:func:`.acting.retry_together`), whatever its size: no member is released or started half-way
through, and the members' dependents are counted as when one job is cancelled or retried.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Max

from ..models import Dependency, Job, Status, Workflow
from .acting import CancelResult, RetryResult, cancel_together, retry_together
from .reading import alias_of, jobs_on, now_or

STATES = ("running", "finished", "failed", "cancelled")
MAX_LIMIT = 1000


class NoSuchWorkflow(LookupError):
    """The id names no workflow: it never existed, or it was pruned with its jobs."""

    def __init__(self, workflow_id: int) -> None:
        super().__init__(
            f"no workflow {workflow_id}: it never existed, or every job of it ended and it was pruned as a unit"
            " (KEEP_FINISHED, KEEP_DEAD)"
        )
        self.workflow_id = workflow_id


@dataclass
class WorkflowSummary:
    """One workflow: its members counted per status, and the state that makes."""

    id: int
    name: str
    created_ms: int
    on_failure: str
    counts: dict[str, int] = field(default_factory=dict)
    last_ended_ms: int | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def state(self) -> str:
        return workflow_state(self.counts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "created_ms": self.created_ms,
            "on_failure": self.on_failure,
            "state": self.state,
            "jobs": self.total,
            "counts": {status: self.counts.get(status, 0) for status in Status.values},
            "last_ended_ms": self.last_ended_ms,
        }


@dataclass(frozen=True)
class Edge:
    """Job ``job_id`` waits for job ``depends_on_id``; ``settled`` once that end was counted."""

    job_id: int
    depends_on_id: int
    settled: bool


@dataclass
class WorkflowDetail:
    """A workflow's members by id, the jobs outside it that members wait for, and every edge."""

    summary: WorkflowSummary
    jobs: list[Job]
    edges: list[Edge]
    external: list[Job] = field(default_factory=list)  # queued before the workflow, waited for by a member

    def upstream(self, job_id: int) -> list[int]:
        return [edge.depends_on_id for edge in self.edges if edge.job_id == job_id]

    def downstream(self, job_id: int) -> list[int]:
        return [edge.job_id for edge in self.edges if edge.depends_on_id == job_id]


def workflow_state(counts: dict[str, int]) -> str:
    """``running``, ``finished``, ``failed`` or ``cancelled`` from the members counted per status."""
    if counts.get(Status.WAITING, 0) or counts.get(Status.BLOCKED, 0) or counts.get(Status.RUNNING, 0):
        return "running"
    if counts.get(Status.DEAD, 0):
        return "failed"
    if counts.get(Status.CANCELLED, 0):
        return "cancelled"
    return "finished"


def workflows(limit: int = 50, *, before: int | None = None, using: str | None = None) -> list[WorkflowSummary]:
    """The most recent workflows, newest first (older than id ``before``), each with its members counted per status."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit is {limit!r}; it must be a whole number from 1 to {MAX_LIMIT}")
    alias = alias_of(using)
    rows = Workflow.objects.using(alias).order_by("-id")
    if before is not None:
        rows = rows.filter(pk__lt=before)
    summaries = {row.pk: _summary(row) for row in rows[:limit]}
    _count_members(summaries, alias)
    return list(summaries.values())


def workflow(workflow_id: int, *, using: str | None = None) -> WorkflowDetail:
    """One workflow: its members (by id), the edges between them and the jobs outside it they wait for."""
    alias = alias_of(using)
    row = _row(workflow_id, alias)
    summary = _summary(row)
    _count_members({row.pk: summary}, alias)
    members = list(jobs_on(alias).filter(workflow_id=row.pk).order_by("id"))
    ids = [job.pk for job in members]
    edges = [
        Edge(job_id, depends_on_id, settled)
        for job_id, depends_on_id, settled in Dependency.objects.using(alias)
        .filter(job_id__in=ids)
        .order_by("id")
        .values_list("job_id", "depends_on_id", "settled")
    ]
    outside = sorted({edge.depends_on_id for edge in edges} - set(ids))
    external = list(jobs_on(alias).filter(pk__in=outside).order_by("id")) if outside else []
    return WorkflowDetail(summary, members, edges, external)


def cancel_workflow(workflow_id: int, *, now_ms: int | None = None, using: str | None = None) -> CancelResult:
    """Cancel every waiting and blocked member and ask every running one to stop, in one transaction.

    The members are all cancelled before any of their ends is counted, so none is released to
    run anyway (``on_failure="run"``) by another's cancel, however many there are; a running
    member is recorded as cancelled when its handler returns.
    """
    alias = alias_of(using)
    row = _row(workflow_id, alias)
    active = jobs_on(alias).filter(workflow_id=row.pk).active()
    return cancel_together(active, now_or(now_ms), alias)


def retry_workflow(workflow_id: int, *, now_ms: int | None = None, using: str | None = None) -> RetryResult:
    """Retry the members that failed: the dead ones and those an operator cancelled.

    A member cancelled because a job it waited for failed (``cancelled_by``) comes back by the
    retry of that job, waiting for it again, as do the members waiting for it in turn. When that
    job is outside the workflow (queued before it), it is retried too. A member that stays
    cancelled is in ``skipped`` with the reason. One transaction: every member is counted again
    once all of them are back.
    """
    alias = alias_of(using)
    row = _row(workflow_id, alias)
    members = jobs_on(alias).filter(workflow_id=row.pk)
    failed = members.filter(status__in=(Status.DEAD, Status.CANCELLED))
    rows = list(failed.values_list("pk", "status", "cancelled_by"))
    member_ids = set(members.values_list("pk", flat=True))
    targets = [pk for pk, status, cancelled_by in rows if status == Status.DEAD or cancelled_by is None]
    targets += sorted({cancelled_by for _, _, cancelled_by in rows if cancelled_by is not None} - member_ids)
    result = retry_together(targets, now_or(now_ms), alias)
    still = members.filter(status=Status.CANCELLED, cancelled_by__isnull=False).values_list("pk", "cancelled_by")
    for pk, cancelled_by in still:
        result.skipped.setdefault(pk, f"it stays cancelled: job {cancelled_by}, which it waited for, was not retried")
    return result


def _row(workflow_id: int, alias: str) -> Workflow:
    if isinstance(workflow_id, bool) or not isinstance(workflow_id, int):
        raise TypeError(f"a workflow id is a whole number, not {type(workflow_id).__name__}")
    row = Workflow.objects.using(alias).filter(pk=workflow_id).first() if workflow_id > 0 else None
    if row is None:
        raise NoSuchWorkflow(workflow_id)
    return row


def _summary(row: Workflow) -> WorkflowSummary:
    return WorkflowSummary(row.pk, row.name, row.created_ms, row.on_failure)


def _count_members(summaries: dict[int, WorkflowSummary], alias: str) -> None:
    """Counts per status for these workflows in one grouped read of the workflow index."""
    if not summaries:
        return
    last: dict[int, list[int]] = defaultdict(list)
    counted = (
        Job.objects.using(alias)
        .filter(workflow_id__in=list(summaries))
        .values("workflow_id", "status")
        .annotate(n=Count("id"), last=Max("finished_ms"))
        .order_by()
    )
    for entry in counted:
        summary = summaries[entry["workflow_id"]]
        summary.counts[entry["status"]] = entry["n"]
        if entry["last"] is not None:
            last[summary.id].append(entry["last"])
    for workflow_id, ends in last.items():
        summaries[workflow_id].last_ended_ms = max(ends)
