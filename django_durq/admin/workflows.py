"""The admin's Workflows pages: recent workflows with their state, and one workflow's graph, jobs and buttons.

Thin, like the other pages: :mod:`django_durq.ops` reads and acts, :mod:`django_durq.admin.workflow_graph`
computes the drawing. Both pages need the view permission on workflows; Cancel and Retry need
the change permission, are POST only and carry the CSRF token.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.text import Truncator

from .. import ops
from ..clock import now_ms
from ..models import Job, Workflow
from .cells import breakable, short_time
from .input import parse_job_id, refusing_nul
from .messages import report_cancel, report_retry
from .pages import breadcrumbs, changelist_crumb
from .states import ShownState, StateReader, last_error
from .workflow_graph import layout

PAGE_SIZE = 50
STATUSES = ("waiting", "blocked", "running", "finished", "dead", "cancelled")


@admin.register(Workflow)
class WorkflowAdmin(admin.ModelAdmin):
    """Workflows: a list of the recent ones and a page per workflow, never a form."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a workflow leaves with its jobs, by retention

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"

        def view(function: Any) -> Any:
            return self.admin_site.admin_view(refusing_nul(function))

        return [
            path("", view(self.list_view), name=f"{info}_changelist"),
            path("<path:object_id>/change/", view(self.detail_view), name=f"{info}_change"),
            path("<path:object_id>/cancel/", view(self.cancel_view), name=f"{info}_cancel"),
            path("<path:object_id>/retry/", view(self.retry_view), name=f"{info}_retry"),
        ]

    def list_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        before = parse_job_id(request.GET.get("before", ""))
        rows = ops.workflows(limit=PAGE_SIZE + 1, before=before)
        now = now_ms()
        context = {
            **self.admin_site.each_context(request),
            "title": "Workflows",
            "opts": self.opts,
            **breadcrumbs(self.opts, (None, "Workflows")),
            "rows": [_row(summary, now) for summary in rows[:PAGE_SIZE]],
            "statuses": STATUSES,
            "older": rows[PAGE_SIZE - 1].id if len(rows) > PAGE_SIZE else None,
            "newest": before is not None,
        }
        return TemplateResponse(request, "admin/django_durq/workflow/list.html", context)

    def detail_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        detail = _detail(object_id)
        summary = detail.summary
        can_change = self.has_change_permission(request)
        now = now_ms()
        members = [*detail.external, *detail.jobs]
        reader = StateReader(members, now_ms=now)
        states = {job.pk: reader.of(job) for job in members}
        graph = layout(detail)
        names = {job.pk: job.name for job in members}
        for node in graph.get("nodes", []):
            # A box is drawn in the state its job is shown in: orphaned, held or paused too.
            shown = states[node.job_id]
            node.meta = node.meta.replace(f" · {node.status} · ", f" · {shown.label.lower()} · ", 1)
            node.status = shown.key
            because = f": {shown.reason}" if shown.reason else ""
            before = " (queued before this workflow)" if node.external else ""
            node.title = f"{names[node.job_id]} #{node.job_id}: {shown.label.lower()}{because}{before}"
        context = {
            **self.admin_site.each_context(request),
            "title": f"Workflow {summary.name}",
            "opts": self.opts,
            **breadcrumbs(self.opts, changelist_crumb(Workflow), (None, Truncator(f"{summary.name} #{summary.id}").chars(60))),
            "summary": _row(summary, now),
            "graph": graph,
            "members": [_member(job, detail, states[job.pk], now) for job in members],
            "can_cancel": can_change and summary.state == "running",
            "can_retry": can_change and bool(summary.counts.get("dead") or summary.counts.get("cancelled")),
        }
        return TemplateResponse(request, "admin/django_durq/workflow/detail.html", context)

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        workflow_id = self._acting_on(request, object_id)
        result = ops.cancel_workflow(workflow_id)
        if not result.cancelled and not result.stopping:
            self.message_user(request, "Nothing to cancel: no job of this workflow is waiting or running.", messages.INFO)
        report_cancel(self, request, result)
        return HttpResponseRedirect(reverse("admin:django_durq_workflow_change", args=[workflow_id]))

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        workflow_id = self._acting_on(request, object_id)
        report_retry(self, request, ops.retry_workflow(workflow_id))
        return HttpResponseRedirect(reverse("admin:django_durq_workflow_change", args=[workflow_id]))

    def _acting_on(self, request: HttpRequest, object_id: str) -> int:
        if not self.has_change_permission(request):
            raise PermissionDenied
        return _detail(object_id).summary.id


def _detail(object_id: str) -> ops.WorkflowDetail:
    workflow_id = parse_job_id(object_id)
    try:
        if workflow_id is None:
            raise ops.NoSuchWorkflow(0)
        return ops.workflow(workflow_id)
    except ops.NoSuchWorkflow:
        raise Http404(f"No workflow {object_id!r} here: it never existed, or it was pruned with its jobs.") from None


def _row(summary: ops.WorkflowSummary, now: int) -> dict[str, Any]:
    return {
        "summary": summary,
        "counts": [(status, summary.counts.get(status, 0)) for status in STATUSES],
        "in_words": ", ".join(f"{summary.counts[status]} {status}" for status in STATUSES if summary.counts.get(status)),
        "created": short_time(summary.created_ms, now),
        "ended": short_time(summary.last_ended_ms, now) if summary.state != "running" else "-",
        "url": reverse("admin:django_durq_workflow_change", args=[summary.id]),
    }


def _member(job: Job, detail: ops.WorkflowDetail, state: ShownState, now: int) -> dict[str, Any]:
    done, total = job.progress_done, job.progress_total
    error = last_error(job)
    return {
        "job": job,
        "name": breakable(job.name),
        "state": state,
        "external": job.workflow_id != detail.summary.id,
        "waits_for": detail.upstream(job.pk),
        "dependents": detail.downstream(job.pk),
        "progress": None if done is None else (f"{done} / {total}" if total else str(done)),
        "started": short_time(job.started_ms, now),
        "finished": short_time(job.finished_ms, now),
        # One line in the table, the whole value on hover and on the job's page.
        "result": Truncator(job.result).chars(2000) if job.result is not None else "",
        "error": Truncator(error).chars(2000) if job.status != "finished" else "",
    }
