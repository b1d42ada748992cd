"""The admin's Dead letters page: jobs that used up their attempts, with retry and a confirmed purge."""

from __future__ import annotations

from typing import Any, cast

from django.contrib import admin
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.text import Truncator

from .. import ops
from ..clock import now_ms
from ..models import DeadLetter, Job, JobQuerySet
from ..ops import local_time as when
from .cells import short_time
from .jobs import JobAdmin
from .lists import CappedCountPaginator, NameFilter, QueueFilter
from .messages import report_purge
from .pages import breadcrumbs, changelist_crumb


@admin.register(DeadLetter)
class DeadLetterAdmin(JobAdmin):
    # The last error takes what the other columns leave: about half the table at 1366 px.
    list_display = ["id", "job", "died", "attempts_display", "last_error"]
    list_filter = [QueueFilter, NameFilter]
    ordering = ["-finished_ms", "-id"]
    actions = ["retry_selected", "purge_selected"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return cast(JobQuerySet, super().get_queryset(request)).dead()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return admin.ModelAdmin.has_delete_permission(self, request, obj)

    @admin.display(description="died", ordering="finished_ms")
    def finished(self, job: Job) -> str:
        return when(job.finished_ms)

    @admin.display(description="died", ordering="finished_ms")
    def died(self, job: Job) -> str:
        return short_time(job.finished_ms, now_ms())

    @admin.action(description="Purge selected dead letters", permissions=["delete"])
    def purge_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        if request.POST.get("post") == "yes":
            purged = ops.purge(queryset)
            report_purge(self, request, purged)
            return None
        paginator = CappedCountPaginator(queryset.order_by("-finished_ms", "-id"), 20)
        context = {
            **self.admin_site.each_context(request),
            "title": "Purge dead letters?",
            "opts": self.opts,
            **breadcrumbs(self.opts, changelist_crumb(DeadLetter), (None, "Purge")),
            "count": paginator.count,
            "capped": paginator.capped,
            "cap": paginator.cap,
            "sample": paginator.page(1).object_list,
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across") == "1",
            "action": "purge_selected",
            "index": "0",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "preserved_query": request.GET.urlencode(),
        }
        return TemplateResponse(request, "admin/django_durq/deadletter/purge_selected.html", context)

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        own = [path("<path:object_id>/purge/", self.admin_site.admin_view(self.purge_view), name=f"{info}_purge")]
        return own + super().get_urls()

    def buttons(self, request: HttpRequest, job: Job) -> dict[str, bool]:
        return {
            "durq_can_retry": self.has_change_permission(request),
            "durq_can_cancel": False,
            "durq_can_purge": self.has_delete_permission(request),
        }

    def purge_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        job = self._acting_on(request, object_id, self.has_delete_permission(request))
        if request.method == "POST":
            purged = ops.purge([job.pk])
            report_purge(self, request, purged)
            return HttpResponseRedirect(reverse("admin:django_durq_deadletter_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Purge this dead letter?",
            "opts": self.opts,
            **breadcrumbs(
                self.opts,
                changelist_crumb(DeadLetter),
                (reverse("admin:django_durq_deadletter_change", args=[job.pk]), Truncator(str(job)).words(18)),
                (None, "Purge"),
            ),
            "job": job,
            "count": 1,
            "sample": [job],
        }
        return TemplateResponse(request, "admin/django_durq/deadletter/purge_selected.html", context)

    def after_retry_url(self, job: Job) -> str:
        return reverse("admin:django_durq_deadletter_changelist")  # it is no longer a dead letter
