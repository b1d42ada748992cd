"""Monitoring views to mount with ``path("durq/", include("django_durq.urls"))``: health and Prometheus metrics.

Closed by default. A request gets in when one of these holds:

- the user is logged in with the ``django_durq.view_job`` permission;
- it sends ``Authorization: Bearer <token>`` matching ``DURQ["MONITORING"]["TOKEN"]``;
- ``DURQ["MONITORING"]["PUBLIC"]`` is True (for an endpoint only a private network reaches).

``DURQ["MONITORING"]["MAX_WAIT"]`` (seconds, default 300) and ``["MIN_WORKERS"]`` (default 1) set
when the health check answers 503.
"""

from __future__ import annotations

import hmac
from collections import Counter

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from . import ops
from .clock import now_ms
from .conf import get_settings


def _authorize(request: HttpRequest) -> None:
    options = get_settings().monitoring
    if options.public:
        return
    token = options.token
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), str(token).encode()):
        return
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.has_perm("django_durq.view_job"):
        return
    raise PermissionDenied


@never_cache
@require_GET
def health(request: HttpRequest) -> HttpResponse:
    """200 when the database answers, enough workers are live, no due job waited too long and every
    queue holding due jobs has a live worker (``unserved_queues`` names those that have none); else 503.

    A paused queue's jobs count for neither; ``paused_queues`` names the paused queues.
    ``orphaned_jobs`` lists running jobs whose worker has ended, with that worker, until a worker
    takes them over; ``unknown_type_last_hour`` counts per queue the jobs handed back by workers
    without a handler for their type. Neither makes the answer 503: both are normal for a moment."""
    _authorize(request)
    options = get_settings().monitoring
    report = ops.health(now_ms=now_ms(), max_wait_ms=options.max_wait_ms, min_workers=options.min_workers)
    return JsonResponse(report, status=200 if report["healthy"] else 503)


