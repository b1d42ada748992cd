"""What django-durq's own admin pages share with Django's: breadcrumbs in the running version's markup.

Django 6.0 turned the admin's breadcrumbs from a ``div`` of links joined by ``›`` into an ``ol``
of ``li``; a page of ours renders whichever the admin around it uses.
"""

from __future__ import annotations

from typing import Any

import django
from django.db.models import Model
from django.urls import reverse
from django.utils.text import capfirst

BREADCRUMBS_AS_LIST = django.VERSION >= (6, 0)


def breadcrumbs(opts: Any, *trail: tuple[str | None, str]) -> dict[str, Any]:
    """Context for ``admin/django_durq/breadcrumbs.html``: Home, the app, then ``trail`` (url or None, label)."""
    app = (reverse("admin:app_list", kwargs={"app_label": opts.app_label}), str(opts.app_config.verbose_name))
    return {"durq_crumbs": [app, *trail], "durq_crumbs_as_list": BREADCRUMBS_AS_LIST}


def changelist_crumb(model: type[Model]) -> tuple[str, str]:
    opts = model._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"), capfirst(str(opts.verbose_name_plural))
