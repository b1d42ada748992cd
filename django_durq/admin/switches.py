"""Pausing and resuming a queue from the admin: a confirmation page that says what will happen and asks why.

GET shows the page; POST, with a reason, calls :func:`django_durq.ops.pause` or
:func:`django_durq.ops.resume` with the user's name, then goes back to the Queues page. Both need
the "change queue" permission; a POST carries Django's CSRF token. A malformed queue name or a
NUL byte is answered 400; a missing or too long reason shows the page again, saying why.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import ops
from ..clock import now_ms
from ..handlers.options import check_queue
from ..ops.pausing import MAX_REASON, check_words
from ..ops.stats import COUNT_CAP
from .input import carries_nul
from .pages import breadcrumbs

ASK = "Say why: the reason is recorded with your name and the time, and shown on the Queues page."


def switch_view(model_admin: admin.ModelAdmin, request: HttpRequest, pausing: bool, permitted: bool) -> HttpResponse:
    """The confirmation page of a pause (``pausing``) or a resume, and its POST."""
    if not permitted:
        raise PermissionDenied
    data = request.POST if request.method == "POST" else request.GET
    queue = data.get("queue", "")
    if carries_nul(request, {}):
        return HttpResponseBadRequest("A NUL byte is not allowed in a request to the admin.")
    try:
        check_queue(queue)
    except ValueError as error:
        return HttpResponseBadRequest(str(error))
    problem = ""
    if request.method == "POST":
        try:
            reason, by = check_words(request.POST.get("reason", ""), request.user.get_username())
        except ValueError as error:
            reason, problem = "", f"{str(error).capitalize()}."
        if reason:
            switch = ops.pause if pausing else ops.resume
            done = switch(queue, reason=reason, by=by)
            model_admin.message_user(request, _outcome(queue, pausing, done), messages.SUCCESS if done else messages.INFO)
            return HttpResponseRedirect(reverse("admin:django_durq_queue_changelist"))
        problem = problem or ASK
    return _page(model_admin, request, queue, pausing, problem)


def _outcome(queue: str, pausing: bool, done: bool) -> str:
    if pausing:
        if done:
            return f"Paused queue “{queue}”: workers start none of its jobs until it is resumed; running jobs finish."
        return f"Queue “{queue}” was already paused."
    return f"Resumed queue “{queue}”: its due jobs start now." if done else f"Queue “{queue}” was not paused."


def _page(model_admin: admin.ModelAdmin, request: HttpRequest, queue: str, pausing: bool, problem: str) -> HttpResponse:
    now = now_ms()
    stats = next((row for row in ops.stats(now_ms=now, count_cap=COUNT_CAP) if row.queue == queue), None)
    verb = "Pause" if pausing else "Resume"
    switch = ops.queue_switches().get(queue)
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "title": f"{verb} queue “{queue}”?",
        "opts": model_admin.opts,
        **breadcrumbs(model_admin.opts, (reverse("admin:django_durq_queue_changelist"), "Queues"), (None, verb)),
        "queue": queue,
        "pausing": pausing,
        "verb": verb,
        "due": ops.due_jobs(stats.waiting if stats else 0),
        "waiting": stats.waiting if stats else 0,
        "delayed": stats.delayed if stats else 0,
        "running": stats.running if stats else 0,
        "switch": switch,
        "switch_at": ops.local_time(switch.at_ms) if switch else "",
        "problem": problem,
        "reason": request.POST.get("reason", "") if request.method == "POST" else "",
        "max_reason": MAX_REASON,
        "action": reverse("admin:django_durq_queue_pause" if pausing else "admin:django_durq_queue_resume"),
    }
    return TemplateResponse(request, "admin/django_durq/queue/switch.html", context)
