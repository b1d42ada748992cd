"""What happened in one scenario: the ledger's spans, the final job rows, and the driver's record, on one clock.

Times are epoch milliseconds on the host's wall clock, which the workers, the test process and
the database server on this host share. A span's end is its own when the handler returned; the
moment its process was killed when it never returned; ``None`` while it still runs.

The checks (``flow_checks``, ``workflow_checks``, ``job_checks``) are plain functions of a
:class:`History`, which :func:`load` reads once the queue is quiet.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .driver import Blackout, Record
from .spec import Scenario

LEASE_MS = 2_000
HEARTBEAT_MS = 500
# How late a renewal may come on top of the heartbeat (stalls at the race points, up to 150 ms,
# several in a row, and a busy database), where no reading of the handler's tells.
RENEWAL_SLACK_MS = 300
# Claim times are written by different processes, each reading the queue's clock: they agree
# to within a round trip to the database.
CLOCK_TOLERANCE_MS = 5
# The operator actions that bring a dead or cancelled job back.
RETRIES = ("retry_job", "retry_cause", "retry_workflow")


@dataclass(frozen=True)
class SpanRow:
    id: int
    job_id: int
    token: int
    attempt: int
    pid: int
    queue: str
    key: str
    limit_running: int | None
    limit_rate: int | None
    limit_period_ms: int | None
    claim_ms: int | None
    start_us: int
    end_us: int | None
    outcome: str
    tag: str
    confirmed: str = ""  # the handler's "seen:until" readings of its lease (tests/ledger/models.py)

    @property
    def confirmations(self) -> list[tuple[int, int]]:
        """(when the handler looked, until when its lease was confirmed then), in epoch ms, in order."""
        return [(int(seen), int(until)) for seen, until in (pair.split(":") for pair in self.confirmed.split(",") if pair)]

    @property
    def start(self) -> float:
        return self.start_us / 1000

    @property
    def claimed(self) -> float:
        """When the claim that started it committed (its start when the row had moved on)."""
        return float(self.claim_ms) if self.claim_ms is not None else self.start


@dataclass(frozen=True)
class JobRow:
    id: int
    name: str
    queue: str
    status: str
    attempts: int
    max_attempts: int
    claim_token: int
    finished_ms: int | None
    timeout_ms: int | None
    cancelled_by: int | None
    run_at_ms: int
    limit_key: str | None
    limit_rate: int | None
    limit_period_ms: int | None
    errors: tuple[dict[str, Any], ...]


@dataclass
class History:
    scenario: Scenario
    record: Record
    spans: list[SpanRow]
    jobs: dict[int, JobRow]
    queue_limits: dict[str, tuple[int | None, tuple[int, int] | None]]  # queue -> (max_running, (count, period_ms))
    by_job: dict[int, list[SpanRow]] = field(default_factory=dict)
    blackouts: dict[int, list[Blackout]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        grouped: dict[int, list[SpanRow]] = defaultdict(list)
        for span in sorted(self.spans, key=lambda s: (s.start_us, s.id)):
            grouped[span.job_id].append(span)
        self.by_job = dict(grouped)
        outages: dict[int, list[Blackout]] = defaultdict(list)
        for blackout in self.record.blackouts:
            outages[blackout.pid].append(blackout)
        self.blackouts = dict(outages)

    def end(self, span: SpanRow) -> float | None:
        """When the handler stopped running: it returned, or its process was killed; None while it runs."""
        if span.end_us is not None:
            return span.end_us / 1000
        return self.record.deaths.get(span.pid)

    def running_at(self, span: SpanRow, at_ms: float) -> bool:
        end = self.end(span)
        return span.start <= at_ms and (end is None or at_ms < end)

    def lapsed(self, span: SpanRow, at_ms: float) -> bool:
        """Whether the lease of ``span``'s attempt may truly have expired by ``at_ms``, and not been renewed since.

        Only a blackout of its process makes that possible: stopped, or its renewals blocked.
        """
        return self.lapsed_between(span, at_ms, at_ms)

    def lapsed_between(self, span: SpanRow, after_ms: float, before_ms: float) -> bool:
        """Whether the lease of ``span``'s attempt may truly have expired at some moment from ``after_ms`` to ``before_ms``.

        Where the handler ran before a blackout began, its readings of the lease say when it was
        held: each confirmed it from the claim's or renewal's time until that time + the lease, and
        the database then held it at least as long. The lease may have lapsed where no reading
        covers, from the end of the cover the blackout began in until a reading covers again (none:
        it never came back), and only if that lapse began no later than a renewal could follow the
        blackout's end: a lease that ran out while its process ran is no blackout's doing.

        A handler that started after the blackout saw nothing of it: its lease was renewed at the
        latest a heartbeat (plus slack) before the blackout began, or at its claim if that came
        later, and is confirmed again a heartbeat (plus slack) after the blackout ends.
        """
        # A span without its claim time was taken over before its handler read the row: claimed earlier.
        claimed = float(span.claim_ms) if span.claim_ms is not None else float("-inf")
        for blackout in self.blackouts.get(span.pid, []):
            if any(looked < blackout.began_ms for looked, _ in span.confirmations):
                lapse = _lapse(span, blackout)
                if lapse is None:
                    continue
                expired, confirmed = lapse
            else:
                renewed = max(blackout.began_ms - HEARTBEAT_MS - RENEWAL_SLACK_MS, claimed)
                expired = renewed + LEASE_MS - CLOCK_TOLERANCE_MS
                confirmed = blackout.ended_ms + HEARTBEAT_MS + 2 * RENEWAL_SLACK_MS
            if expired <= before_ms and after_ms <= confirmed:
                return True
        return False

    def finishing_span(self, job_id: int) -> SpanRow | None:
        """The execution whose completion made the job finished: its final attempt's."""
        job = self.jobs.get(job_id)
        if job is None or job.status != "finished":
            return None
        return next((s for s in self.by_job.get(job_id, []) if s.token == job.claim_token and s.outcome == "done"), None)

    def tag(self, job_id: int) -> str:
        return self.record.acked.get(job_id, "?")

    def t(self, at_ms: float | None) -> str:
        """A time as seconds since the scenario started, as failure messages show it."""
        return "-" if at_ms is None else f"{(at_ms - self.record.started_ms) / 1000:+.3f}s"

    def show(self, span: SpanRow) -> str:
        end = self.end(span)
        how = span.outcome or ("killed" if span.pid in self.record.deaths else "running")
        limits = f" limit {span.limit_running}" if span.limit_running else ""
        limits += f" rate {span.limit_rate}/{span.limit_period_ms}ms" if span.limit_rate else ""
        return (
            f"span #{span.id} job {span.job_id} ({span.tag}) attempt {span.attempt} token {span.token} pid {span.pid}"
            f" queue {span.queue} key {span.key or '-'}{limits}: claimed {self.t(span.claim_ms)}"
            f" started {self.t(span.start)} ended {self.t(end)} {how}"
        )

    def show_job(self, job_id: int) -> str:
        job = self.jobs.get(job_id)
        if job is None:
            return f"job {job_id} ({self.tag(job_id)}): no row"
        return (
            f"job {job_id} ({self.tag(job_id)}) {job.name} queue {job.queue}: {job.status}, attempt {job.attempts}/"
            f"{job.max_attempts}, token {job.claim_token}, ended {self.t(job.finished_ms)}, cancelled_by {job.cancelled_by}"
        )


