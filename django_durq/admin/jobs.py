"""The admin's Jobs page: every job, filtered and searched by index, and a read-only detail page.

Built for tables of millions of rows: the count stops at a cap and filter choices need no DISTINCT
(:mod:`django_durq.admin.lists`), and facet counts are off. A job is never edited through a form: its detail page is
read-only, and retry and cancel are buttons and actions that need the change permission. Thin:
every action calls :mod:`django_durq.ops`.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from .. import ops
from ..clock import now_ms
from ..conf import get_settings
from ..models import ACTIVE_STATUSES, Job, Status
from ..ops import format_age as age
from ..ops import local_time as when
from .cells import breakable, short_time
from .input import GuardedAdmin, parse_job_id
from .lists import CappedCountPaginator, NameFilter, QueueFilter
from .messages import report_cancel, report_retry
from .states import ShownState, StateReader

# Where a job of a list page keeps the state it is shown in (see get_changelist_instance).
SHOWN = "durq_shown_state"


def pretty_json(text: str | None) -> str:
    if text is None:
        return "-"
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def error_history(job: Job) -> list[dict[str, Any]]:
    try:
        entries = job.error_list
    except ValueError:
        return [{"message": "(the stored error history is not valid JSON)", "traceback": job.errors}]
    return [{**entry, "when": when(entry.get("at_ms"))} for entry in entries if isinstance(entry, dict)]


@admin.register(Job)
class JobAdmin(GuardedAdmin):
    # Six columns fit beside the admin's sidebar and the filters at 1366 px: the state says what
    # holds a job back (its reason, its last error, its progress), and one time says when.
    list_display = ["id", "job", "state", "attempts_display", "time_shown"]
    list_display_links = ["id", "job"]
    list_filter = ["status", QueueFilter, NameFilter]
    search_fields = ["unique_key"]
    search_help_text = "A job id, or a dedupe key (exact)."
    ordering = ["-id"]
    list_per_page = 50
    paginator = CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["retry_selected", "cancel_selected"]
    change_form_template = "admin/django_durq/job/change_form.html"
    # The detail page: what the job is and its payload, then (from the template) every failed
    # attempt, then progress, times and the lease.
    fieldsets = [
        (None, {"fields": ["name", "queue", "state", "attempts_display", "priority", "unique_key"]}),
        ("Payload", {"fields": ["arguments_pretty", "result_pretty"]}),
        ("Progress", {"fields": ["progress"]}),
        ("Times", {"fields": ["created", "run_at", "started", "finished"]}),
        ("Lease", {"fields": ["holder", "lease_expires", "lease_length", "claim_token", "reclaimed_from", "stop"]}),
    ]

    class Media:
        css = {"all": ["django_durq/durq.css"]}

    # --- permissions: read-only detail; retry and cancel need "change" -------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Per object, False: the detail page is read-only (a saved form would overwrite the
        # state a worker is writing). Without an object, it gates the retry and cancel actions.
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # jobs leave through purge (dead letters) or retention, never a form

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        title = str(self.opts.verbose_name_plural).capitalize()
        return super().changelist_view(request, {"title": title, **(extra_context or {})})

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = list(self.fieldsets)
        if obj is None or obj.progress_done is None:
            fieldsets = [fieldset for fieldset in fieldsets if fieldset[0] != "Progress"]
        if obj is None or obj.result is None:
            fieldsets[1] = ("Payload", {"fields": ["arguments_pretty"]})
        if obj is not None and obj.workflow_id is not None:
            fieldsets[0] = (None, {"fields": [*fieldsets[0][1]["fields"], "workflow_link"]})
        return fieldsets

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 passes where the actions are shown; older versions take the request only.
        where = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **where)
        actions.pop("delete_selected", None)
        return actions

    # --- the list -----------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(get_settings().database).defer("arguments", "result")

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any], search_term: str) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = parse_job_id(term.removeprefix("#"))
        if job_id is not None:
            # Both columns indexed: the id, or the dedupe key of an active job.
            return queryset.filter(Q(pk=job_id) | Q(unique_active=term)), False
        # The key of any job, dead ones included: one scan, done once rather than per query.
        found = list(Job.objects.using(get_settings().database).filter(unique_key=term).values_list("pk", flat=True)[:1000])
        return queryset.filter(pk__in=found), False

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The page's jobs, each with the state it is shown in, from one read of what holds jobs back."""
        changelist = super().get_changelist_instance(request)
        if "state" not in self.list_display:
            return changelist
        page = list(changelist.result_list)  # the queryset keeps these objects for the template
        reader = StateReader(page, now_ms=now_ms(), using=get_settings().database)
        for job in page:
            vars(job)[SHOWN] = reader.of(job)
        return changelist

    def shown_state(self, job: Job) -> ShownState:
        shown = vars(job).get(SHOWN)
        if shown is None:  # a detail page: this job alone
            shown = vars(job)[SHOWN] = StateReader([job], now_ms=now_ms(), using=get_settings().database).of(job)
        return shown

    @admin.display(description="job · queue", ordering="name")
    def job(self, job: Job) -> str:
        return format_html('{}<span class="durq-queue">{}</span>', breakable(job.name), job.queue)

    @admin.display(description="state", ordering="status")
    def state(self, job: Job) -> str:
        shown = self.shown_state(job)
        reason = (
            format_html(' <span class="durq-reason" title="{}">{}</span>', shown.reason, shown.reason) if shown.reason else ""
        )
        progress = self.progress(job) if job.status == Status.RUNNING and job.progress_done is not None else ""
        return format_html('<span class="durq-status durq-{}">{}</span>{}{}', shown.key, shown.label, reason, progress)

    @admin.display(description="when")
    def time_shown(self, job: Job) -> str:
        """The time that matters in its state: due while it waits, started while it runs, ended once it ended."""
        now = now_ms()
        if job.status == Status.BLOCKED:
            return format_html('<span title="not before {}">after upstream</span>', when(job.run_at_ms))
        if job.status == Status.WAITING:
            return short_time(job.run_at_ms, now, "due")
        if job.status == Status.RUNNING:
            return short_time(job.started_ms, now, "started")
        return short_time(job.finished_ms, now, "ended")

    @admin.display(description="attempts")
    def attempts_display(self, job: Job) -> str:
        return f"{job.attempts} of {job.max_attempts}"

    @admin.display(description="created", ordering="created_ms")
    def created(self, job: Job) -> str:
        return when(job.created_ms)

    @admin.display(description="due", ordering="run_at_ms")
    def run_at(self, job: Job) -> str:
        if job.status == Status.BLOCKED:
            return f"once its upstream jobs end, not before {when(job.run_at_ms)}"
        return when(job.run_at_ms)

    @admin.display(description="started", ordering="started_ms")
    def started(self, job: Job) -> str:
        return when(job.started_ms)

    @admin.display(description="finished", ordering="finished_ms")
    def finished(self, job: Job) -> str:
        return when(job.finished_ms)

    @admin.display(description="lease expires")
    def lease_expires(self, job: Job) -> str:
        return when(job.lease_expires_ms)

    @admin.display(description="claimed by")
    def holder(self, job: Job) -> str:
        """The worker holding (or last holding) the lease; a running job's, if that worker has ended, is orphaned."""
        if job.status == Status.RUNNING and job.claimed_by in ops.ended_workers([job.claimed_by]):
            return f"{job.claimed_by} (ended: the job is orphaned until a running worker takes it over, within a second)"
        return job.claimed_by or "-"

    @admin.display(description="lease length")
    def lease_length(self, job: Job) -> str:
        return age(job.lease_ms)

    @admin.display(description="progress")
    def progress(self, job: Job) -> str:
        done, total = job.progress_done, job.progress_total
        if done is None:
            return "-"
        if not total:
            return f"{done}"
        percent = max(0, min(100, round(100 * done / total)))
        return format_html(
            '<span class="durq-progress-line">'
            '<progress class="durq-progress" value="{}" max="{}"></progress> {} / {} ({}%)</span>',
            done,
            total,
            done,
            total,
            percent,
        )

    @admin.display(description="last error")
    def last_error(self, job: Job) -> str:
        history = error_history(job)
        if not history:
            return "-"
        entry = history[-1]
        prefix = f"{entry['type']}: " if entry.get("type") else ""
        full = prefix + str(entry.get("message", ""))
        # The cell shows the start, clamped to a few lines by durq.css; the title holds the rest.
        return format_html(
            '<span class="durq-last-error" title="{}">{}</span>', Truncator(full).chars(2000), Truncator(full).chars(120)
        )

    @admin.display(description="workflow")
    def workflow_link(self, job: Job) -> str:
        url = reverse("admin:django_durq_workflow_change", args=[job.workflow_id])
        waits = f" · waits for {job.deps_left} more job{'s' if job.deps_left != 1 else ''}" if job.deps_left else ""
        cancelled = f" · cancelled because job {job.cancelled_by} failed" if job.cancelled_by is not None else ""
        return format_html('<a href="{}" id="durq-workflow-link">workflow #{}</a>{}{}', url, job.workflow_id, waits, cancelled)

    @admin.display(description="stop requested")
    def stop(self, job: Job) -> str:
        return "yes: the handler's ctx.should_stop() is true" if job.stop_requested else "no"

    @admin.display(description="arguments")
    def arguments_pretty(self, job: Job) -> str:
        return format_html('<pre class="durq-pre">{}</pre>', pretty_json(job.arguments))

    @admin.display(description="result")
    def result_pretty(self, job: Job) -> str:
        return format_html('<pre class="durq-pre">{}</pre>', pretty_json(job.result))

    # --- actions (thin: ops does the work) -----------------------------------------------------

    @admin.action(description="Retry selected jobs (dead or cancelled)", permissions=["change"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        report_retry(self, request, ops.retry(queryset))

    @admin.action(description="Cancel selected jobs (stop running ones)", permissions=["change"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        report_cancel(self, request, ops.cancel(queryset))

    # --- the detail page and its buttons -------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        own = [
            path("<path:object_id>/retry/", self.admin_site.admin_view(self.retry_view), name=f"{info}_retry"),
            path("<path:object_id>/cancel/", self.admin_site.admin_view(self.cancel_view), name=f"{info}_cancel"),
        ]
        return own + super().get_urls()

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        job = self.get_object(request, object_id)
        context = {**(extra_context or {}), "show_delete": False}
        if job is not None:
            context.update(durq_errors=error_history(job), **self.buttons(request, job))
        return super().change_view(request, object_id, form_url, context)

    def buttons(self, request: HttpRequest, job: Job) -> dict[str, bool]:
        """Which of the detail page's buttons this user gets for this job."""
        can_change = self.has_change_permission(request)
        return {
            "durq_can_retry": can_change and job.status in ops.RETRYABLE,
            "durq_can_cancel": can_change and job.status in ACTIVE_STATUSES,
            "durq_can_purge": False,
        }

    def _acting_on(self, request: HttpRequest, object_id: str, permitted: bool) -> Job:
        if not permitted:
            raise PermissionDenied
        job_id = parse_job_id(object_id)
        job = None if job_id is None else self.get_queryset(request).filter(pk=job_id).first()
        if job is None:
            raise Http404(f"No job {object_id!r} here.")
        return job

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        return None if parse_job_id(object_id) is None else super().get_object(request, object_id, from_field)

    def response_action(self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any) -> HttpResponse | None:
        # Django's admin filters on the selected ids as sent; one that is not an id would raise.
        if any(parse_job_id(value) is None for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)):
            return HttpResponseBadRequest("A selected job id is not a job id.")
        return super().response_action(request, queryset, *args, **kwargs)  # Django 6.1 adds action_location

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        job = self._acting_on(request, object_id, self.has_change_permission(request))
        report_retry(self, request, ops.retry([job.pk]))
        return HttpResponseRedirect(self.after_retry_url(job))

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        job = self._acting_on(request, object_id, self.has_change_permission(request))
        report_cancel(self, request, ops.cancel([job.pk]))
        return HttpResponseRedirect(reverse("admin:django_durq_job_change", args=[job.pk]))

    def after_retry_url(self, job: Job) -> str:
        return reverse("admin:django_durq_job_change", args=[job.pk])
