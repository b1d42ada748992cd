"""The admin's Schedules page: each cron schedule with its last run and how it ended, its next due time, and "Run now"."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import ngettext

from .. import schedules
from ..clock import now_ms
from ..conf import get_settings
from ..models import Job, Schedule
from ..ops import local_time
from .cells import short_time
from .input import GuardedAdmin
from .states import StateReader

# Where a schedule of a page keeps what the page shows of it (see get_changelist_instance).
SHOWN = "durq_schedule_shown"


@admin.register(Schedule)
class ScheduleAdmin(GuardedAdmin):
    list_display = ("name", "cron", "timezone", "job", "last_run", "outcome", "next_due")
    search_fields = ("name",)
    ordering = ("name",)
    actions = ("run_now",)
    fields = ("name", "cron", "timezone", "job", "last_run", "outcome", "next_due", "last_job")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # schedules are declared in code or settings, not typed into the admin

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        # Per object, False: a schedule's page is read-only. Without one, it gates "Run now".
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {"title": "Schedules", **(extra_context or {})})

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        changelist = super().get_changelist_instance(request)
        shown(list(changelist.result_list))  # the queryset keeps these objects for the template
        return changelist

    @admin.display(description="job")
    def job(self, obj: Schedule) -> str:
        info = shown([obj])[obj.name]["info"]
        return info.job if info is not None and info.declared else "(no longer declared)"

    @admin.display(description="last run", ordering="last_due_ms")
    def last_run(self, obj: Schedule) -> str:
        return short_time(obj.last_due_ms, now_ms()) if obj.last_due_ms is not None else "never"

    @admin.display(description="how it ended")
    def outcome(self, obj: Schedule) -> str:
        """The state of the last run's job, with its reason; a job that retention removed is said to be."""
        entry = shown([obj])[obj.name]
        if obj.last_job_id is None:
            return "never ran"
        if entry["job"] is None:
            return f"job #{obj.last_job_id} is no longer kept"
        state = entry["state"]
        url = reverse("admin:django_durq_job_change", args=[obj.last_job_id])
        reason = (
            format_html(' <span class="durq-reason" title="{}">{}</span>', state.reason, state.reason) if state.reason else ""
        )
        return format_html(
            '<span class="durq-status durq-{}">{}</span> <a href="{}">#{}</a>{}',
            state.key,
            state.label,
            url,
            obj.last_job_id,
            reason,
        )

    @admin.display(description="next due", ordering="next_due_ms")
    def next_due(self, obj: Schedule) -> str:
        info = shown([obj])[obj.name]["info"]
        if info is not None and info.problem:
            return f"not scheduled: {info.problem}"
        return local_time(obj.next_due_ms)

    @admin.display(description="last job")
    def last_job(self, obj: Schedule) -> str:
        if obj.last_job_id is None:
            return "never ran"
        return format_html(
            '<a href="{}">#{}</a>', reverse("admin:django_durq_job_change", args=[obj.last_job_id]), obj.last_job_id
        )

    @admin.action(description="Run selected schedules now", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        ran, refused = [], []
        for schedule in queryset:
            try:
                job = schedules.run_now(schedule.name)
            except schedules.UnknownSchedule as error:
                refused.append(f"{schedule.name}: {error}")
            else:
                ran.append(f"{schedule.name} (job {job.pk})")
        if ran:
            queued = ngettext("Queued %(count)d run", "Queued %(count)d runs", len(ran)) % {"count": len(ran)}
            self.message_user(request, f"{queued}: {', '.join(ran)}.", messages.SUCCESS)
        for reason in refused:
            self.message_user(request, reason, messages.ERROR)


def shown(rows: list[Schedule]) -> dict[str, dict[str, Any]]:
    """For each schedule: its declaration (None when nothing declares it), its last job and that job's state.

    Read once for the rows given, then kept on each row, so that a page's cells read nothing more.
    """
    missing = [row for row in rows if SHOWN not in vars(row)]
    if missing:
        now = now_ms()
        infos = {info.name: info for info in schedules.list_schedules(now)}
        ids = [row.last_job_id for row in missing if row.last_job_id is not None]
        alias = get_settings().database
        last = {job.pk: job for job in Job.objects.using(alias).filter(pk__in=ids)}
        reader = StateReader(last.values(), now_ms=now, using=alias)
        for row in missing:
            job = last.get(row.last_job_id) if row.last_job_id is not None else None
            vars(row)[SHOWN] = {"info": infos.get(row.name), "job": job, "state": reader.of(job) if job else None}
    return {row.name: vars(row)[SHOWN] for row in rows}
