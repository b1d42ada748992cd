"""What the admin shows as a job's state: its status, or what holds it back, with the reason in plain words.

A shown state is read, never written: a job's row says ``waiting`` or ``running``, and this module
says why nothing moves:

- **orphaned**: running, but no live worker holds it: its worker's presence lock was released,
  its row is gone, or its heartbeat is older than ``ops.LIVE_HEARTBEATS`` intervals (the judgement
  of ``ops.live_workers()``, which the Queues page and ``durq stats`` make too);
- **blocked**: waiting for its upstream jobs to end (a workflow's);
- **paused**: waiting in a queue an operator paused, with who, when and why;
- **held by a limit**: due, and its queue or its key is at its limit (``ops.limit_usage()``).

One :class:`StateReader` per page reads the live workers, the queues' switches and the limits of
the queues whose due jobs are on the page, once, after the jobs were read. A worker writes its row
before its first claim, so a job that a live worker holds is never shown orphaned; a worker that
ends between the two reads leaves its job shown running on that page.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Count

from .. import ops
from ..conf import get_settings
from ..handlers.limits import Rate
from ..models import Job, Status, WorkerProcess
from ..ops import format_age as age
from ..ops import local_time as when
from ..ops.reading import alias_of


@dataclass(frozen=True)
class ShownState:
    key: str  # the CSS class's suffix: durq-<key>
    label: str
    reason: str  # plain words, "" when there is nothing to add


def last_error(job: Job) -> str:
    """``Type: message`` of the job's last failed attempt, "" when none failed (or its history is unreadable)."""
    try:
        entry = job.last_error
    except ValueError:
        return ""
    if not isinstance(entry, dict):
        return ""
    prefix = f"{entry['type']}: " if entry.get("type") else ""
    return prefix + str(entry.get("message", ""))


