"""A dialect's connection and the two calls every statement goes through (a part of ``base.Dialect``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper


class Statements:
    """What runs the SQL of :class:`~.base.Dialect`."""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())
