"""The admin's Queues page: counts and oldest wait per queue, the hosts serving it, the last hour's throughput, pausing."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.translation import ngettext

from .. import ops
from ..clock import ms_to_datetime, now_ms
from ..models import Queue, WorkerProcess
from ..ops import format_age as age
from ..ops import local_time as when
from ..ops.stats import COUNT_CAP
from .cells import short_time
from .pages import breadcrumbs
from .states import orphans_by_queue
from .switches import switch_view


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    """The Queues page: counts, oldest wait, live workers and the last hour's throughput; pause and resume a queue."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_pause_permission(self, request: HttpRequest) -> bool:
        """Pausing and resuming take the "change queue" permission (the page itself changes nothing)."""
        codename = get_permission_codename("change", self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("", view(self.dashboard_view), name="django_durq_queue_changelist"),
            path("pause/", view(self.pause_view), name="django_durq_queue_pause"),
            path("resume/", view(self.resume_view), name="django_durq_queue_resume"),
        ]

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        return switch_view(self, request, pausing=True, permitted=self.has_pause_permission(request))

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        return switch_view(self, request, pausing=False, permitted=self.has_pause_permission(request))

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = now_ms()
        rows = ops.stats(now_ms=now, count_cap=COUNT_CAP)
        live = ops.live_workers(now_ms=now)
        served = serving(live)
        orphaned = orphans_by_queue(worker.worker_id for worker in live)
        switches = ops.queue_switches()
        workers = [
            {
                "worker": worker,
                "queues": ops.worker_queues(worker),
                "started": when(worker.started_ms),
                "seen": age(now - worker.last_seen_ms),
            }
            for worker in live
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": "Queues",
            "opts": self.opts,
            **breadcrumbs(self.opts, (None, "Queues")),
            "rows": [
                {
                    "stats": row,
                    "oldest": age(row.oldest_wait_ms),
                    "switch": switches.get(row.queue),
                    "switched": when(switches[row.queue].at_ms) if row.queue in switches else "",
                    "switched_short": short_time(switches[row.queue].at_ms, now) if row.queue in switches else "",
                    "served": served.get(row.queue),
                    "orphaned": orphaned.get(row.queue, 0),
                    **{state: _capped(getattr(row, state)) for state in ("waiting", "delayed", "blocked", "running", "dead")},
                }
                for row in rows
            ],
            "workers": workers,
            "limits": ops.limit_usage(now_ms=now),
            "can_pause": self.has_pause_permission(request),
            "unserved": [
                unserved_warning(queue, count) for queue, count in ops.unserved(now_ms=now, count_cap=COUNT_CAP).items()
            ],
            "chart": throughput_chart(ops.throughput(now_ms=now)),
            "now": when(now),
        }
        return TemplateResponse(request, "admin/django_durq/queue/dashboard.html", context)


def serving(workers: list[WorkerProcess]) -> dict[str, dict[str, Any]]:
    """Per queue, the hosts whose live workers serve it (each with its workers' ids), and their processes and slots."""
    hosts: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    slots: dict[str, int] = defaultdict(int)
    for worker in workers:
        for queue, size in ops.worker_queues(worker).items():
            hosts[queue][worker.host].append(worker.worker_id)
            slots[queue] += size
    return {
        queue: {
            "hosts": [{"host": host, "count": len(ids), "ids": ", ".join(ids)} for host, ids in sorted(by_host.items())],
            "processes": sum(len(ids) for ids in by_host.values()),
            "slots": slots[queue],
        }
        for queue, by_host in hosts.items()
    }


def unserved_warning(queue: str, count: int) -> str:
    """What the page says of a queue whose due jobs no live worker serves."""
    shown = _capped(count)
    return ngettext(
        "%(count)s job is due in queue “%(queue)s”, and no live worker serves it: it waits until a worker runs that queue.",
        "%(count)s jobs are due in queue “%(queue)s”, and no live worker serves it: they wait until a worker runs that queue.",
        count,
    ) % {"count": shown, "queue": queue}


def _capped(count: int) -> str:
    return f"more than {COUNT_CAP:,}" if count > COUNT_CAP else f"{count:,}"


def throughput_chart(buckets: list[ops.Bucket]) -> dict[str, Any]:
    """Geometry of the Queues page's SVG bar chart: finished (below) and failed (stacked above) per minute."""
    left, top, plot_width, plot_height, bottom = 48, 8, 720, 160, 24
    slot = plot_width / max(len(buckets), 1)
    peak = max((bucket.finished + bucket.failed for bucket in buckets), default=0)
    step = next(s * 10**k for k in range(12) for s in (1, 2, 5) if 4 * s * 10**k >= peak)
    scale = 4 * step
    base = top + plot_height
    bars = []
    for index, bucket in enumerate(buckets):
        finished_h = bucket.finished / scale * plot_height
        failed_h = bucket.failed / scale * plot_height
        bars.append(
            {
                "x": round(left + index * slot + 1, 1),
                "width": round(slot - 2, 1),
                "finished_y": round(base - finished_h, 1),
                "finished_h": round(finished_h, 1),
                "failed_y": round(base - finished_h - failed_h, 1),
                "failed_h": round(failed_h, 1),
                "title": f"{clock_time(bucket.minute_ms)}: {bucket.finished} finished, {bucket.failed} failed",
            }
        )
    labels = [*range(0, len(buckets), 15), len(buckets) - 1]
    return {
        "width": left + plot_width + 16,
        "height": base + bottom,
        "left": left,
        "right": left + plot_width,
        "base": base,
        "bars": bars,
        "grid": [{"y": round(base - i * step / scale * plot_height, 1), "label": f"{i * step:,}"} for i in range(5)],
        "times": [
            {"x": round(left + index * slot + slot / 2, 1), "label": clock_time(buckets[index].minute_ms)}
            for index in sorted(set(labels))
            if buckets
        ],
        "finished": sum(bucket.finished for bucket in buckets),
        "failed": sum(bucket.failed for bucket in buckets),
    }


def clock_time(ms: int) -> str:
    moment = ms_to_datetime(ms)
    assert moment is not None
    return date_format(timezone.localtime(moment), "H:i")