# Deprecated: sliding windows kept for dashboards that read them. A window loses what a killed
# worker had not saved yet; rate() and increase() of the _total counters below do not.
DEPRECATED = " Deprecated: use rate() or increase() of durq_jobs_{}_total."
GAUGES = [
    (
        "durq_jobs_finished_last_minute",
        "finished_last_minute",
        "Jobs finished in the last minute." + DEPRECATED.format("finished"),
    ),
    (
        "durq_jobs_failed_last_minute",
        "failed_last_minute",
        "Attempts that failed in the last minute (retried or not)." + DEPRECATED.format("failed"),
    ),
    ("durq_jobs_finished_last_hour", "finished_last_hour", "Jobs finished in the last hour." + DEPRECATED.format("finished")),
    (
        "durq_jobs_failed_last_hour",
        "failed_last_hour",
        "Attempts that failed in the last hour (retried or not)." + DEPRECATED.format("failed"),
    ),
    (
        "durq_jobs_unknown_type_last_hour",
        "unknown_type_last_hour",
        "Jobs handed back in the last hour, attempt not counted, by a worker with no handler for their type.",
    ),
    ("durq_workers", "workers", "Live worker processes serving the queue."),
    ("durq_worker_slots", "slots", "Pool slots of the live workers serving the queue."),
]


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The ops stats in the Prometheus text exposition format."""
    _authorize(request)
    rows = ops.stats(now_ms=now_ms())
    lines = [
        "# HELP durq_jobs Jobs per queue and state (waiting: due now; delayed: due later; blocked: waiting for upstream jobs).",
        "# TYPE durq_jobs gauge",
    ]
    for row in rows:
        for state in ("waiting", "delayed", "blocked", "running", "dead"):
            lines.append(f'durq_jobs{{queue="{_label(row.queue)}",state="{state}"}} {getattr(row, state)}')
    lines += [
        "# HELP durq_oldest_waiting_seconds How long the longest-waiting due job has been due (0 when none is).",
        "# TYPE durq_oldest_waiting_seconds gauge",
    ]
    for row in rows:
        lines.append(f'durq_oldest_waiting_seconds{{queue="{_label(row.queue)}"}} {(row.oldest_wait_ms or 0) / 1000:g}')
    for metric, attribute, help_text in GAUGES:
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for row in rows:
            lines.append(f'{metric}{{queue="{_label(row.queue)}"}} {getattr(row, attribute)}')
    lines += [
        "# HELP durq_queue_paused 1 while the queue is paused (no worker starts its jobs), else 0.",
        "# TYPE durq_queue_paused gauge",
    ]
    for row in rows:
        lines.append(f'durq_queue_paused{{queue="{_label(row.queue)}"}} {int(row.paused)}')
    orphans = Counter(orphan.queue for orphan in ops.orphaned())
    lines += [
        "# HELP durq_jobs_orphaned Running jobs whose worker has ended, until a worker takes them over.",
        "# TYPE durq_jobs_orphaned gauge",
    ]
    for row in rows:
        lines.append(f'durq_jobs_orphaned{{queue="{_label(row.queue)}"}} {orphans.get(row.queue, 0)}')
    lines += _limit_lines()
    lines += _total_lines()
    return HttpResponse("\n".join(lines) + "\n", content_type="text/plain; version=0.0.4; charset=utf-8")


LIMIT_GAUGES = [
    ("durq_limit_running", "running", "Running jobs of the queue, as its limits count them (unexpired leases)."),
    ("durq_limit_max_running", "max_running", "The queue's max_running (absent: none)."),
    ("durq_limit_started_in_window", "started_in_window", "Starts in the queue's rate window ending now."),
    ("durq_limit_keys_at_limit", "keys_at_limit", "Keys whose jobs wait because the key is at its limit."),
    ("durq_limit_held_back", "held_back", "Due jobs held back by a limit."),
]


def _limit_lines() -> list[str]:
    """Limits at work, for queues with limits of their own or limited jobs."""
    usage = ops.limit_usage(now_ms=now_ms())
    lines: list[str] = []
    for metric, attribute, help_text in LIMIT_GAUGES:
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for row in usage:
            value = getattr(row, attribute)
            if value is not None:
                lines.append(f'{metric}{{queue="{_label(row.queue)}"}} {value}')
    return lines


COUNTERS = {
    "enqueued": "Jobs queued.",
    "started": "Attempts started: jobs claimed by a worker to run.",
    "finished": "Jobs finished.",
    "failed": "Attempts that failed, retried or not.",
    "retried": "Failed attempts given another attempt.",
    "dead": "Jobs that became dead letters.",
    "cancelled": "Jobs cancelled: by an operator, by their expiry, or with a workflow job they waited for.",
    "handed_back": "Attempts handed back for another worker, not counted (stopping, no handler for the type).",
}
HISTOGRAMS = {
    "wait": ("durq_job_wait_seconds", "From a job's due time to its start."),
    "run": ("durq_job_run_seconds", "From an attempt's start to its outcome (finished or failed)."),
}


def _total_lines() -> list[str]:
    """Counters and histograms per queue and job type, from the database: they survive any worker's death."""
    rows = ops.totals()
    lines: list[str] = []
    for metric, help_text in COUNTERS.items():
        name = f"durq_jobs_{metric}_total"
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        lines += [f"{name}{{{_pair(row)}}} {row.counts[metric]}" for row in rows]
    for histogram, (name, help_text) in HISTOGRAMS.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for row in rows:
            observed = row.histograms[histogram]
            pair = _pair(row)
            lines += [f'{name}_bucket{{{pair},le="{bound}"}} {count}' for bound, count in observed.buckets]
            lines += [f"{name}_sum{{{pair}}} {observed.sum_s}", f"{name}_count{{{pair}}} {observed.count}"]
    return lines


def _pair(row: ops.Totals) -> str:
    return f'queue="{_label(row.queue)}",job_name="{_label(row.job_name)}"'


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
