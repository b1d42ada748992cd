"""Workflow promises judged from the ledger, the final rows and the operator's actions.

The edges are the scenario's own (each member's ``after``, steps and jobs queued before), never
read back from the queue's tables.

- ``upstream_first``: a member whose failure policy is ``cancel`` starts only after every job it
  waits for finished: the execution that finished it returned before the member's handler
  started. One whose policy is ``run`` starts only after each of them ended somehow (returned,
  died, or was cancelled by an operator or with its own upstream).
- ``cancelled_although_upstream_finished``: a ``cancel`` member that no operator cancelled ends
  cancelled only when a job it waits for did not finish.
- ``cancel_releases_nothing``: a workflow's cancel cancels its waiting members in one go: a member
  that waited for a job this cancel cancelled never starts afterwards (until a retry).
"""

from __future__ import annotations

from collections.abc import Iterator

from .history import CLOCK_TOLERANCE_MS, RETRIES, History, Violation


def edges(history: History) -> Iterator[tuple[int, int, str, str]]:
    """(member id, upstream id, member's failure policy, workflow name) for every edge of every workflow queued."""
    ids = history.record.ids
    for flow in history.scenario.flows:
        if flow.name not in history.record.flows:
            continue
        for member in flow.members:
            policy = member.on_failure or flow.on_failure
            upstream = [flow.members[i].job.tag for i in member.after] + list(member.external)
            for tag in upstream:
                if member.job.tag in ids and tag in ids:
                    yield ids[member.job.tag], ids[tag], policy, flow.name


def check_order(history: History) -> list[Violation]:
    found = []
    for member, upstream, policy, _ in edges(history):
        spans = history.by_job.get(member, [])
        if policy == "cancel":
            finishing = history.finishing_span(upstream)
            finished_at = history.end(finishing) if finishing is not None else None
            for span in spans:
                if finished_at is None or span.start < finished_at:
                    state = history.jobs[upstream].status if upstream in history.jobs else "gone"
                    if finished_at is not None:
                        how = f"finished at {history.t(finished_at)}"
                    elif state == "finished":
                        how = "ended finished without an execution that did its work"
                    else:
                        how = f"never finished ({state})"
                    message = f"job {member} started at {history.t(span.start)} but job {upstream}, which it waits for, {how}"
                    shown = [span, *([finishing] if finishing is not None else [])]
                    found.append(Violation("upstream_first", message, [member, upstream], shown))
                    break
        else:
            ends = _end_events(history, upstream, set())
            for span in spans:
                if not any(at <= span.start + CLOCK_TOLERANCE_MS for at in ends):
                    message = (
                        f"job {member} (on_failure run) started at {history.t(span.start)} before job {upstream},"
                        " which it waits for, had ended in any way"
                    )
                    found.append(
                        Violation("upstream_first", message, [member, upstream], [span, *history.by_job.get(upstream, [])])
                    )
                    break
    found += _wrongly_cancelled(history)
    return found


def _end_events(history: History, job_id: int, seen: set[int]) -> list[float]:
    """Every moment at which ``job_id`` may have ended: a return, its process killed, a cancel of it or of what it waited for."""
    if job_id in seen:
        return []
    seen.add(job_id)
    found = []
    for span in history.by_job.get(job_id, []):
        end = history.end(span)
        if end is not None:
            found.append(end)
    for action in history.record.actions:
        if job_id in action.result.get("cancelled", []) or job_id in action.result.get("stopping", []):
            found.append(action.began_ms)
    job = history.jobs.get(job_id)
    if job is not None and job.finished_ms is not None and job.status in ("dead", "cancelled"):
        found.append(float(job.finished_ms))
    for member, upstream, _, _ in edges(history):
        if member == job_id:
            found += _end_events(history, upstream, seen)  # cancelled with its own upstream
    return found


def _wrongly_cancelled(history: History) -> list[Violation]:
    by_member: dict[int, list[int]] = {}
    policies: dict[int, str] = {}
    for member, upstream, policy, _ in edges(history):
        by_member.setdefault(member, []).append(upstream)
        policies[member] = policy
    asked = {
        job_id for action in history.record.actions for key in ("cancelled", "stopping") for job_id in action.result.get(key, [])
    }
    found = []
    for member, waited_for in by_member.items():
        job = history.jobs.get(member)
        if job is None or job.status != "cancelled" or member in asked or policies[member] != "cancel":
            continue
        if all(history.jobs.get(u) is not None and history.jobs[u].status == "finished" for u in waited_for):
            message = (
                f"job {member} ended cancelled though every job it waits for finished ({waited_for}) and no operator cancelled it"
            )
            found.append(Violation("cancelled_although_upstream_finished", message, [member, *waited_for]))
    return found


def check_cancel(history: History) -> list[Violation]:
    found = []
    for action in history.record.actions:
        if action.op.kind != "cancel_workflow":
            continue
        cancelled = set(action.result.get("cancelled", []))
        for member, upstream, _, flow in edges(history):
            if flow != action.op.target or upstream not in cancelled:
                continue
            for span in history.by_job.get(member, []):
                if span.claimed > action.began_ms and not _retried_between(history, flow, action.began_ms, span.claimed):
                    message = (
                        f"workflow {flow} cancelled from {history.t(action.began_ms)} to {history.t(action.ended_ms)};"
                        f" job {member} waited for job {upstream}, which that cancel cancelled, yet was claimed at"
                        f" {history.t(span.claimed)} and started"
                    )
                    found.append(Violation("cancel_releases_nothing", message, [member, upstream], [span]))
                    break
    return found


def _retried_between(history: History, flow: str, began: float, ended: float) -> bool:
    members = {history.record.ids.get(m.job.tag) for f in history.scenario.flows if f.name == flow for m in f.members}
    for action in history.record.actions:
        touched = action.op.target == flow or members & set(action.result.get("retried", []))
        if action.op.kind in RETRIES and began < action.began_ms < ended and touched:
            return True
    return False
