"""What keeps a list page cheap on a table of millions of rows: a capped count, filter choices without DISTINCT."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

from .. import ops
from ..handlers.registry import registry
from ..ops.stats import COUNT_CAP


class CappedCountPaginator(Paginator):
    """Counts at most ``cap + 1`` rows: bounded cost on any table, exact below the cap."""

    cap = COUNT_CAP

    @cached_property
    def count(self) -> int:
        rows: QuerySet[Any] = self.object_list  # type: ignore[assignment]
        return int(rows.order_by()[: self.cap + 1].count())

    @property
    def capped(self) -> bool:
        return self.count > self.cap


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in ops.queue_names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


class NameFilter(admin.SimpleListFilter):
    """Choices from the registry (a DISTINCT over the table would read every row)."""

    title = "job name"
    parameter_name = "name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = {definition.name for definition in registry.all()}
        if self.value():
            names.add(str(self.value()))  # a name no longer registered, reached by a link
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(name=self.value()) if self.value() else queryset
