"""What the admin pages accept from a request: job ids as plain numbers, and no NUL byte anywhere.

Left alone, a malformed value reaches ``int()`` or the database and comes back as a 500: ``"²"``
and ``"١٢٣"`` pass ``str.isdigit()``, a number past the bigint range overflows, and PostgreSQL
refuses a NUL byte in any text parameter. Each admin page of django-durq checks here first and
answers 400 (a NUL byte) or 404 (an id that names no job).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.urls import URLPattern

# ASCII digits only, and few enough to fit a signed 64-bit column.
_JOB_ID = re.compile(r"[0-9]{1,18}")


def parse_job_id(text: str) -> int | None:
    """The job id ``text`` spells, or None when it spells none."""
    return int(text) if _JOB_ID.fullmatch(text) else None


def carries_nul(request: HttpRequest, values: dict[str, Any]) -> bool:
    """A NUL byte in the URL's parameters, the query string or the posted form."""
    texts = [str(value) for value in values.values()]
    for data in (request.GET, request.POST):
        for key, items in data.lists():
            texts.append(key)
            texts.extend(str(item) for item in items)
    return any("\x00" in text for text in texts)


def refusing_nul(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if carries_nul(request, kwargs) or any("\x00" in str(arg) for arg in args):
            return HttpResponseBadRequest("A NUL byte is not allowed in a request to the admin.")
        return view(request, *args, **kwargs)

    return guarded


class GuardedAdmin(admin.ModelAdmin):
    """A model admin whose list, detail and history pages refuse a NUL byte with 400."""

    def get_urls(self) -> list[URLPattern]:
        patterns = super().get_urls()
        for pattern in patterns:
            if isinstance(pattern, URLPattern):
                pattern.callback = refusing_nul(pattern.callback)
        return patterns
