"""Database dialects: the only package that names a vendor or holds raw SQL.

:func:`dialect_for` is the one place that branches on ``connection.vendor``.
"""

from __future__ import annotations

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .base import ClaimedJob, Dialect, Lease
from .mysql import MySQLDialect
from .postgresql import PostgreSQLDialect
from .sqlite import SQLiteDialect

__all__ = ["ClaimedJob", "Dialect", "Lease", "dialect_for", "exclusivity"]

_DIALECTS: dict[str, type[Dialect]] = {
    "sqlite": SQLiteDialect,
    "postgresql": PostgreSQLDialect,
    "mysql": MySQLDialect,
}


def dialect_for(connection: BaseDatabaseWrapper) -> Dialect:
    try:
        dialect = _DIALECTS[connection.vendor]
    except KeyError:
        raise NotImplementedError(
            f"django-durq supports SQLite, PostgreSQL and MariaDB/MySQL; {connection.alias!r} is {connection.vendor}"
        ) from None
    return dialect(connection)


def exclusivity(alias: str | None = None) -> str:
    """Which claimers the queue's database keeps apart, in plain words.

    ``"processes on one host sharing the database file"`` on SQLite,
    ``"any number of hosts"`` on PostgreSQL and MariaDB/MySQL.
    """
    if alias is None:
        from ..conf import get_settings

        alias = get_settings().database
    return dialect_for(connections[alias]).exclusivity
