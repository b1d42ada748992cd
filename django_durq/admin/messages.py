"""What the admin tells the user after retry, cancel and purge: one message per outcome, counted in words."""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.translation import ngettext

from .. import ops

SHOWN_SKIPPED = 10  # a message names at most this many jobs that were left alone


def report_retry(model_admin: admin.ModelAdmin, request: HttpRequest, result: ops.RetryResult) -> None:
    count = len(result.retried)
    if count or not result.skipped:
        text = ngettext("Retried %(count)d job: due now.", "Retried %(count)d jobs: due now.", count) % {"count": count}
        model_admin.message_user(request, text, messages.SUCCESS)
    report_skipped(model_admin, request, "retried", result.skipped)


def report_cancel(model_admin: admin.ModelAdmin, request: HttpRequest, result: ops.CancelResult) -> None:
    parts = []
    if result.cancelled:
        count = len(result.cancelled)
        parts.append(ngettext("cancelled %(count)d waiting job", "cancelled %(count)d waiting jobs", count) % {"count": count})
    if result.stopping:
        count = len(result.stopping)
        parts.append(
            ngettext("asked %(count)d running job to stop", "asked %(count)d running jobs to stop", count) % {"count": count}
        )
    if parts:
        model_admin.message_user(request, "; ".join(parts).capitalize() + ".", messages.SUCCESS)
    report_skipped(model_admin, request, "cancelled", result.skipped)


def report_purge(model_admin: admin.ModelAdmin, request: HttpRequest, purged: int) -> None:
    text = ngettext("Purged %(count)d dead letter.", "Purged %(count)d dead letters.", purged) % {"count": purged}
    model_admin.message_user(request, text, messages.SUCCESS)


def report_skipped(model_admin: admin.ModelAdmin, request: HttpRequest, verb: str, skipped: dict[int, str]) -> None:
    if not skipped:
        return
    count = len(skipped)
    shown = "; ".join(f"#{job_id} {reason}" for job_id, reason in list(skipped.items())[:SHOWN_SKIPPED])
    more = f" (and {count - SHOWN_SKIPPED} more)" if count > SHOWN_SKIPPED else ""
    head = ngettext("%(count)d job was not %(verb)s", "%(count)d jobs were not %(verb)s", count) % {"count": count, "verb": verb}
    model_admin.message_user(request, f"{head}: {shown}{more}.", messages.WARNING)
