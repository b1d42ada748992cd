"""Queued jobs of types that no handler in this installation serves: a type deleted, or renamed, with jobs still queued.

Types are looked up in the registry of this process only (the handlers its installed apps and
``DURQ["MODULES"]`` register), never imported from the names stored in rows.
"""

from __future__ import annotations

from django.db.models import Count

from ..handlers.registry import registry
from ..models import Status
from .reading import alias_of, jobs_on


def unhandled_types(*, using: str | None = None) -> dict[str, int]:
    """Waiting and running jobs whose type has no handler here, by type, with how many there are.

    One pass over the active rows, grouped by name: a check to run at a deploy, not on every request.
    """
    rows = (
        jobs_on(alias_of(using))
        .filter(status__in=(Status.WAITING, Status.RUNNING))
        .order_by()
        .values("name")
        .annotate(count=Count("id"))
    )
    return {row["name"]: row["count"] for row in rows if registry.get(row["name"]) is None}
