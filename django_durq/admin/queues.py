"""The admin's Queues page: per-queue counts, oldest wait, live workers, the last hour's throughput, pause and resume."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.translation import ngettext

from .. import ops
from ..clock import ms_to_datetime, now_ms
from ..handlers.options import check_queue
from ..models import Queue
from ..ops import format_age as age
from ..ops import local_time as when
from ..ops.stats import COUNT_CAP
from .pages import breadcrumbs


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
        return self._switch(request, pausing=True)

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        return self._switch(request, pausing=False)

    def _switch(self, request: HttpRequest, pausing: bool) -> HttpResponse:
        """Pause or resume the queue named in the POST, then back to the Queues page with what happened."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_pause_permission(request):
            raise PermissionDenied
        queue = request.POST.get("queue", "")
        try:
            check_queue(queue)
        except ValueError as error:
            return HttpResponseBadRequest(str(error))
        if pausing:
            done = ops.pause(queue)
            text = (
                f"Paused queue “{queue}”: workers start none of its jobs until it is resumed; running jobs finish."
                if done
                else f"Queue “{queue}” was already paused."
            )
        else:
            done = ops.resume(queue)
            text = f"Resumed queue “{queue}”: its due jobs start now." if done else f"Queue “{queue}” was not paused."
        self.message_user(request, text, messages.SUCCESS if done else messages.INFO)
        return HttpResponseRedirect(reverse("admin:django_durq_queue_changelist"))

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = now_ms()
        rows = ops.stats(now_ms=now, count_cap=COUNT_CAP)
        workers = [
            {
                "worker": worker,
                "queues": ops.worker_queues(worker),
                "started": when(worker.started_ms),
                "seen": age(now - worker.last_seen_ms),
            }
            for worker in ops.live_workers(now_ms=now)
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
                    "paused_since": when(row.paused_ms),
                    **{state: _capped(getattr(row, state)) for state in ("waiting", "delayed", "running", "dead")},
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