def _lapse(span: SpanRow, blackout: Blackout) -> tuple[float, float] | None:
    """From when to when ``span``'s lease may have been out because of ``blackout``, by its handler's
    readings; None when a reading covers the whole blackout or the lease ran out while its process ran.
    """
    held = sorted((until - LEASE_MS, until) for _, until in span.confirmations)
    lapsed_at: float | None = None
    for confirmed_from, until in held:
        if lapsed_at is None:
            if confirmed_from <= blackout.began_ms <= until:
                lapsed_at = until  # the cover the blackout began in ends here, unless a later reading extends it
        elif confirmed_from <= lapsed_at:
            lapsed_at = max(lapsed_at, until)
        else:
            break  # the cover stopped at lapsed_at; this reading confirmed the lease again
    if lapsed_at is None or lapsed_at > blackout.ended_ms + HEARTBEAT_MS + 2 * RENEWAL_SLACK_MS:
        return None
    again = [confirmed_from for confirmed_from, _ in held if confirmed_from > lapsed_at]
    return lapsed_at - CLOCK_TOLERANCE_MS, (min(again) if again else float("inf")) + CLOCK_TOLERANCE_MS


def load(scenario: Scenario, record: Record) -> History:
    from django_durq.conf import get_settings
    from django_durq.models import Job
    from tests.ledger.models import Span

    columns = [f.name for f in SpanRow.__dataclass_fields__.values()]  # type: ignore[attr-defined]
    spans = [SpanRow(*row) for row in Span.objects.order_by("id").values_list(*columns)]
    rows = Job.objects.filter(pk__in=list(record.acked)).values_list(
        "pk",
        "name",
        "queue",
        "status",
        "attempts",
        "max_attempts",
        "claim_token",
        "finished_ms",
        "timeout_ms",
        "cancelled_by",
        *("run_at_ms", "limit_key", "limit_rate", "limit_period_ms", "errors"),
    )
    jobs = {row[0]: JobRow(*row[:-1], errors=tuple(json.loads(row[-1] or "[]"))) for row in rows}  # type: ignore[misc]
    settings = get_settings()
    limits = {}
    for queue in {span.queue for span in spans} | {"video", "webhooks"}:
        own = settings.queue(queue).limits
        limits[queue] = (own.max_running, (own.rate.count, own.rate.period_ms) if own.rate else None)
    return History(scenario, record, spans, jobs, limits)


@dataclass
class Violation:
    """A broken promise: which invariant, what was seen, the jobs and the ledger rows that show it."""

    invariant: str
    message: str
    jobs: list[int]
    spans: list[SpanRow] = field(default_factory=list)

    def lines(self, history: History) -> list[str]:
        jobs = ", ".join(map(str, self.jobs[:12])) + (", …" if len(self.jobs) > 12 else "")
        found = [f"[{self.invariant}] {self.message}; jobs {jobs}"]
        found += [f"      {history.show(span)}" for span in self.spans[:6]]
        if len(self.spans) > 6:
            found.append(f"      … and {len(self.spans) - 6} more spans")
        shown = {span.job_id for span in self.spans[:6]}
        found += [f"      {history.show_job(job_id)}" for job_id in dict.fromkeys(self.jobs) if job_id not in shown][:4]
        return found
