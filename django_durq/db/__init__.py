"""Database dialects: the only package that names a vendor or holds raw SQL.

:func:`dialect_for` is the one place that branches on ``connection.vendor``.
"""

from __future__ import annotations

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import get_settings
from .base import Dialect
from .rows import ClaimedJob, Lease, Renewal

__all__ = ["ClaimedJob", "Dialect", "Lease", "Renewal", "dialect_for", "exclusivity"]

# Imported on first use: a site on PostgreSQL never loads the sqlite3 module and its library.
_DIALECTS: dict[str, type[Dialect]] = {}


def dialect_for(connection: BaseDatabaseWrapper) -> Dialect:
    dialect = _DIALECTS.get(connection.vendor)
    if dialect is None:
        dialect = _DIALECTS[connection.vendor] = _load(connection)
    return dialect(connection)


def _load(connection: BaseDatabaseWrapper) -> type[Dialect]:
    if connection.vendor == "sqlite":
        from .sqlite import SQLiteDialect  # optional: only the vendor in use is loaded

        return SQLiteDialect
    if connection.vendor == "postgresql":
        from .postgresql import PostgreSQLDialect  # optional: only the vendor in use is loaded

        return PostgreSQLDialect
    if connection.vendor == "mysql":
        from .mysql import MySQLDialect  # optional: only the vendor in use is loaded

        return MySQLDialect
    raise NotImplementedError(f"django-durq supports SQLite, PostgreSQL and MariaDB; {connection.alias!r} is {connection.vendor}")


def exclusivity(alias: str | None = None) -> str:
    """Which claimers the queue's database keeps apart, in plain words.

    ``"processes on one host sharing the database file"`` on SQLite,
    ``"any number of hosts"`` on PostgreSQL and MariaDB.
    """
    if alias is None:
        alias = get_settings().database
    return dialect_for(connections[alias]).exclusivity
