"""The admin's Schedules page: each cron schedule with its last and next run, and a "Run now" action."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import ngettext

from .. import schedules
from ..clock import now_ms
from ..models import Schedule
from ..ops import local_time
from .input import GuardedAdmin


@admin.register(Schedule)
class ScheduleAdmin(GuardedAdmin):
    list_display = ("name", "cron", "timezone", "job", "last_run", "next_run", "last_job_id")
    search_fields = ("name",)
    ordering = ("name",)
    actions = ("run_now",)
    readonly_fields = ("name", "cron", "timezone", "next_due_ms", "last_due_ms", "last_job_id", "updated_ms")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # schedules are declared in code or settings, not typed into the admin

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False

    def _declared(self) -> dict[str, schedules.ScheduleInfo]:
        return {info.name: info for info in schedules.list_schedules(now_ms())}

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):  # type: ignore[no-untyped-def]
        self._infos = self._declared()
        return super().changelist_view(request, extra_context)

    @admin.display(description="job")
    def job(self, obj: Schedule) -> str:
        info = getattr(self, "_infos", {}).get(obj.name)
        return info.job if info is not None and info.declared else "(no longer declared)"

    @admin.display(description="last run", ordering="last_due_ms")
    def last_run(self, obj: Schedule) -> str:
        return local_time(obj.last_due_ms) if obj.last_due_ms is not None else "never"

    @admin.display(description="next run", ordering="next_due_ms")
    def next_run(self, obj: Schedule) -> str:
        return local_time(obj.next_due_ms)

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
