"""Promises about each job, judged from the ledger, the final rows and the operator's actions.

- ``one_execution_at_a_time``: two executions of one job overlap only when the earlier one's
  lease may truly have expired (its process stopped or unable to renew) or it had timed out;
- ``ran_once``: a job's handler runs to completion once, unless the run before was cut off (its
  process killed before the completion committed, its lease lapsed, its timeout passed) or an
  operator retried the job in between; a fan-in callback is such a job;
- ``cancel_is_final``: a job an operator cancelled while it waited never starts again, and one
  asked to stop while it ran ends cancelled (unless its handler had returned before the cancel
  committed), until an operator retries it;
- ``nothing_lost``: every job the test queued has its row, and a finished one the execution that
  finished it; no execution belongs to a job the test did not queue;
- ``nothing_stuck``: once the faults are over the queue becomes quiet: no job waits or runs but
  those a rate longer than the scenario rightly holds;
- ``workers_survive``: a worker process ends only when the test kills it.
"""

from __future__ import annotations

import itertools

from .driver import held_by_long_windows
from .history import CLOCK_TOLERANCE_MS, RETRIES, History, SpanRow, Violation

TERMINAL = ("finished", "dead", "cancelled")


def check_executions(history: History) -> list[Violation]:
    found = []
    for job_id, spans in history.by_job.items():
        timeout = history.jobs[job_id].timeout_ms if job_id in history.jobs else None
        for index, later in enumerate(spans):
            for earlier in spans[:index]:
                if not history.running_at(earlier, later.start):
                    continue
                # The attempt with the older token is the one whose lease must have gone first.
                old, new = sorted((earlier, later), key=lambda span: span.token)
                if history.lapsed(old, new.claimed) or (timeout and new.claimed >= old.start + timeout):
                    continue
                message = (
                    f"job {job_id}: attempt {later.attempt} (token {later.token}) started at {history.t(later.start)} while"
                    f" attempt {earlier.attempt} (token {earlier.token}) still ran; the older one's lease had not lapsed"
                    " nor its timeout passed when the newer was claimed"
                )
                found.append(Violation("one_execution_at_a_time", message, [job_id], [earlier, later]))
        done = sorted((span for span in spans if span.outcome == "done"), key=lambda span: span.token)
        for before, after in itertools.pairwise(done):
            if not _cut_off(history, job_id, before, after, timeout):
                message = (
                    f"job {job_id} ran to completion twice (attempts {before.attempt} and {after.attempt}), the first"
                    " neither cut off nor retried by an operator"
                )
                found.append(Violation("ran_once", message, [job_id], [before, after]))
    return found


def _cut_off(history: History, job_id: int, before: SpanRow, after: SpanRow, timeout: int | None) -> bool:
    ended = history.end(before) or before.start
    killed = history.record.deaths.get(before.pid)
    if killed is not None and killed >= ended:
        return True  # its process died before the completion could commit
    # Its lease may have lapsed while its completion waited to commit (and another claim, seen in
    # the ledger or not, took the job over): the completion was fenced off.
    if history.lapsed_between(before, ended, after.claimed) or (timeout and ended - before.start >= timeout):
        return True
    return _retried(history, job_id, ended, after.claimed)


def _retried(history: History, job_id: int, began: float, ended: float) -> bool:
    return any(
        action.op.kind in RETRIES
        and job_id in action.result.get("retried", [])
        and began < action.ended_ms
        and action.began_ms < ended
        for action in history.record.actions
    )


def check_cancels(history: History) -> list[Violation]:
    found = []
    for action in history.record.actions:
        if action.op.kind not in ("cancel_job", "cancel_workflow"):
            continue
        after = action.ended_ms + CLOCK_TOLERANCE_MS
        for job_id in action.result.get("cancelled", []):
            late = [
                s
                for s in history.by_job.get(job_id, [])
                if s.claimed > after and not _retried(history, job_id, action.began_ms, s.claimed)
            ]
            if late:
                message = (
                    f"job {job_id} was cancelled at {history.t(action.ended_ms)} while it waited,"
                    f" yet claimed at {history.t(late[0].claimed)}"
                )
                found.append(Violation("cancel_is_final", message, [job_id], late))
        for job_id in action.result.get("stopping", []):
            job = history.jobs.get(job_id)
            if job is None or job.status == "cancelled" or _retried(history, job_id, action.began_ms, history.record.quiet_ms):
                continue
            ending = [s for s in history.by_job.get(job_id, []) if s.token == job.claim_token]
            ended = max((history.end(s) or 0.0 for s in ending), default=0.0)
            if ended > after:
                message = (
                    f"job {job_id} was asked to stop at {history.t(action.ended_ms)} while it ran; its handler returned at"
                    f" {history.t(ended)}, yet it ended {job.status}"
                )
                found.append(Violation("cancel_is_final", message, [job_id], ending))
    return found


def check_lost(history: History) -> list[Violation]:
    found = []
    for job_id in sorted(history.record.acked):
        job = history.jobs.get(job_id)
        if job is None:
            found.append(Violation("nothing_lost", f"job {job_id} was queued but its row is gone", [job_id]))
        elif job.status == "finished" and history.finishing_span(job_id) is None:
            final = [span for span in history.by_job.get(job_id, []) if span.token == job.claim_token]
            how = f"it {final[-1].outcome or 'never returned'}" if final else "none ran"
            message = f"job {job_id} is finished, but no execution under its final token {job.claim_token} did its work ({how})"
            found.append(Violation("nothing_lost", message, [job_id], history.by_job.get(job_id, [])))
    strangers = sorted(set(history.by_job) - set(history.record.acked))
    if strangers:
        spans = [span for job_id in strangers for span in history.by_job[job_id]]
        found.append(Violation("nothing_lost", f"executions of jobs the test never queued: {strangers}", strangers, spans))
    return found


def check_stuck(history: History) -> list[Violation]:
    active = [
        (job.id, job.status, job.attempts, job.run_at_ms, job.limit_key, job.limit_rate, job.limit_period_ms)
        for job in history.jobs.values()
        if job.status not in TERMINAL
    ]
    held = held_by_long_windows(active, history.record.quiet_ms)
    stuck = sorted(row[0] for row in active if row[0] not in held)
    if not stuck:
        return []
    message = (
        f"{len(stuck)} jobs still active once the queue had nothing left to do"
        f" ({'gave up waiting' if not history.record.quiet else 'quiet'} at {history.t(history.record.quiet_ms)})"
    )
    spans = [span for job_id in stuck for span in history.by_job.get(job_id, [])]
    return [Violation("nothing_stuck", message, stuck, spans)]


def check_exits(history: History) -> list[Violation]:
    found = []
    for pid, code in sorted(history.record.exits.items()):
        spans = [span for span in history.spans if span.pid == pid and span.end_us is None]
        message = f"worker pid {pid} (slot {history.record.slots.get(pid)}) exited by itself with code {code}; see its log"
        found.append(Violation("workers_survive", message, sorted({span.job_id for span in spans}), spans))
    return found