class StateReader:
    """The states of the jobs on one page, from one read of what can hold them back."""

    def __init__(self, jobs: Iterable[Job], *, now_ms: int, using: str | None = None) -> None:
        jobs = list(jobs)
        alias = alias_of(using)
        self.now = now_ms
        self.live = {worker.worker_id: worker for worker in ops.live_workers(now_ms=now_ms, using=alias)}
        self.served = {queue for worker in self.live.values() for queue in ops.worker_queues(worker)}
        gone = {job.claimed_by for job in jobs if job.status == Status.RUNNING and job.claimed_by not in self.live}
        self.ended = {worker.worker_id: worker for worker in WorkerProcess.objects.using(alias).filter(worker_id__in=gone)}
        self.switches = ops.queue_switches(using=alias)
        settings = get_settings()
        limited = {
            job.queue
            for job in jobs
            if job.status == Status.WAITING
            and job.run_at_ms <= now_ms
            and job.queue not in self.paused_queues
            and (job.limit_key is not None or settings.queue(job.queue).limits.any)
        }
        self.usage = {
            usage.queue: usage for queue in sorted(limited) for usage in ops.limit_usage(queue=queue, now_ms=now_ms, using=alias)
        }

    @property
    def paused_queues(self) -> set[str]:
        return {queue for queue, switch in self.switches.items() if switch.paused}

    def of(self, job: Job) -> ShownState:
        if job.status == Status.RUNNING:
            return self._running(job)
        if job.status == Status.BLOCKED:
            count = job.deps_left or 0
            return ShownState("blocked", "Blocked", f"waiting for {count} upstream job{'s' if count != 1 else ''} to end")
        if job.status == Status.WAITING:
            return self._waiting(job)
        if job.status == Status.FINISHED:
            took = f"took {age(job.finished_ms - job.started_ms)}" if job.started_ms and job.finished_ms else ""
            return ShownState("finished", "Finished", took)
        if job.status == Status.DEAD:
            return ShownState("dead", "Dead", last_error(job))
        upstream = f"job #{job.cancelled_by}, which it waits for, failed" if job.cancelled_by is not None else ""
        return ShownState("cancelled", "Cancelled", upstream)

    def _running(self, job: Job) -> ShownState:
        stop = "; asked to stop" if job.stop_requested else ""
        if job.claimed_by in self.live:
            return ShownState("running", "Running", f"on {job.claimed_by}{stop}")
        row = self.ended.get(job.claimed_by)
        if not job.claimed_by:
            gone = "no worker holds it"
        elif row is None:
            gone = f"its worker {job.claimed_by} is gone (its row was removed)"
        elif row.holds_lock:
            gone = f"its worker {job.claimed_by} has ended (its presence lock is no longer held)"
        else:
            gone = f"its worker {job.claimed_by} was last seen {age(self.now - row.last_seen_ms)} ago"
        return ShownState("orphaned", "Orphaned", f"{gone}: nothing runs it; another worker takes it over")

    def _waiting(self, job: Job) -> ShownState:
        switch = self.switches.get(job.queue)
        if switch is not None and switch.paused:
            by = f" by {switch.by}" if switch.by else ""
            why = f": {switch.reason}" if switch.reason else ""
            return ShownState("paused", "Paused", f"queue “{job.queue}” paused{by}{why} (since {when(switch.at_ms)})")
        error = last_error(job)
        after = f" after {error}" if error and job.attempts else ""
        if job.run_at_ms > self.now:
            attempt = f"attempt {job.attempts + 1} of {job.max_attempts} " if job.attempts else ""
            return ShownState("waiting", "Waiting", f"{attempt}due in {age(job.run_at_ms - self.now)}{after}")
        held = self._held(job)
        if held:
            return ShownState("held", "Held by a limit", held)
        unserved = f"; no live worker serves queue “{job.queue}”" if job.queue not in self.served else ""
        due = "due now" if self.now - job.run_at_ms < 1_000 else f"due for {age(self.now - job.run_at_ms)}"
        return ShownState("waiting", "Waiting", f"{due}{unserved}{self._unlisted(job)}{after}")

    def _held(self, job: Job) -> str:
        """Why a due job's limit holds it back now, "" when none does."""
        usage = self.usage.get(job.queue)
        if usage is None:
            return ""
        if usage.max_running is not None and usage.running >= usage.max_running:
            return f"queue “{job.queue}” runs {usage.running} of at most {usage.max_running}"
        if usage.rate is not None and usage.started_in_window >= Rate.parse(usage.rate).count:
            return f"queue “{job.queue}” started {usage.started_in_window} jobs, at most {usage.rate}"
        for key in usage.keys:
            if key.key != job.limit_key:
                continue
            if key.max_running is not None and key.running >= key.max_running:
                return f"key “{key.key}” runs {key.running} of at most {key.max_running}"
            if key.rate is not None and key.period_ms is not None:
                return f"key “{key.key}” started {key.started_in_window} jobs, at most {Rate(key.rate, key.period_ms)}"
        return ""

    def _unlisted(self, job: Job) -> str:
        """``limit_usage`` names the fullest keys only: when the job's key may be among the others, say so."""
        usage = self.usage.get(job.queue)
        if job.limit_key is None or usage is None or usage.keys_at_limit <= len(usage.keys):
            return ""
        return f"; {usage.keys_at_limit} keys of queue “{job.queue}” are at their limits, its key may be one"


def orphans_by_queue(live: Iterable[str], *, using: str | None = None) -> dict[str, int]:
    """How many running jobs of each queue no live worker holds; ``live``: the live workers' ids.

    One grouped read of the running rows, which are at most the workers' slots.
    """
    alive = set(live)
    counts: dict[str, int] = {}
    running = Job.objects.using(alias_of(using)).filter(status=Status.RUNNING).order_by()
    for queue, worker_id, count in running.values_list("queue", "claimed_by").annotate(count=Count("id")):
        if worker_id not in alive:
            counts[queue] = counts.get(queue, 0) + count
    return counts
